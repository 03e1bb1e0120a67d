"""Each stage's technique, measured without a GPU's timing noise: does the kernel show its stage's lesson?

A speed check cannot see a technique whose gain is below the noise (the shuffle stage gains 1.01x on an H200,
max2d 0.99x), and a kernel of the previous stage renamed passes it. So every stage's lesson is also measured
deterministically, from two sources:

- the CPU backend's counts over the first blocks of every launch (records.KernelMetrics), which a grading run
  has on both backends (on a GPU, from the CPU analysis of the same kernel);
- the PTX that `nvcc -ptx` makes of the kernel, where nvcc is installed (no GPU needed). Where it is not (a
  student's laptop), the PTX measurements are "not checked here".

| stage | measured, and required | previous reference -> reference |
|---|---|---|
| naive | divergent warp steps per block (the baseline: nothing) | 48 |
| anti_divergence | divergent warp steps per block, at most 9 | 48 -> 6 |
| sequential | shared-memory transactions per warp request, at most 1.3 | 3.3 -> 1.0 |
| first_add | elements per thread: the launch contract | 1 -> 2 |
| | block barriers per block, at most log2(block) + 3 | 9 (two trees a block: 20) |
| unrolled_warp | block barriers per block, at most log2(block) - 2 | 9 -> 3 |
| anti_divergence to unrolled_warp | shared-memory atomics per block, none | 0 |
| sequential to unrolled_warp | busiest thread's shared accesses a block, at most 4 log2(block) + 8 | 26 (alone: 257) |
| shuffle | shuffles in the PTX, and run per block: at least 1 | 0 -> 5 |
| | shared-memory requests per block one warp makes alone, at most 6 | 12 -> 2 |
| max2d | 32-byte sectors per whole-warp global load, at most 6.5 | 8.7 -> 4.9 |

(Figures at block size 256; the ones that depend on the block size are functions of it below.) first_add's
technique is mostly a property of the launch: the grader launches ceil(n / (2 * block size)) blocks, so a kernel
that does not take two elements a thread leaves half the input out and is incorrect. One that takes the second
after a first tree, and folds it in a second tree, passes twice the barriers of one tree: its barrier count, not
the previous stage's reference (one tree as well), is what that threshold separates.

Each threshold sits between the reference kernel of the stage and the reference kernel of the previous stage
(solutions/reduction/kernels); tests/test_technique.py measures both at every block size the rubric allows and
checks that the threshold separates them.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, replace
from pathlib import Path

from autograder.errors import GraderError
from autograder.records import KernelMetrics, KernelSource, Performance, TechniqueCheck
from autograder.sandbox import Sandbox
from autograder.schedule import cpu_slot
from autograder.stages import Stage

PTX_ARCH = "sm_75"  # a fixed target: the PTX, and so the measurement, is the same whatever GPU grades
PTX_SECONDS = 120.0
NOISE = 0.03  # a reference step closer to 1 than this is within the timing noise between runs


def _log2(block_size: int) -> int:
    return block_size.bit_length() - 1


# --- the measurements ------------------------------------------------------------------------------------


def _per_block(count: str) -> Callable[[KernelMetrics], float | None]:
    def measure(metrics: KernelMetrics) -> float | None:
        return getattr(metrics, count) / metrics.blocks if metrics.blocks else None

    return measure


def _transactions_per_request(metrics: KernelMetrics) -> float | None:
    return metrics.transactions_per_request if any(line.shared_requests for line in metrics.lines) else None


def _sectors_per_load(metrics: KernelMetrics) -> float | None:
    requests = metrics.global_load_requests
    return metrics.global_load_sectors / requests if requests else None


def ptx_shuffles(ptx: str) -> int:
    """Warp shuffle instructions in the PTX (`shfl.sync.down`, `.up`, `.bfly`, `.idx`), predicated ones too."""
    return len(re.findall(r"^\s*(?:@!?%\w+\s+)?shfl\.sync\b", ptx, flags=re.MULTILINE))


BASELINE = "the baseline: nothing"  # what the first stage requires


@dataclass(frozen=True)
class Measure:
    """One measurement of a stage's technique and its requirement, as functions of the block size."""

    name: str
    what: str
    source: str  # where the value comes from: "cpu", "ptx" or "contract"
    value: Callable  # from the KernelMetrics (cpu), the PTX text (ptx) or the Stage (contract)
    at_most: bool | None  # the value must be at most (True) or at least (False) the threshold; None: shown only
    threshold: Callable[[int], float]
    reference: Callable[[int], float]  # the reference kernel of the stage
    previous: Callable[[int], float] | None  # the reference kernel of the previous stage
    missing: str | None = None  # what it means when the CPU backend measured the kernel and found nothing to count

    def required(self, block_size: int) -> str:
        if self.at_most is None:
            return BASELINE
        return f"{'at most' if self.at_most else 'at least'} {self.threshold(block_size):g}"

    def passes(self, value: float, block_size: int) -> bool:
        if self.at_most is None:
            return True
        limit = self.threshold(block_size)
        return value <= limit if self.at_most else value >= limit


def _constant(value: float) -> Callable[[int], float]:
    return lambda block_size: value


DIVERGENCE = Measure(
    "divergence",
    "divergent warp steps per block (a warp between two barriers whose lanes took different paths)",
    "cpu",
    _per_block("diverged_steps"),
    at_most=True,
    threshold=_constant(9),
    reference=_constant(6),
    previous=lambda block_size: 3 * block_size / 16,  # naive: every warp diverges in every round
)
# A tree that no thread walks alone, and no atomics in its place: stages 3 to 5 keep stage 1's tree in shared
# memory, so a thread that adds its block's values by itself, or atomics into one shared word, are not their
# lesson, though neither has bank conflicts nor the barriers of a tree. The previous stage's reference is a tree
# as well: these thresholds separate such kernels (tests/test_technique.py), not the two references.
BUSIEST_THREAD = Measure(
    "busiest thread",
    "shared-memory accesses per block of the block's busiest thread (a tree: about three a round; a thread that "
    "adds its block's values alone: one a value)",
    "cpu",
    _per_block("busiest_thread_shared"),
    at_most=True,
    threshold=lambda block_size: 4 * _log2(block_size) + 8,
    reference=lambda block_size: 3 * _log2(block_size) + 2,
    previous=None,
)
SHARED_ATOMICS = Measure(
    "shared atomics",
    "atomic operations on shared memory per block (a tree needs none)",
    "cpu",
    _per_block("shared_atomics"),
    at_most=True,
    threshold=_constant(0),
    reference=_constant(0),
    previous=None,
)
# The strided index's conflicts grow with the block: more lanes of a warp land in one bank.
_STRIDED_CONFLICTS = {64: 1.7, 128: 2.6, 256: 3.3, 512: 3.9, 1024: 4.3}

MEASURES: dict[str, tuple[Measure, ...]] = {
    "naive": (replace(DIVERGENCE, at_most=None, reference=DIVERGENCE.previous, previous=None),),
    "anti_divergence": (DIVERGENCE, SHARED_ATOMICS),
    "sequential": (
        Measure(
            "bank conflicts",
            "shared-memory transactions per warp request (1.0: no bank conflicts)",
            "cpu",
            _transactions_per_request,
            at_most=True,
            threshold=_constant(1.3),
            reference=_constant(1.0),
            previous=lambda block_size: _STRIDED_CONFLICTS.get(block_size, 3.3),
            missing="the kernel makes no shared-memory accesses, so it has no tree in shared memory to address",
        ),
        BUSIEST_THREAD,
        SHARED_ATOMICS,
    ),
    "first_add": (
        Measure(
            "elements per thread",
            "input elements each thread adds while loading: the grader launches ceil(n / (2 x block size)) "
            "blocks, so a kernel that adds fewer leaves part of the input out and is incorrect",
            "contract",
            lambda stage: float(stage.elements_per_thread),
            at_most=False,
            threshold=_constant(2),
            reference=_constant(2),
            previous=_constant(1),
        ),
        Measure(
            "block barriers",
            "__syncthreads() passed per block: one tree after the first add passes log2(block size) + 1, a "
            "second element taken after a first tree and folded in a second tree twice as many",
            "cpu",
            _per_block("barriers"),
            at_most=True,
            threshold=lambda block_size: _log2(block_size) + 3,
            reference=lambda block_size: _log2(block_size) + 1,
            previous=None,  # the previous stage's reference passes as many barriers: it adds one element
        ),
        BUSIEST_THREAD,
        SHARED_ATOMICS,
    ),
    "unrolled_warp": (
        Measure(
            "block barriers",
            "__syncthreads() passed per block (a tree loop down to s = 1 passes log2(block size) + 1)",
            "cpu",
            _per_block("barriers"),
            at_most=True,
            threshold=lambda block_size: _log2(block_size) - 2,
            reference=lambda block_size: _log2(block_size) - 5,
            previous=lambda block_size: _log2(block_size) + 1,
        ),
        replace(BUSIEST_THREAD, reference=lambda block_size: 3 * _log2(block_size) - 5),
        SHARED_ATOMICS,
    ),
    "shuffle": (
        Measure(
            "shuffles in the code",
            "warp shuffle instructions (shfl.sync) in the kernel's PTX",
            "ptx",
            ptx_shuffles,
            at_most=False,
            threshold=_constant(1),
            reference=_constant(5),
            previous=_constant(0),
        ),
        Measure(
            "shuffles executed",
            "warp shuffles run per block",
            "cpu",
            _per_block("shuffles"),
            at_most=False,
            threshold=_constant(1),
            reference=_constant(5),
            previous=_constant(0),
        ),
        Measure(
            "shared memory in the last warp",
            "shared-memory warp requests per block that one warp makes alone (between two barriers, the busiest "
            "warp's requests beyond the next busiest's)",
            "cpu",
            _per_block("lone_shared_requests"),
            at_most=True,
            threshold=_constant(6),  # a tree step of one warp (3 requests) before its shuffles passes
            reference=_constant(2),
            previous=_constant(12),
        ),
    ),
    "max2d": (
        Measure(
            "coalescing",
            "32-byte sectors per whole-warp global load (4 when a warp reads 32 neighbouring floats)",
            "cpu",
            _sectors_per_load,
            at_most=True,
            threshold=_constant(6.5),
            reference=_constant(4.9),
            previous=_constant(8.7),  # max2d_baseline: every other word, so twice the sectors
        ),
    ),
}


# --- the entry point -------------------------------------------------------------------------------------


def check(
    stage: Stage, source: KernelSource, metrics: KernelMetrics | None, sandbox: Sandbox, block_size: int
) -> tuple[TechniqueCheck, ...]:
    """The technique checks of `stage` for the student's kernel: its CPU measurements (`metrics`, None where
    there are none) and, where nvcc is installed, its PTX (compiled in `sandbox`)."""
    measures = MEASURES.get(stage.id, ())
    ptx, ptx_how = _ptx(source, sandbox) if needs_ptx(stage) else (None, "")
    checks = []
    for measure in measures:
        if measure.source == "ptx":
            value = float(measure.value(ptx)) if ptx is not None else None
            how = ptx_how
        elif measure.source == "contract":
            value, how = measure.value(stage), "the launch contract, enforced by the correctness cases"
        else:
            value = measure.value(metrics) if metrics is not None else None
            how = (
                "CPU backend: counted over the first blocks of every launch"
                if value is not None
                else "not checked here: the CPU backend did not measure this kernel"
            )
            # The kernel the GPU times, at the size it is timed at, is held to the same threshold on its own.
            scaled = measure.value(metrics.at_scale) if metrics is not None and metrics.at_scale else None
            passes_here = value is not None and measure.passes(value, block_size)
            if scaled is not None and passes_here and not measure.passes(scaled, block_size):
                value, how = scaled, AT_SCALE_HOW
        failed = value is None and metrics is not None and measure.missing is not None
        checks.append(
            TechniqueCheck(
                name=measure.name,
                what=measure.what,
                required=measure.required(block_size),
                value=value,
                reference=float(measure.reference(block_size)),
                previous=float(measure.previous(block_size)) if measure.previous else None,
                passed=False if failed else None if value is None else measure.passes(value, block_size),
                how=measure.missing if failed else how,
            )
        )
    return tuple(checks)


AT_SCALE_HOW = (
    "CPU backend, at the timing size (the first pass's sampled blocks): the kernel the GPU times does not do there "
    "what it does at every size checked"
)


def absent(checks: tuple[TechniqueCheck, ...]) -> tuple[TechniqueCheck, ...]:
    """The checks that were made and failed: the technique is not there."""
    return tuple(c for c in checks if c.passed is False)


def below_noise(performance: Performance) -> bool:
    """Whether the reference's speedup over its previous stage on this GPU is within the timing noise, so
    that only the technique measurement shows the lesson."""
    step = performance.reference_step
    return step is not None and abs(step - 1.0) < NOISE


def describe(check: TechniqueCheck) -> str:
    """One line for people, e.g. "bank conflicts: 1.0, needs at most 1.3 (reference kernels: 3.3 -> 1.0): ok"."""
    reference = _show(check.reference)
    if check.previous is not None:
        reference = f"{_show(check.previous)} -> {reference}"
    if check.value is None:
        absent = ": the technique is absent" if check.passed is False else ""
        return f"{check.name}: {check.how} (reference kernels: {reference}){absent}"
    mark = "ok" if check.passed else "the technique is absent"
    if check.previous is None:
        shown = "" if check.required == BASELINE else f": {mark}"
        return f"{check.name}: {_show(check.value)} (reference kernel: {reference}; {check.required} required){shown}"
    return f"{check.name}: {_show(check.value)}, needs {check.required} (reference kernels: {reference}): {mark}"


def _show(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if abs(value) < 100 else f"{value:.0f}"


# --- PTX -------------------------------------------------------------------------------------------------


def needs_ptx(stage: Stage) -> bool:
    """Whether a technique check of `stage` reads the kernel's PTX."""
    return any(m.source == "ptx" for m in MEASURES.get(stage.id, ()))


def ptx_of(source: KernelSource, sandbox: Sandbox) -> str | None:
    """The PTX nvcc makes of `source` (compiled in the sandbox), or None where nvcc is not installed or fails."""
    return _ptx(source, sandbox)[0]


def start_ptx(source: KernelSource, sandbox: Sandbox, pool: Executor) -> None:
    """Start compiling the PTX of `source` on `pool`, for a later `check` to take (autograder.pipeline.compile
    starts it with the student's other builds)."""
    _ptx_future(source, sandbox, pool)


def _ptx(source: KernelSource, sandbox: Sandbox) -> tuple[str | None, str]:
    """(PTX or None, how it was made or why there is none): one compile per source, started here or earlier."""
    return _ptx_future(source, sandbox, None).result()


def _ptx_future(source: KernelSource, sandbox: Sandbox, pool: Executor | None) -> Future[tuple[str | None, str]]:
    from autograder.backends.gpu import find_nvcc

    nvcc = find_nvcc()
    if nvcc is None:
        future: Future[tuple[str | None, str]] = Future()
        future.set_result((None, "not checked here: nvcc (the CUDA compiler) is not installed; the grader checks it"))
        return future
    key = (source.text, nvcc, sandbox)
    with _PTX_LOCK:
        if key in _PTX:
            return _PTX[key]
        if len(_PTX) >= PTX_KEPT:
            _PTX.clear()
        future = _PTX[key] = Future()

    def compile_it() -> None:
        try:
            with cpu_slot():  # a compiler: it waits for a free core, as builds do
                future.set_result(_compile_ptx(source.text, nvcc, sandbox))
        except BaseException as error:  # its caller gets it, as from a compile of its own; the next tries again
            with _PTX_LOCK:
                _PTX.pop(key, None)
            future.set_exception(error)

    if pool is None:
        compile_it()
    else:
        try:
            pool.submit(compile_it)
        except RuntimeError:  # a pool shut down: compiled now, not left for ever unfinished
            compile_it()
    return future


PTX_KEPT = 1024  # PTX of so many sources kept in a process, at most
_PTX: dict[tuple[str, str, Sandbox], Future[tuple[str | None, str]]] = {}
_PTX_LOCK = threading.Lock()


def _compile_ptx(text: str, nvcc: str, sandbox: Sandbox) -> tuple[str | None, str]:
    with tempfile.TemporaryDirectory(prefix="autograder-ptx-") as directory:
        folder = Path(directory)
        (folder / "kernel.cu").write_text(text)
        argv = [nvcc, "-ptx", f"-arch={PTX_ARCH}", "-o", "kernel.ptx", "kernel.cu"]
        try:
            result = sandbox.run_tool(argv, folder, PTX_SECONDS)
        except (GraderError, OSError, subprocess.SubprocessError) as error:
            return None, f"not checked here: nvcc could not run ({error})"
        if result.returncode != 0:
            first = next((line for line in result.stderr.splitlines() if "error" in line), result.stderr.strip())
            return None, f"not checked here: nvcc does not compile the kernel ({first[:200]})"
        return (folder / "kernel.ptx").read_text(), f"PTX from nvcc -ptx -arch={PTX_ARCH}"
