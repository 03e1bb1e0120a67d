"""Plain typed records passed between the grading steps and written to the result files.

Every record is a frozen dataclass. `to_dict` and `from_dict` turn a whole StudentResult into JSON and back,
so the leaderboard, feedback and exports read exactly what the grader wrote.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any


class Status(StrEnum):
    """What happened to a stage's kernel, before performance is considered."""

    NOT_ATTEMPTED = "not_attempted"  # no cell, an empty cell, or the released stub unchanged
    INVALID_CELL = "invalid_cell"  # the cell is there but holds no single string literal
    COMPILE_ERROR = "compile_error"
    TIMEOUT = "timeout"  # a launch never ends (a hang, a spin-wait, a deadlock): its time limit stopped it
    CRASHED = "crashed"  # the launch died: illegal address, deadlock, segfault
    INCORRECT = "incorrect"  # it ran, and some case gave a wrong result
    CORRECT = "correct"  # every case gave the right result
    GRADER_ERROR = "grader_error"  # the grader itself failed on the stage (a bug, its machine): graded again later


class PerfVerdict(StrEnum):
    FAST_ENOUGH = "fast_enough"
    TOO_SLOW = "too_slow"
    NOT_MEASURED = "not_measured"  # on the CPU backend, or because the stage is not correct


@dataclass(frozen=True)
class SourceLocation:
    """Where a kernel's source came from, so messages can name the notebook cell and line.

    A kernel in an r-string of triple quotes has one cell line per source line, from `first_line` on. Other string
    forms do not: a string with \\n escapes holds several source lines on one cell line, and a backslash-newline
    or several literals side by side put cell lines where the source has none. `line_starts` then holds the
    cell line each source line starts on (autograder.notebook.kernel_literal_lines).
    """

    notebook: str
    grade_id: str
    cell_index: int  # 0-based index of the cell in the notebook
    first_line: int  # the cell line (1-based) that holds the kernel source's first line
    line_starts: tuple[int, ...] = ()  # the cell line each source line starts on; () where one follows another

    @classmethod
    def of_lines(cls, notebook: str, grade_id: str, cell_index: int, cell_lines: tuple[int, ...]) -> SourceLocation:
        """The location of a kernel whose source line i starts on cell line `cell_lines[i - 1]`."""
        first = cell_lines[0]
        regular = cell_lines == tuple(range(first, first + len(cell_lines)))
        return cls(notebook, grade_id, cell_index, first, () if regular else cell_lines)

    def cell_line(self, source_line: int) -> int:
        """The line of the notebook cell that holds line `source_line` (1-based) of the kernel source."""
        if not self.line_starts or source_line < 1:
            return self.first_line + source_line - 1
        # A line past the end (a compiler's "at end of input") counts on from the last one.
        last = len(self.line_starts)
        return self.line_starts[min(source_line, last) - 1] + max(0, source_line - last)


@dataclass(frozen=True)
class KernelSource:
    """A kernel's CUDA C source and where it came from."""

    text: str
    location: SourceLocation | None = None

    def cell_line(self, source_line: int | None) -> int | None:
        if source_line is None or self.location is None:
            return source_line
        return self.location.cell_line(source_line)

    def placement(self) -> tuple[int | None, tuple[int, ...]]:
        """Where its lines lie in the cell, as far as messages tell: part of a memo key for what names lines."""
        return self.cell_line(1), self.location.line_starts if self.location else ()


@dataclass(frozen=True)
class CompilerMessage:
    """One diagnostic from the compiler; `line` is the notebook cell's line where known."""

    severity: str  # "error" or "warning"
    line: int | None
    text: str


@dataclass(frozen=True)
class Finding:
    """A defect seen while the kernel ran: a race, an out-of-bounds access, a deadlock, ...

    `kind` is one of FINDING_KINDS. `line` is the notebook cell's line where known.
    """

    kind: str
    message: str
    line: int | None = None
    thread: str | None = None  # e.g. "block (3,0,0) thread (35,0,0)"
    kernel: str | None = None
    # out_of_bounds: every stray access it stands for was a read, as its checker knows (the CPU analysis tells;
    # compute-sanitizer's findings do not, and count as writes). A read out of bounds changes no memory, so its
    # GPU worker may still serve a later student (autograder.executors).
    reads_only: bool = False


def merged(old: Finding | None, new: Finding) -> Finding:
    """One finding for two of the same kind and line: `new`, unless only `old` stands for a write."""
    return old if old is not None and new.reads_only and not old.reads_only else new


FINDING_KINDS = (
    "race_syncthreads",  # two warps touch the same shared word with no __syncthreads between
    "race_syncwarp",  # two lanes of one warp, with no __syncwarp between (unsafe since sm_70)
    "race_interblock",  # two blocks touch the same global word within one launch
    "out_of_bounds",
    "uninitialised_read",
    "deadlock",
    "inactive_lane",  # a shuffle read a lane that is not participating
    "output_guard",  # a write landed just past the end of an output buffer, seen on any backend
    "input_changed",  # the kernel wrote its read-only input g_in, seen on any backend: the case fails
    "barrier_divergence",  # a __syncthreads() that part of the block skips (undefined in CUDA; CPU backend only)
    "kept_state",  # a __device__ variable read where an earlier launch wrote it (CPU backend only; not the open stage)
)


@dataclass(frozen=True)
class LineMetric:
    """A teaching approximation measured per source line by the CPU backend."""

    line: int | None  # the notebook cell's line
    text: str  # the source line itself
    # Warp-wide shared-memory requests issued from this line, each of 8-byte (16-byte) accesses counted as its 2 (4)
    # phases, as a GPU serves it; and the transactions they needed: 1 per request (phase) without bank conflicts.
    shared_requests: int
    shared_transactions: int


@dataclass(frozen=True)
class KernelMetrics:
    """What the CPU backend measured of one kernel's launches."""

    lines: tuple[LineMetric, ...]
    divergence: float  # share of warp-steps in which the lanes of a warp took different paths
    # Counts over the measured blocks (the first few of each launch); 0 blocks where they were not counted.
    blocks: int = 0
    barriers: int = 0  # block-wide barriers (__syncthreads) those blocks passed
    diverged_steps: int = 0  # warp steps (a warp between two barriers) whose lanes took different paths
    shuffles: int = 0  # warp shuffles they ran, one per warp and shuffle
    lone_shared_requests: int = 0  # shared-memory warp requests one warp made alone (ag_runtime.cpp close_window)
    global_load_requests: int = 0  # whole-warp loads from global memory (at least 32 distinct words)
    global_load_sectors: int = 0  # the 32-byte sectors those loads touched
    global_load_words: int = 0  # the distinct 4-byte words they read
    busiest_thread_shared: int = 0  # the shared-memory accesses of each measured block's busiest thread, summed
    shared_atomics: int = 0  # atomic operations on shared memory
    at_scale: KernelMetrics | None = None  # the same, of its launches at the timing size (autograder.at_scale)

    @property
    def transactions_per_request(self) -> float:
        requests = sum(m.shared_requests for m in self.lines)
        return sum(m.shared_transactions for m in self.lines) / requests if requests else 0.0


@dataclass(frozen=True)
class CaseResult:
    """One correctness case: one input size and kind, and what the kernel gave."""

    label: str  # e.g. "n=257 integers" or "257x255 random"
    size: tuple[int, ...]  # (n,) for 1-D stages, (width, height) for max2d
    input_kind: str  # "integers", "random" or "negative"
    expected: float
    got: float | None
    passed: bool
    error: str | None = None  # why there is no result (a timeout, a crash), or why it does not count
    seeded: bool = False  # a size drawn from the run's seed, not one of the fixed edge sizes
    sampled: bool = False  # the timing size, run on sampled blocks (autograder.at_scale)


@dataclass(frozen=True)
class Timing:
    """Median time of one kernel's whole reduction, from interleaved, L2-flushed, event-timed calls."""

    label: str  # e.g. "yours", "your anti_divergence", "reference sequential"
    median_ms: float
    rse: float  # relative standard error of the mean of the samples
    repetitions: int
    gbps: float  # input bytes / median time


@dataclass(frozen=True)
class Performance:
    """The speed check of one stage."""

    verdict: PerfVerdict
    reason: str
    timings: tuple[Timing, ...] = ()
    speedup: float | None = None  # baseline time / this stage's time
    baseline: str | None = None  # what the speedup is over: "your naive" or "reference naive"
    required_speedup: float | None = None
    time_vs_reference: float | None = None  # this stage's time / the reference's time, same run
    allowed_time_vs_reference: float | None = None
    reference_step: float | None = None  # the calibrated reference speedup the required one comes from


@dataclass(frozen=True)
class Points:
    correctness: float
    performance: float
    penalty: float  # deducted for findings, per the rubric
    max_correctness: float
    max_performance: float  # 0 where performance is not counted (on the CPU backend)
    lines: tuple[str, ...] = ()  # the rubric line by line, for feedback
    technique: float = 0.0  # deducted because the stage's technique is absent (autograder.technique)

    @property
    def max_points(self) -> float:
        return self.max_correctness + self.max_performance

    @property
    def total(self) -> float:
        return max(0.0, self.correctness + self.performance - self.penalty - self.technique)


@dataclass(frozen=True)
class TechniqueCheck:
    """One measurement of a stage's technique (autograder.technique): the student's kernel against the
    reference kernels of this stage and of the previous one."""

    name: str  # e.g. "bank conflicts"
    what: str  # what is measured, in words, e.g. "shared-memory transactions per warp request"
    required: str  # the threshold in words, e.g. "at most 1.5"
    value: float | None  # the student's kernel; None where it was not measured
    reference: float | None  # the reference kernel of this stage
    previous: float | None  # the reference kernel of the previous stage: what the technique improves on
    passed: bool | None  # None: not checked here (no nvcc, no CPU measurement)
    how: str  # how it was measured, or why it was not


@dataclass(frozen=True)
class StageResult:
    stage: str
    status: Status
    message: str  # one sentence for people: what happened and what to do
    hint: str | None = None
    compiler: tuple[CompilerMessage, ...] = ()
    cases: tuple[CaseResult, ...] = ()
    findings: tuple[Finding, ...] = ()
    performance: Performance = field(
        default_factory=lambda: Performance(PerfVerdict.NOT_MEASURED, "the stage is not correct")
    )
    points: Points | None = None
    metrics: KernelMetrics | None = None  # bank conflicts and divergence, where the backend measures them
    technique: tuple[TechniqueCheck, ...] = ()  # the stage's lesson, measured (autograder.technique)
    phases: tuple[tuple[str, float], ...] = ()  # seconds spent compiling, checking, analysing and timing it


@dataclass(frozen=True)
class DeviceInfo:
    backend: str  # "gpu" or "cpu"
    name: str  # e.g. "NVIDIA H200" or "CPU backend (g++ 12.2, boost.context)"
    compute_capability: str | None = None
    l2_bytes: int | None = None
    versions: tuple[tuple[str, str], ...] = ()  # (package, version) pairs
    # Whether a kernel can reach the host's pageable memory (HMM or ATS); None where the backend cannot tell
    # (the CPU backend, whose kernels run in the worker's own memory).
    host_memory_access: bool | None = None


@dataclass(frozen=True)
class StudentResult:
    student: str
    notebook: str  # relative to the submissions folder (or the file's name): never a host path
    seed: int
    started: str  # ISO 8601, UTC
    device: DeviceInfo
    rubric: str  # the rubric used: its file name and a short hash of its content (Rubric.label)
    stages: tuple[StageResult, ...]
    problems: tuple[str, ...] = ()  # notebook-level problems: unreadable file, duplicated cells, ...
    isolation: str = ""  # how its code was isolated: "bubblewrap+seccomp", or "none (--no-sandbox)"
    gpu: int | None = None  # the GPU its stages were timed on, in a class graded on several
    notebook_sha256: str = ""  # of the notebook file graded ("" where it changed meanwhile): --resume regrades it
    settings: str = ""  # what the run changed of a full grading (grade.settings_label): "quick", "no speed", ...
    grader_version: str = ""
    # Failures of the grader itself while grading this student, with their tracebacks, for the staff (never
    # shown to the student): the stages they touched say so, and --resume grades the student again.
    grader_errors: tuple[str, ...] = ()

    @property
    def total(self) -> float:
        return sum(s.points.total for s in self.stages if s.points)

    @property
    def max_total(self) -> float:
        return sum(s.points.max_points for s in self.stages if s.points)


@dataclass(frozen=True)
class Build:
    """A compiled kernel, ready for a worker to load (autograder.build): `files` holds the compiler's output by
    name, `details` what its backend needs. It goes to workers; nothing a worker sends back is a Build."""

    backend: str  # "cpu" or "gpu"
    stage_id: str
    source: KernelSource
    warnings: tuple[CompilerMessage, ...]
    files: tuple[tuple[str, bytes], ...]
    details: dict[str, Any] = field(default_factory=dict)

    def file(self, name: str) -> bytes:
        return dict(self.files)[name]



def to_dict(record: Any) -> Any:
    """A record as JSON-ready data: enums by value, tuples as lists."""
    if dataclasses.is_dataclass(record):
        return {f.name: to_dict(getattr(record, f.name)) for f in dataclasses.fields(record)}
    if isinstance(record, Enum):
        return record.value
    if isinstance(record, (tuple, list)):
        return [to_dict(item) for item in record]
    return record


def from_dict(cls: type, data: Any) -> Any:
    """The inverse of `to_dict` for a record class."""
    return _build(cls, data)


def _build(tp: Any, data: Any) -> Any:
    if data is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [arg for arg in typing.get_args(tp) if arg is not type(None)]
        return _build(inner[0], data)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], item) for item in data)
        return tuple(_build(arg, item) for arg, item in zip(args, data, strict=True))
    if isinstance(tp, type) and issubclass(tp, Enum):
        return tp(data)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: _build(hints[f.name], data[f.name]) for f in dataclasses.fields(tp) if f.name in data})
    return data
