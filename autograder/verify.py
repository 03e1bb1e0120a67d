"""Correctness: the cases a stage is checked on, their inputs and references, and hints from what failed.

Inputs are drawn from the run's secret seed. Two kinds for a sum: integer-valued floats, whose sums are exact
in float32 whatever the order (any dropped or doubled element shows), and offset random floats checked against a
float64 reference within a bound that fits float32 summation. For max2d: random values, and all-negative values
(a max that starts from 0 fails them). Every max2d case is scaled by its own power of two, from 2^-20 to 2^100,
drawn from the seed, so that no bound on the values holds across the cases: a max that starts from a finite
guess (-1e9, say) or clamps fails some. A sum's values are not scaled: whole numbers must stay exact, and random
ones scaled high enough would be whole numbers too.

The sizes are the catalogue's fixed edge sizes (autograder.stages) and a few odd sizes drawn from the seed, so a
kernel that is right only on the published sizes fails. The same seed always gives the same cases.

The expected value is always computed here, in the grader process, from the seed; the worker only runs the
kernel. A kernel cannot reach the reference.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, replace

import numpy as np

from autograder import at_scale
from autograder.at_scale import AT_SCALE_HINT, AT_TIMING_SIZE
from autograder.backends.base import Backend, Kernel
from autograder.launch import WRONG_PASS, Expected, Plan, expect, sum_tolerance
from autograder.records import Build, CaseResult, Finding, KernelMetrics, KernelSource
from autograder.stages import MAX2D_SHAPES, SUM_SIZES, Shape, Stage, get_stage

QUICK_LIMIT = 1 << 17  # largest case of a quick check (the notebook self-check on a CPU)


@dataclass(frozen=True)
class Case:
    """One correctness case. `seed` makes its input reproducible."""

    size: tuple[int, ...]
    input_kind: str
    seed: int
    seeded: bool = False  # a size drawn from the run's seed
    sampled: bool = False  # the timing size, on sampled blocks only (autograder.at_scale)

    @property
    def count(self) -> int:
        return math.prod(self.size)

    @property
    def label(self) -> str:
        shape = f"n={self.size[0]}" if len(self.size) == 1 else f"{self.size[0]}x{self.size[1]}"
        return f"{shape} {AT_TIMING_SIZE}, sampled blocks" if self.sampled else f"{shape} {self.input_kind}"


def correctness_cases(stage: Stage, seed: int, quick: bool = False, block_size: int = 256) -> list[Case]:
    """The cases of a stage, smallest first: the fixed sizes, then the sizes drawn from `seed`, each with both
    input kinds. `quick` drops the largest ones."""
    if stage.shape is Shape.SUM_1D:
        fixed: tuple[tuple[int, ...], ...] = tuple((n,) for n in SUM_SIZES)
        kinds = ("integers", "random")
    else:
        fixed = MAX2D_SHAPES
        kinds = ("random", "negative")
    drawn = [_apart(size, fixed) for size in seeded_sizes(stage, seed, block_size)]
    sizes = [(size, False) for size in fixed] + [(size, True) for size in drawn]
    cases = [
        Case(size, kind, seed=(seed * 1_000_003 + index) % 2**63, seeded=seeded)
        for index, (size, seeded, kind) in enumerate((size, seeded, kind) for size, seeded in sizes for kind in kinds)
    ]
    return sorted((case for case in cases if not quick or case.count <= QUICK_LIMIT), key=lambda case: case.count)


def timing_case(stage: Stage, seed: int, timing_size: tuple[int, ...] | None) -> list[Case]:
    """The timing size on sampled blocks (autograder.at_scale), on the CPU backend, which runs a kernel's blocks
    one at a time: a stage's last case, once every other was right (only such a stage is timed), where the stage is
    held to the launch contract's passes (every stage but the open one)."""
    if timing_size is None or stage.optional:
        return []
    return [Case(timing_size, "random", seed=_hashed(f"timing size:{seed}") % 2**63, sampled=True)]


def _hashed(text: str) -> int:
    """A 64-bit number from a hash of `text`: the same on every machine and every version of numpy."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _apart(size: tuple[int, ...], fixed: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """A drawn size that is none of the fixed ones: moved on by two (still odd) where it is."""
    while size in fixed:
        size = (size[0] + 2, *size[1:])
    return size


def seeded_sizes(stage: Stage, seed: int, block_size: int) -> list[tuple[int, ...]]:
    """Odd sizes drawn from the run's seed, the larger ones log-uniformly, so that no window of sizes between
    the published ones is safe. A sum: one below a block's elements, one from two blocks to 2^16, one of two
    passes (below QUICK_LIMIT, so a quick check has it too), one from QUICK_LIMIT to 3 x 2^20. max2d: a small
    matrix, a wide and a tall one, and a large one (width 513 to 4095, at most about 1535 x 1535 elements),
    every side odd."""

    def fraction(key: str) -> float:
        """A number in [0, 1) from the seed."""
        return _hashed(f"{seed}:{stage.id}:{key}") / 2**64

    def odd(key: str, low: int, high: int) -> int:
        """An odd number in [low, high] (low odd)."""
        return low + 2 * int(fraction(key) * ((high - low) // 2 + 1))

    def odd_log(key: str, low: int, high: int) -> int:
        """An odd number in [low, high] (low odd), log-uniformly."""
        return min(high, low + 2 * ((int(low * (high / low) ** fraction(key)) - low) // 2))

    if stage.shape is Shape.SUM_1D:
        block = block_size * stage.elements_per_thread
        return [
            (odd("below a block", 3, block - 1),),
            (odd_log("between blocks", 2 * block + 1, (1 << 16) - 1),),
            (odd("two passes", (1 << 16) + 1, QUICK_LIMIT - 1),),
            (odd_log("large", QUICK_LIMIT + 1, 3 << 20),),
        ]
    width = odd_log("large width", 513, 4095)
    return [
        (odd("small width", 3, 63), odd("small height", 3, 63)),
        (odd("wide width", 65, 999), odd("wide height", 3, 31)),
        (odd("tall width", 3, 31), odd("tall height", 65, 999)),
        (width, odd("large height", 513, max(513, 1535 * 1535 // width))),
    ]


def analysis_cases(stage: Stage, seed: int) -> list[Case]:
    """The cases on which the CPU backend looks for races when grading on a GPU: a partial block, several blocks
    and two passes (or odd matrix sides), and every size drawn from the run's seed up to QUICK_LIMIT (one below a
    block, one up to 2^16, one of two passes; for max2d a small, a wide and a tall matrix), so that a kernel
    cannot keep a race to a size it knows the analysis never runs. Each takes the exact input kind. The drawn
    sizes above QUICK_LIMIT are left out: analysing one (above 2^20) took about a second of a core a stage on a
    busy machine, and halved the rate of a class."""
    wanted = {(1000,), (65535,)} if stage.shape is Shape.SUM_1D else {(31, 33), (257, 255)}
    return [
        case
        for case in correctness_cases(stage, seed)
        if (case.size in wanted or (case.seeded and case.count <= QUICK_LIMIT)) and case.input_kind != "random"
    ]


# The powers of two a case's values are scaled by, lowest and highest, by input kind and number of sides.
SCALES = {("random", 2): (-20, 100), ("negative", 2): (-20, 100)}
INPUT_CACHE_BYTES = 256 << 20
_inputs: dict[tuple[str, int, int, int], np.ndarray] = {}  # drawn inputs of this process, read-only


def make_input(case: Case) -> np.ndarray:
    """The float32 input of a case, read-only: drawn once a process, since every stage of every student of a
    run has the same cases (a worker that serves many students draws each input once, not once a call)."""
    key = (case.input_kind, case.count, case.seed, len(case.size))
    data = _inputs.get(key)
    if data is None:
        data = draw(case.input_kind, case.count, case.seed)
        if exponent := case_exponent(case):
            data *= np.float32(2.0**exponent)
        data.flags.writeable = False
        if sum(kept.nbytes for kept in _inputs.values()) + data.nbytes > INPUT_CACHE_BYTES:
            _inputs.clear()
            _first_passes.clear()
        _inputs[key] = data
    return data


_first_passes: dict[tuple, Expected] = {}  # what the contract makes of each kept input: made once, like it


def first_pass(case: Case, stage: Stage, block_size: int) -> Expected:
    """What the contract makes of a case's input in the first pass (autograder.launch.expect), made once a
    process like the input: of a checked case's host work, the part that reads every value."""
    key = (case.input_kind, case.count, case.seed, case.size, stage.shape, stage.elements_per_thread, block_size)
    expected = _first_passes.get(key)
    if expected is None:
        data = make_input(case)
        expected = _first_passes[key] = expect(stage, data.ravel(), case.size, block_size)
    return expected


def case_exponent(case: Case) -> int:
    """The power of two a case's values are scaled by (SCALES; 0 for a sum's)."""
    low, high = SCALES.get((case.input_kind, len(case.size)), (0, 0))
    return low + _hashed(f"scale:{case.seed}") % (high - low + 1)  # hashed: the cases' seeds are consecutive


def draw(input_kind: str, count: int, seed: object) -> np.ndarray:
    """`count` float32 values of a kind, from `seed`. Scaled in place: the timing input is 2^26 values, and
    two temporary copies of it cost more than drawing it."""
    rng = np.random.default_rng(seed)  # type: ignore[arg-type]
    if input_kind == "integers":
        # Values in [-3, 3]: every partial sum stays far below 2**24, so any summation order is exact.
        return rng.integers(-3, 4, size=count).astype(np.float32)
    values = rng.random(count, dtype=np.float32)
    if input_kind == "random":
        # Offset so that a sum of partial sums that are rescaled or skipped cannot hide in cancellation.
        values *= 2.0
        values -= 0.75
        return values
    if input_kind == "negative":
        values += 1.0
        np.negative(values, out=values)
        return values
    raise ValueError(f"unknown input kind {input_kind!r}")


@dataclass(frozen=True)
class Sums:
    """What a sum's expected value and tolerance need from an input, read once however many stages use it."""

    exact: float  # in float64
    magnitude: float  # the sum of absolute values, in float64
    integral: bool  # every value a whole number: any summation order is exact
    count: int

    @classmethod
    def of(cls, data: np.ndarray) -> Sums:
        # Read a million values at a time: a temporary copy of a 2^26-value input costs more than its sum.
        chunks = [data[start : start + (1 << 20)] for start in range(0, data.size, 1 << 20)]
        integral = all(np.array_equal(chunk, np.round(chunk)) for chunk in chunks)
        exact = float(np.sum(data, dtype=np.float64))
        magnitude = 0.0 if integral else sum(float(np.sum(np.abs(chunk), dtype=np.float64)) for chunk in chunks)
        return cls(exact, magnitude, integral, data.size)

    def tolerance(self, stage: Stage) -> float:
        """The bound a correct float32 kernel of `stage` meets (autograder.launch.sum_tolerance)."""
        return 0.0 if self.integral else float(sum_tolerance(self.count, stage.elements_per_thread, self.magnitude))


def reference(stage: Stage, data: np.ndarray, block_size: int) -> tuple[float, float]:
    """The exact result in float64 and the tolerance a correct float32 kernel must meet."""
    if stage.shape is Shape.MAX_2D:
        return float(data.max()), 0.0
    sums = Sums.of(data)
    return sums.exact, sums.tolerance(stage)


@functools.lru_cache(maxsize=4096)
def case_reference(stage: Stage, case: Case, block_size: int) -> tuple[float, float]:
    """A case's reference: the same for every student of a run (the cases come from the run's seed), so a
    grader process that grades many students draws each input once."""
    if case.sampled:
        return at_scale.reference(stage, case.size, block_size, case.seed)
    return reference(stage, make_input(case), block_size)


def judge(
    stage: Stage, case: Case, got: float | None, block_size: int, error: str | None = None, wrong: str | None = None
) -> CaseResult:
    """A case's verdict from the value the kernel gave, and where its passes broke the contract (`wrong`), which
    is the case's error where the value itself is right. The timing size's sampled blocks are judged by `wrong`
    alone: their value is only their outputs summed (or their max), and each of them is held to the contract
    (a max2d step may take 2 x 2 neighbours' maxima, whose max is not the quadrants')."""
    expected, tolerance = case_reference(stage, case, block_size)
    close = got is not None and abs(got - expected) <= tolerance
    passed = error is None and got is not None and math.isfinite(got) and (wrong is None if case.sampled else close)
    if wrong is not None and (passed or case.sampled):
        passed, error = False, wrong
    return CaseResult(
        label=case.label,
        size=case.size,
        input_kind=case.input_kind,
        expected=expected,
        got=got,
        passed=passed,
        error=error,
        seeded=case.seeded,
        sampled=case.sampled,
    )


# --- run in the worker process -------------------------------------------------------------------------

_loaded: dict[tuple[str, ...], Kernel] = {}
_kept: dict[tuple, object] = {}  # what a student's call readies for its later call (autograder.timing)


def keep(key: tuple, value: object) -> None:
    """Keep `value` for this student's later call that takes it (`take`); gone, with every buffer, at `forget`."""
    _kept[key] = value


def take(key: tuple) -> object | None:
    """What `keep` kept under `key` for this student, once; None where nothing is."""
    return _kept.pop(key, None)


def compiled(backend: Backend, stage_id: str, kernel: Build | KernelSource, apart: bool = False) -> Kernel:
    """Load a Build once per worker process; `apart`, a second time, with measurements of its own (the timing
    size's: autograder.at_scale). A KernelSource is compiled here: only trusted code (the reference kernels of a
    calibration or a benchmark) in a worker that may compile."""
    if isinstance(kernel, KernelSource):
        key = ("source", stage_id, kernel.text)
        if key not in _loaded:
            _loaded[key] = backend.compile(kernel, get_stage(stage_id))
        return _loaded[key]
    key = _build_key(kernel, apart)
    if key not in _loaded:
        _loaded[key] = backend.load(kernel)
    return _loaded[key]


def _build_key(build: Build, apart: bool) -> tuple[str, ...]:
    """Where `compiled` keeps a build's kernel: a build is a function of its source (the same text and cell give
    the same build)."""
    return ("apart" if apart else "build", build.stage_id, build.source.text, repr(build.source.location))


def loaded(backend: Backend) -> int:
    """How many kernels this worker holds loaded: none once a student has ended in it (`forget`)."""
    return len(_loaded)


def forget(backend: Backend) -> None:
    """End a student in a worker that serves the next one (autograder.executors): every kernel it loaded is
    unloaded and every buffer freed; inputs drawn from the run's seed stay, as the grader's own data."""
    _loaded.clear()
    _kept.clear()  # not released: reset frees every buffer
    backend.reset()


def run_case(
    backend: Backend, build: Build, case: Case, block_size: int
) -> tuple[float, tuple[Finding, ...], str | None]:
    """Run one whole reduction of a case's input: the value it left, what was seen on the way, and where a pass
    broke the contract (autograder.launch.Plan.wrong_output). The timing size's case runs its sampled blocks
    (autograder.at_scale) in a kernel loaded apart, so that they are measured on their own: twice where the kernel
    has variables of its own, as a timed call follows the calls before it (state a reduction leaves for the next
    one is found in the second, as kept_state, and what it switches on is checked there)."""
    if case.sampled:
        apart = compiled(backend, build.stage_id, build, apart=True)
        runs = [at_scale.run(backend, apart, case.size, block_size, case.seed)]
        if build.details.get("device_variables"):
            runs.append(at_scale.run(backend, apart, case.size, block_size, case.seed))
        wrong = next((wrong for _, wrong, _ in runs if wrong is not None), None)
        guards = tuple(finding for _, _, found in runs for finding in found)
        return runs[0][0], _counted(apart.stage, guards + backend.findings()), wrong
    kernel = compiled(backend, build.stage_id, build)
    plan = Plan.create(backend, kernel, case.size, block_size)
    try:
        plan.load(make_input(case))
        guard_findings = plan.run(check_each_pass=True)
        value = plan.result()
        wrong = None if kernel.stage.optional else plan.wrong_output(first_pass(case, kernel.stage, block_size))
    finally:
        plan.release()
    return value, _counted(kernel.stage, guard_findings + backend.findings()), wrong


def _counted(stage: Stage, findings: tuple[Finding, ...]) -> tuple[Finding, ...]:
    """The findings that count for `stage`: the open stage may keep state between launches (a last-block ticket
    counter, say), since it alone is judged by its final value."""
    return tuple(f for f in findings if not (stage.optional and f.kind == "kept_state"))


def sanitized_run(backend: Backend, build: Build, case: Case, block_size: int) -> None:
    """Run one whole reduction of a case's input in buffers with no guard tails, for compute-sanitizer, which
    watches this worker from outside (autograder.sanitizer): an access past the end is outside an allocation."""
    kernel = compiled(backend, build.stage_id, build)
    plan = Plan.create(backend, kernel, case.size, block_size, guarded=False)
    try:
        plan.load(make_input(case))
        plan.run()
        plan.result()
    finally:
        plan.release()


def kernel_metrics(backend: Backend, build: Build) -> KernelMetrics | None:
    """Bank conflicts and divergence of the kernel's launches so far in this worker, where measured, with those of
    its launches at the timing size apart (autograder.at_scale), where they ran."""
    metrics = backend.metrics(compiled(backend, build.stage_id, build))
    apart = _loaded.get(_build_key(build, apart=True))
    if metrics is None or apart is None:
        return metrics
    return replace(metrics, at_scale=backend.metrics(apart))


# --- hints ---------------------------------------------------------------------------------------------


def hint(
    stage: Stage, cases: tuple[CaseResult, ...], block_size: int, findings: tuple[Finding, ...] = ()
) -> str | None:
    """One actionable sentence from the pattern of failed cases and the findings, or None when nothing failed."""
    failed = [case for case in cases if not case.passed]
    if not failed:
        return None
    if any(f.kind == "input_changed" for f in findings):
        return (
            "leave g_in as it was: it is read-only (const float *), and a kernel that writes it gives wrong "
            "results whenever the same input is reduced again. Copy it into shared memory (or registers) and "
            "reduce there"
        )
    advice = undefined_hint(findings, kinds=RACE_KINDS + ("barrier_divergence",))
    if advice:
        return advice
    if all(case.sampled for case in failed):
        return AT_SCALE_HINT
    if all(case.error and WRONG_PASS in case.error for case in failed):
        if stage.shape is Shape.MAX_2D:
            return (
                "every max is right, but not every step's matrix: output (x, y) of a step is the max of (x, y), "
                "(x + hw, y), (x, y + hh) and (x + hw, y + hh) of its input, with hw and hh its half sides rounded up"
            )
        per_block = block_size * stage.elements_per_thread
        return (
            "every sum is right, but not every block's: block b sums exactly its own slice, elements "
            f"b * {per_block} to b * {per_block} + {per_block - 1}, and writes that sum to g_out[b]"
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


RACE_KINDS = ("race_syncthreads", "race_syncwarp", "race_interblock")
# What to fix first for each finding that leaves a kernel's result undefined by CUDA, most telling first.
_UNDEFINED_ADVICE = (
    (RACE_KINDS, "fix the data race reported at line {lines} first: a race gives results that change from run to "
                 "run and from size to size, so the failed sizes say little until it is gone"),
    (("barrier_divergence",), "fix the __syncthreads() at line {lines} first: only part of the block reaches it, "
                              "which CUDA leaves undefined, so the failed sizes say little until every thread of "
                              "the block reaches it"),
    (("inactive_lane",), "fix the warp operation at line {lines}: it reads a lane that is not taking part (not in "
                         "its mask, or exited); every lane named in the mask must call it, with that mask"),
    (("out_of_bounds",), "fix the access at line {lines}: it is outside its buffer; check every index against n "
                         "and against the shared array's size"),
    (("output_guard",), "fix the write past the end of the output at line {lines}: block b writes g_out[b] and "
                        "nothing else"),
    (("uninitialised_read",), "fix the read at line {lines}: it reads shared memory that no thread of the block "
                              "wrote; write every element that is read (0 for threads past n) before the barrier"),
    (("kept_state",), "fix the read at line {lines}: it reads a __device__ variable that an earlier launch wrote, so "
                      "the kernel's result depends on the calls before it (the timed calls run many in a row); keep "
                      "nothing between launches"),
)
UNDEFINED_KINDS = tuple(kind for kinds, _ in _UNDEFINED_ADVICE for kind in kinds)


def undefined_hint(findings: tuple[Finding, ...], kinds: tuple[str, ...] = UNDEFINED_KINDS) -> str | None:
    """What to fix first among the `findings` of these kinds that have a line, or None."""
    for advice_kinds, advice in _UNDEFINED_ADVICE:
        lines = sorted({f.line for f in findings if f.kind in advice_kinds and f.kind in kinds and f.line})
        if lines:
            return advice.format(lines=", ".join(str(line) for line in lines))
    return None


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
        return (
            "wrong when every value is negative (some far below -1): start the max from -INFINITY or a real "
            "element, not 0 or a finite guess"
        )
    if all(any(side % 2 for side in case.size) for case in failed):
        return (
            "wrong when a side is odd: with hw = (width+1)/2, the right and bottom quadrants are one short, "
            "so skip the elements that fall outside"
        )
    if all(1 in case.size for case in failed):
        return "wrong for a single row or column: a side of 1 must stay 1, not become 0"
    shapes = ", ".join(sorted({f"{case.size[0]}x{case.size[1]}" for case in failed})[:6])
    return f"wrong for {shapes}"
