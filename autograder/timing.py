"""Speed: several kernels timed interleaved in one process, so their ratios survive machine drift.

Each timed call is one whole reduction between a pair of timing events, after warm-up, with the L2 flushed
(at least twice its size) and the outputs poisoned before it. Before every call one input value changes at a
random place, and every call's result is checked, so a kernel cannot replay a cached answer. Rounds go on
until every kernel's relative standard error is below the target, or a cap is reached; medians are reported.
"""

from __future__ import annotations

import fcntl
import hashlib
import math
import os
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autograder.backends.base import Backend
from autograder.backends.gpu import cache_root
from autograder.errors import GraderError
from autograder.launch import Plan
from autograder.memo import grader_version
from autograder.records import Build, KernelSource, Timing
from autograder.stages import Shape, Stage, get_stage
from autograder.verify import Sums, compiled, draw, keep, take


@dataclass(frozen=True)
class TimingSettings:
    n: int = 1 << 26  # floats of a 1-D stage's input (256 MiB)
    max2d_shape: tuple[int, int] = (8192, 8192)
    block_size: int = 256
    warmup: int = 3
    min_repetitions: int = 10
    max_repetitions: int = 200
    target_rse: float = 0.005
    budget_seconds: float = 30.0  # per group of kernels timed together

    def size_of(self, shape: Shape) -> tuple[int, ...]:
        return (self.n,) if shape is Shape.SUM_1D else self.max2d_shape


@dataclass(frozen=True)
class TimedKernel:
    """A kernel to time: `label` names it in results ("yours", "reference naive", ...)."""

    label: str
    stage_id: str
    source: Build | KernelSource  # a Build from the grader; a source only where the worker may compile


class WrongTimedResult(GraderError):
    """A kernel gave a wrong result in a timed call, though it passed the correctness cases."""


def relative_standard_error(samples: list[float]) -> float:
    if len(samples) < 2:
        return math.inf
    mean = float(np.mean(samples))
    return float(np.std(samples, ddof=1) / math.sqrt(len(samples)) / mean) if mean > 0 else math.inf


def time_interleaved(
    backend: Backend, kernels: tuple[TimedKernel, ...], settings: TimingSettings, seed: int
) -> tuple[Timing, ...]:
    """Time `kernels` (all of one shape) round-robin; one Timing per kernel, in the same order.

    Runs in the worker process. Raises WrongTimedResult naming the kernel and the call that went wrong.
    """
    stage = get_stage(kernels[0].stage_id)
    size = settings.size_of(stage.shape)
    data, expected, _ = _timing_input(seed, size, stage)
    # One input for all: the expected value is the same, the tolerance each kernel's stage allows.
    tolerances = {k.stage_id: _timing_input(seed, size, get_stage(k.stage_id))[2] for k in kernels}
    checker = _Checker(stage.shape, data, expected, tolerances, np.random.default_rng((seed, 1)))
    plans: list[Plan] = []
    samples: list[list[float]] = [[] for _ in kernels]
    try:
        plans = _ready(kernels, settings, seed) or _plans(backend, kernels, settings, data)
        for _ in range(settings.warmup):
            checker.round(backend, plans, kernels, list(range(len(kernels))), timed=False)
        started = time.monotonic()
        for round_number in range(settings.max_repetitions):
            # Rotate the order each round so that no kernel always follows the same neighbour.
            order = [(round_number + i) % len(kernels) for i in range(len(kernels))]
            for index, elapsed in zip(order, checker.round(backend, plans, kernels, order, timed=True), strict=True):
                samples[index].append(elapsed)
            enough = round_number + 1 >= settings.min_repetitions and all(
                relative_standard_error(s) < settings.target_rse for s in samples
            )
            if enough or time.monotonic() - started > settings.budget_seconds:
                break
    finally:
        checker.restore()
        for plan in plans:
            plan.release()
    input_bytes = 4 * math.prod(size)
    return tuple(
        Timing(
            label=kernel.label,
            median_ms=float(np.median(s)),
            rse=relative_standard_error(s),
            repetitions=len(s),
            gbps=input_bytes / (float(np.median(s)) * 1e-3) / 1e9,
        )
        for kernel, s in zip(kernels, samples, strict=True)
    )


def ready_timing(backend: Backend, kernels: tuple[TimedKernel, ...], settings: TimingSettings, seed: int) -> None:
    """Load `kernels` and copy their input to the GPU now, for the next `time_interleaved` of the same kernels
    in this worker: work that needs the GPU, but not alone (the grader holds it shared meanwhile)."""
    stage = get_stage(kernels[0].stage_id)
    data, _, _ = _timing_input(seed, settings.size_of(stage.shape), stage)
    keep(_ready_key(kernels, settings, seed), _plans(backend, kernels, settings, data))


def _ready(kernels: tuple[TimedKernel, ...], settings: TimingSettings, seed: int) -> list[Plan] | None:
    plans = take(_ready_key(kernels, settings, seed))
    return plans if isinstance(plans, list) else None


def _ready_key(kernels: tuple[TimedKernel, ...], settings: TimingSettings, seed: int) -> tuple:
    texts = (k.source.text if isinstance(k.source, KernelSource) else k.source.source.text for k in kernels)
    named = ((k.label, k.stage_id, text) for k, text in zip(kernels, texts, strict=True))
    return ("timing", settings, seed, *named)


def _plans(
    backend: Backend, kernels: tuple[TimedKernel, ...], settings: TimingSettings, data: np.ndarray
) -> list[Plan]:
    """A plan for each kernel, all reading one input, loaded with `data`."""
    stage = get_stage(kernels[0].stage_id)
    size = settings.size_of(stage.shape)
    plans: list[Plan] = []
    try:
        for kernel in kernels:
            shared = plans[0].input if plans else None
            plan = Plan.create(
                backend, compiled(backend, kernel.stage_id, kernel.source), size, settings.block_size, shared
            )
            plans.append(plan)
        plans[0].load(data)
    except BaseException:
        for plan in plans:
            plan.release()
        raise
    return plans


# The timing input of a worker, kept between stages: drawing 2^26 floats and summing them in float64 took most
# of a stage's timing before (0.6 s of 1 s), although the GPU's own work is a few milliseconds.
_INPUTS: dict[tuple[int, tuple[int, ...]], tuple[np.ndarray, Sums | float]] = {}  # with its sums, or its max
KEPT_INPUTS = 4  # published timing inputs a machine keeps (256 MiB each), the most recent


def input_folder() -> Path:
    """Where the grader publishes the timing inputs for its GPU workers, which may read it (autograder.isolation)."""
    return cache_root() / "timing-inputs"


def publish_input(seed: int, size: tuple[int, ...], folder: Path | None = None) -> tuple[Path, str] | None:
    """The timing input of `seed` and `size` as a file, with the SHA-256 of its values, which its GPU workers then
    read rather than draw (2 x 2^26 values: seconds of a core at each worker's start).

    Drawn once per machine and grader: the first grading process to ask draws it and writes the file and its
    record (the digest, and the grader that drew it); the others wait for it and read the record, as a class's
    host that asks at the start of the class (autograder.batch) lets them. A file with no record of this grader
    (another version's draw, or one left half-written) is drawn and written again. A worker checks the values
    against the digest before it uses them, and draws its own where they differ. None where the file cannot be
    written: each worker then draws its own."""
    folder = folder or input_folder()
    key = (seed, size, folder)
    if key not in _PUBLISHED:
        path = folder / f"{seed}-{'x'.join(map(str, size))}.npy"
        record = path.with_suffix(".sha256")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / ".publishing", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one process draws; the others wait, then read its record
                digest = _recorded(path, record)
                if digest is None:
                    data = draw("random", math.prod(size), seed)
                    digest = hashlib.sha256(data).hexdigest()
                    if _published(path, digest, size) is None:
                        _write(path, lambda part: np.save(part, data, allow_pickle=False))
                    written = f"{digest} {_drawn_by()} {path.stat().st_mtime_ns}\n"
                    _write(record, lambda part: part.write_text(written))
                with suppress(OSError):  # another grader may be removing the same files
                    by_age = sorted(folder.glob("*.npy"), key=lambda p: p.stat().st_mtime, reverse=True)
                    for old in by_age[KEPT_INPUTS:]:
                        old.with_suffix(".sha256").unlink(missing_ok=True)
                        old.unlink(missing_ok=True)  # a worker that has it open keeps reading it
            _PUBLISHED[key] = path, digest
        except OSError:
            _PUBLISHED[key] = None
    return _PUBLISHED[key]


def _recorded(path: Path, record: Path) -> str | None:
    """The digest a grader of this version recorded for the input at `path`, where the file is still the one it
    recorded (written since, by a grader of another version say, it is drawn again)."""
    try:
        digest, drawn_by, written = record.read_text().split()
        unchanged = path.stat().st_mtime_ns == int(written)
    except (OSError, ValueError):
        return None
    return digest if drawn_by == _drawn_by() and unchanged else None


def _drawn_by() -> str:
    """What the values drawn from a seed depend on besides it: the grader's code and numpy's generator."""
    return f"{grader_version()}/numpy-{np.__version__}"


def _write(path: Path, write: Callable[[Path], object]) -> None:
    """Write `path` whole or not at all, for the sandboxed workers to read."""
    with tempfile.TemporaryDirectory(dir=path.parent) as directory:
        part = Path(directory) / path.name
        write(part)
        part.chmod(0o644)
        os.replace(part, path)


_PUBLISHED: dict[tuple[int, tuple[int, ...], Path], tuple[Path, str] | None] = {}  # by this grading process


def prepare_timing(
    backend: Backend,
    stage_ids: tuple[str, ...],
    settings: TimingSettings,
    seed: int,
    published: tuple[Path, str] | None = None,
) -> None:
    """Read the timing inputs of these stages (`published` where the grader drew them, else drawn here) and their
    expected results now, in the worker, before the grader takes the GPU alone for the timing: host work that
    need not hold the GPU."""
    for stage_id in stage_ids:
        stage = get_stage(stage_id)
        _timing_input(seed, settings.size_of(stage.shape), stage, published)


def _timing_input(
    seed: int, size: tuple[int, ...], stage: Stage, published: tuple[Path, str] | None = None
) -> tuple[np.ndarray, float, float]:
    """The input of `size` drawn from `seed`, and its expected result and tolerance for `stage`."""
    if (seed, size) not in _INPUTS:
        data = _published(*published, size) if published else None
        if data is None:
            data = draw("random", math.prod(size), seed)
        _INPUTS[seed, size] = data, Sums.of(data) if stage.shape is Shape.SUM_1D else float(data.max())
    data, sums = _INPUTS[seed, size]
    if isinstance(sums, float):
        return data, sums, 0.0  # a max is exact in any order
    # The tolerance hardly moves as single values change, so it is computed once for an input.
    return data, sums.exact, sums.tolerance(stage)


def _published(path: Path, digest: str, size: tuple[int, ...]) -> np.ndarray | None:
    """The published input at `path`, mapped copy-on-write (the checker changes values of its own copy), or None
    where it is not the one the grader drew (its SHA-256) or not of `size`. Its expected result is computed here
    from what was read."""
    try:
        data = np.load(path, mmap_mode="c", allow_pickle=False)
    except (OSError, ValueError):
        return None
    if data.dtype != np.float32 or data.shape != (math.prod(size),):
        return None
    return data if hashlib.sha256(data).hexdigest() == digest else None


class _Checker:
    """Changes one input value before each call, keeps the expected result up to date, and checks each call's
    result, a round of calls at a time.

    Each change moves the expected result the same way, by more than any kernel's tolerance (by STEPS times the
    largest, a sum; to a new maximum, a max): no earlier call's result is right again, so a kernel that keeps
    an answer and replays it, at the timed size only, fails its next call. A change within the tolerance would
    not do: at 2^26 values a sum's tolerance is about 140, and small changes drift far less in 2000 calls.
    `restore` puts the changed values back, so the next group of kernels times the same input again.
    """

    STEPS = (3.0, 6.0)  # a sum's change, in multiples of the largest tolerance (at least 1)

    def __init__(
        self, shape: Shape, data: np.ndarray, expected: float, tolerances: dict[str, float], rng: np.random.Generator
    ) -> None:
        self.shape = shape
        self.data = data
        self.expected, self.tolerances = expected, tolerances
        self.rng = rng
        self.calls = 0
        self.original: dict[int, np.float32] = {}
        self.unit = max(1.0, *tolerances.values())

    def restore(self) -> None:
        for index, value in self.original.items():
            self.data[index] = value
        self.original.clear()

    def _perturb(self) -> int:
        index = int(self.rng.integers(self.data.size))
        self.original.setdefault(index, self.data[index])
        old = float(self.data[index])
        if self.shape is Shape.SUM_1D:
            self.data[index] = np.float32(old + self.unit * self.rng.uniform(*self.STEPS))
            self.expected += float(self.data[index]) - old
        else:
            self.data[index] = np.float32(self.expected + self.rng.uniform(0.5, 1.5))
            self.expected = float(self.data[index])
        return index

    def round(
        self, backend: Backend, plans: list[Plan], kernels: tuple[TimedKernel, ...], order: list[int], *, timed: bool
    ) -> list[float]:
        """One call of each kernel in `order`, queued behind one hold of the GPU (Backend.elapsed_each), each
        after an input value changed, its outputs poisoned and the L2 flushed; every result checked once they
        have all run. The milliseconds of each call, in `order`."""
        expected: list[float] = []

        def before(plan: Plan) -> Callable[[], None]:
            def queue() -> None:
                index = self._perturb()
                backend.fill(plan.input, float(self.data[index]), start=index, count=1)
                plan.poison()
                backend.flush_l2()
                expected.append(self.expected)

            return queue

        times = backend.elapsed_each([(before(plans[index]), plans[index].run) for index in order])
        for index, wanted in zip(order, expected, strict=True):
            got = plans[index].result()
            self.calls += 1
            if not (math.isfinite(got) and abs(got - wanted) <= self.tolerances[kernels[index].stage_id]):
                when = "a timed call" if timed else "a warm-up call"
                raise WrongTimedResult(
                    f"{kernels[index].label}: {when} (call {self.calls}, n={plans[index].count}) gave {got!r}, "
                    f"expected {wanted!r}; results must be right on every call, with fresh inputs"
                )
        return times
