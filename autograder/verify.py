"""Correctness: the cases a stage is checked on, their inputs and references, and hints from what failed.

Inputs are drawn from the run's secret seed. Two kinds for a sum: integer-valued floats, whose sums are exact
in float32 whatever the order (any dropped or doubled element shows), and offset random floats checked against a
float64 reference within a bound that fits float32 summation. For max2d: random values, and all-negative values
(a max that starts from 0 fails them).

The expected value is always computed here, in the grader process, from the seed; the worker only runs the
kernel. A kernel cannot reach the reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autograder.backends.base import Backend, Kernel
from autograder.launch import Plan
from autograder.records import CaseResult, Finding, KernelMetrics, KernelSource
from autograder.stages import MAX2D_SHAPES, SUM_SIZES, Shape, Stage, get_stage

UNIT_ROUNDOFF = 2.0**-24  # float32
QUICK_LIMIT = 1 << 17  # largest case of a quick check (the notebook self-check on a CPU)


@dataclass(frozen=True)
class Case:
    """One correctness case. `seed` makes its input reproducible."""

    size: tuple[int, ...]
    input_kind: str
    seed: int

    @property
    def count(self) -> int:
        return math.prod(self.size)

    @property
    def label(self) -> str:
        shape = f"n={self.size[0]}" if len(self.size) == 1 else f"{self.size[0]}x{self.size[1]}"
        return f"{shape} {self.input_kind}"


def correctness_cases(stage: Stage, seed: int, quick: bool = False) -> list[Case]:
    """The cases of a stage, smallest first. `quick` drops the largest ones."""
    if stage.shape is Shape.SUM_1D:
        sizes: tuple[tuple[int, ...], ...] = tuple((n,) for n in SUM_SIZES)
        kinds = ("integers", "random")
    else:
        sizes = MAX2D_SHAPES
        kinds = ("random", "negative")
    cases = [
        Case(size, kind, seed=(seed * 1_000_003 + index) % 2**63)
        for index, (size, kind) in enumerate((size, kind) for size in sizes for kind in kinds)
    ]
    return [case for case in cases if not quick or case.count <= QUICK_LIMIT]


def analysis_cases(stage: Stage, seed: int) -> list[Case]:
    """A few small cases on which the CPU backend looks for races when grading on a GPU: a partial block,
    several blocks and two passes, or odd matrix sides."""
    wanted = {(1000,), (65535,)} if stage.shape is Shape.SUM_1D else {(31, 33), (257, 255)}
    return [case for case in correctness_cases(stage, seed) if case.size in wanted and case.input_kind != "random"]


def make_input(case: Case) -> np.ndarray:
    """The float32 input of a case."""
    rng = np.random.default_rng(case.seed)
    if case.input_kind == "integers":
        # Values in [-3, 3]: every partial sum stays far below 2**24, so any summation order is exact.
        return rng.integers(-3, 4, size=case.count).astype(np.float32)
    if case.input_kind == "random":
        # Offset so that a sum of partial sums that are rescaled or skipped cannot hide in cancellation.
        return (rng.random(case.count, dtype=np.float32) * 2.0 - 0.75).astype(np.float32)
    if case.input_kind == "negative":
        return (-1.0 - rng.random(case.count, dtype=np.float32)).astype(np.float32)
    raise ValueError(f"unknown input kind {case.input_kind!r}")


def reference(stage: Stage, data: np.ndarray, block_size: int) -> tuple[float, float]:
    """The exact result in float64 and the tolerance a correct float32 kernel must meet."""
    if stage.shape is Shape.MAX_2D:
        return float(data.max()), 0.0
    values = data.astype(np.float64)
    exact = float(values.sum())
    if np.all(values == np.round(values)):
        return exact, 0.0
    # A tree of depth log2(n) with up to `elements_per_thread` sequential adds per thread: the classic bound
    # for recursive summation, with a factor of two to spare.
    depth = math.ceil(math.log2(max(data.size, 2))) + stage.elements_per_thread + 2
    return exact, 2.0 * depth * UNIT_ROUNDOFF * float(np.abs(values).sum())


def judge(stage: Stage, case: Case, got: float | None, block_size: int, error: str | None = None) -> CaseResult:
    """A case's verdict from the value the kernel gave."""
    expected, tolerance = reference(stage, make_input(case), block_size)
    passed = got is not None and math.isfinite(got) and abs(got - expected) <= tolerance
    return CaseResult(
        label=case.label,
        size=case.size,
        input_kind=case.input_kind,
        expected=expected,
        got=got,
        passed=passed,
        error=error,
    )


# --- run in the worker process -------------------------------------------------------------------------

_compiled: dict[tuple[str, str], Kernel] = {}


def compiled(backend: Backend, stage_id: str, source: KernelSource) -> Kernel:
    """Compile once per worker process; a restarted worker compiles again (the backends cache on disk)."""
    key = (stage_id, source.text)
    if key not in _compiled:
        _compiled[key] = backend.compile(source, get_stage(stage_id))
    return _compiled[key]


def compile_only(backend: Backend, stage_id: str, source: KernelSource) -> tuple:
    """Compile and return the compiler's warnings (CompileError propagates)."""
    return compiled(backend, stage_id, source).warnings


def run_case(
    backend: Backend, stage_id: str, source: KernelSource, case: Case, block_size: int
) -> tuple[float, tuple[Finding, ...]]:
    """Run one whole reduction of a case's input; the value it left and what was seen on the way."""
    kernel = compiled(backend, stage_id, source)
    plan = Plan.create(backend, kernel, case.size, block_size)
    try:
        plan.load(make_input(case))
        guard_findings = plan.run(check_each_pass=True)
        value = plan.result()
    finally:
        plan.release()
    return value, guard_findings + backend.findings()


def kernel_metrics(backend: Backend, stage_id: str, source: KernelSource) -> KernelMetrics | None:
    """Bank conflicts and divergence of the kernel's launches so far in this worker, where measured."""
    return backend.metrics(compiled(backend, stage_id, source))


# --- hints ---------------------------------------------------------------------------------------------


def hint(
    stage: Stage, cases: tuple[CaseResult, ...], block_size: int, findings: tuple[Finding, ...] = ()
) -> str | None:
    """One actionable sentence from the pattern of failed cases and the findings, or None when nothing failed."""
    failed = [case for case in cases if not case.passed]
    if not failed:
        return None
    races = sorted({f.line for f in findings if f.kind.startswith("race") and f.line})
    if races:
        lines = ", ".join(str(line) for line in races)
        return (
            f"fix the data race reported at line {lines} first: a race gives results that change from run to "
            "run and from size to size, so the failed sizes say little until it is gone"
        )
    if any(case.got is not None and not math.isfinite(case.got) for case in failed):
        return (
            "some results are NaN or infinite: the kernel read past the end of its input (the grader puts NaN "
            "there for a sum, +inf for a max) or left part of its output unwritten; check your bounds and that "
            "every output element is written"
        )
    if len(failed) == len(cases):
        return "wrong for every size: check the reduction itself and where each block writes its result"
    if stage.shape is Shape.MAX_2D:
        return _max2d_hint(failed, cases)
    return _sum_hint(stage, failed, cases, block_size)


def _sum_hint(stage: Stage, failed: list[CaseResult], cases: tuple[CaseResult, ...], block_size: int) -> str:
    per_block = block_size * stage.elements_per_thread
    passed = [case for case in cases if case.passed]
    if all(case.size[0] % per_block for case in failed) and any(case.size[0] % per_block == 0 for case in passed):
        return (
            f"wrong when n is not a multiple of {per_block} (the elements one block covers): check your "
            "bounds, so threads past n add 0"
        )
    smallest = min(case.size[0] for case in failed)
    if smallest > per_block and all(case.passed for case in cases if case.size[0] < smallest):
        return (
            f"right for every n below {smallest} but wrong from there: look for a race (a missing "
            "__syncthreads() between tree steps) or a block that does not write its own g_out[blockIdx.x]"
        )
    kinds = {case.input_kind for case in failed}
    if kinds == {"random"}:
        return (
            "integer inputs sum exactly but random floats are off by more than float32 rounding allows: "
            "some values are skipped, counted twice or rescaled"
        )
    sizes = ", ".join(str(n) for n in sorted({case.size[0] for case in failed})[:6])
    return f"wrong for n = {sizes}: compare those sizes with the block size ({block_size}) and your bounds checks"


def _max2d_hint(failed: list[CaseResult], cases: tuple[CaseResult, ...]) -> str:
    if {case.input_kind for case in failed} == {"negative"}:
        return "wrong when every value is negative: start the max from -INFINITY or a real element, not 0"
    if all(any(side % 2 for side in case.size) for case in failed):
        return (
            "wrong when a side is odd: with hw = (width+1)/2, the right and bottom quadrants are one short, "
            "so skip the elements that fall outside"
        )
    if all(1 in case.size for case in failed):
        return "wrong for a single row or column: a side of 1 must stay 1, not become 0"
    shapes = ", ".join(sorted({f"{case.size[0]}x{case.size[1]}" for case in failed})[:6])
    return f"wrong for {shapes}"
