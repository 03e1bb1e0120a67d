"""Speed: several kernels timed interleaved in one process, so their ratios survive machine drift.

Each timed call is one whole reduction between a pair of timing events, after warm-up, with the L2 flushed
(at least twice its size) and the outputs poisoned before it. Before every call one input value changes at a
random place, and every call's result is checked, so a kernel cannot replay a cached answer. Rounds go on
until every kernel's relative standard error is below the target, or a cap is reached; medians are reported.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.lib.format as npy

from autograder.backends.base import Backend
from autograder.backends.gpu import cache_root
from autograder.errors import GraderError
from autograder.launch import Plan
from autograder.memo import grader_version
from autograder.records import Build, KernelSource, Timing, from_dict, to_dict
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
# of a stage's timing before (0.6 s of 1 s), although the GPU's own work is a few milliseconds. By seed and count
# of values (one input for the 1-D and the 2-D stages), with its sums and its maximum.
_INPUTS: dict[tuple[int, int], tuple[np.ndarray, Sums, float]] = {}
KEPT_INPUTS = 4  # published timing inputs a machine keeps (256 MiB each), the most recent


def input_folder() -> Path:
    """Where the grader publishes the timing inputs for its GPU workers, which may read it (autograder.isolation)."""
    return cache_root() / "timing-inputs"


@dataclass(frozen=True)
class Published:
    """A timing input the grader drew and wrote, as its record tells: the file, the file's identity when it was
    written (inode, size in bytes, modification time in ns), and what a worker needs of its values (their sums,
    and their maximum), computed once by the grader that drew them."""

    path: Path
    stamp: tuple[int, int, int]
    sums: Sums
    maximum: float


def publish_input(seed: int, size: tuple[int, ...], folder: Path | None = None) -> Published | None:
    """The timing input of `seed` and `size` as a file, with a record of what it holds, which its GPU workers then
    read rather than draw and sum (2^26 values: a second of a core, at each worker's start). One file a seed and
    count of values: a 1-D stage's input and a 2-D one of as many values (2^26 and 8192 x 8192) are the same
    values, drawn and written once.

    Drawn once per machine and grader: the first grading process to ask draws it and writes the file and its
    record (the file's stamp, its sums and maximum, and the grader that drew it); the others wait for it and
    read the record, as a class's host that asks at the start of the class (autograder.batch) lets them. A file
    with no record of this grader, or written since its record (another version's draw), is drawn and written
    again. A worker maps the file only while it is still the one recorded (its stamp), and draws its own where
    it is not. None where the file cannot be written: each worker then draws its own."""
    folder = folder or input_folder()
    count = math.prod(size)
    key = (seed, count, folder)
    if key not in _PUBLISHED:
        path = folder / f"{seed}-{count}.npy"
        record = path.with_suffix(".json")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / ".publishing", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one process draws; the others wait, then read its record
                published = _recorded(path, record)
                if published is None:
                    data = draw("random", count, seed)
                    _write(path, lambda part: np.save(part, data, allow_pickle=False))
                    published = Published(path, _stamp(path.stat()), Sums.of(data), float(data.max()))
                    text = json.dumps({"drawn_by": _drawn_by(), "stamp": published.stamp,
                                       "sums": to_dict(published.sums), "maximum": published.maximum})
                    _write(record, lambda part: part.write_text(text))
                with suppress(OSError):  # another grader may be removing the same files
                    by_age = sorted(folder.glob("*.npy"), key=lambda p: p.stat().st_mtime, reverse=True)
                    for old in by_age[KEPT_INPUTS:]:
                        old.with_suffix(".json").unlink(missing_ok=True)
                        old.unlink(missing_ok=True)  # a worker that has it open keeps reading it
            _PUBLISHED[key] = published
        except OSError:
            _PUBLISHED[key] = None
    return _PUBLISHED[key]


def _recorded(path: Path, record: Path) -> Published | None:
    """The input at `path` as a grader of this version recorded it, where the file is still the one it recorded
    (written since, by a grader of another version say, it is drawn again)."""
    try:
        fields = json.loads(record.read_text())
        if fields["drawn_by"] != _drawn_by():
            return None
        inode, size_bytes, modified = (int(value) for value in fields["stamp"])
        sums = from_dict(Sums, fields["sums"])
        published = Published(path, (inode, size_bytes, modified), sums, float(fields["maximum"]))
        return published if _stamp(path.stat()) == published.stamp else None
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _stamp(status: os.stat_result) -> tuple[int, int, int]:
    """What tells a file from another written in its place: a replaced file has another inode or another
    modification time (to the nanosecond), and only the grader's own user can write this folder."""
    return status.st_ino, status.st_size, status.st_mtime_ns


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


_PUBLISHED: dict[tuple[int, int, Path], Published | None] = {}  # by seed and count, in this grading process


def prepare_timing(
    backend: Backend,
    stage_ids: tuple[str, ...],
    settings: TimingSettings,
    seed: int,
    published: Published | None = None,
) -> None:
    """Read the timing inputs of these stages (`published` where the grader drew them, else drawn here) and their
    expected results now, in the worker, before the grader takes the GPU alone for the timing: host work that
    need not hold the GPU."""
    for stage_id in stage_ids:
        stage = get_stage(stage_id)
        _timing_input(seed, settings.size_of(stage.shape), stage, published)


def _timing_input(
    seed: int, size: tuple[int, ...], stage: Stage, published: Published | None = None
) -> tuple[np.ndarray, float, float]:
    """The input of `size` drawn from `seed`, and its expected result and tolerance for `stage`."""
    key = (seed, math.prod(size))
    if key not in _INPUTS:
        found = _published(published, key[1]) if published else None
        if found is None:
            data = draw("random", key[1], seed)
            found = data, Sums.of(data), float(data.max())
        _INPUTS[key] = found
    data, sums, maximum = _INPUTS[key]
    if stage.shape is Shape.MAX_2D:
        return data, maximum, 0.0  # a max is exact in any order
    # The tolerance hardly moves as single values change, so it is computed once for an input.
    return data, sums.exact, sums.tolerance(stage)


_HEADERS = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}


def _published(published: Published, count: int) -> tuple[np.ndarray, Sums, float] | None:
    """The published input, mapped copy-on-write (the checker changes values of its own copy), with its recorded
    sums and maximum; None where the file is no longer the one its record tells of (its stamp), or not `count`
    float32 values. The file is checked and mapped through one descriptor, so the file mapped is the file
    checked."""
    try:
        with open(published.path, "rb") as file:
            if _stamp(os.fstat(file.fileno())) != published.stamp:
                return None
            read_header = _HEADERS.get(npy.read_magic(file))
            if read_header is None:
                return None
            found, fortran_order, dtype = read_header(file)
            if dtype != np.float32 or fortran_order or found != (count,):
                return None
            data = np.memmap(file, dtype=np.float32, mode="c", shape=found, offset=file.tell())
            return data, published.sums, published.maximum
    except (OSError, ValueError):
        return None


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
