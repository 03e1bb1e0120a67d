"""The notebook's self-check: one call per stage, graded by the same code as `autograder grade`.

    check("sequential", SEQUENTIAL_SOURCE)   # under a kernel cell: a table with the verdict
    summary()                                 # at the end: every stage checked so far, with a chart

nbgrader's hidden graded cells do not call into this module: they grade the notebook file in a separate process
(autograder/nbgrade.py), so that nothing a student's cell replaces in the kernel changes the points.

`check` compiles, verifies and (on a GPU) times the kernel through `autograder.grade.grade_stages`, so its
verdict is the grader's. It remembers the kernels checked in this session: a stage's speedup is measured over the
student's own previous stage when that one was checked and is correct, else over the reference previous stage,
as the grader does.

It writes nothing to stderr (nbgrader zeroes a graded cell that does): warnings and the compiler's messages
become rows of the report. In Jupyter a report renders as an HTML table, elsewhere as plain text.

Settings, from the environment, for instructors and tests: AUTOGRADER_BACKEND (auto, gpu or cpu; default auto),
AUTOGRADER_QUICK (1 to drop the largest correctness cases; `check` drops them by default on the CPU backend only,
where they are slow) and AUTOGRADER_RUBRIC (a rubric file instead of the default one). The graded cells read them
too: for `nbgrader autograde` to give the points of `autograder grade`, give that the same --backend, --quick and
--rubric.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import html
import io
import math
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from autograder import technique
from autograder.errors import GraderError, NotebookError
from autograder.grade import GradeOptions, grade_stages
from autograder.isolation import Worker
from autograder.notebook import is_untouched, kernel_literal_lines
from autograder.records import (
    DeviceInfo,
    KernelSource,
    PerfVerdict,
    SourceLocation,
    StageResult,
    Status,
)
from autograder.report import metric_notes
from autograder.rubric import Rubric, load_rubric
from autograder.sandbox import Sandbox, sandbox_available
from autograder.stages import STAGES, Stage, get_stage

BACKEND_ENV = "AUTOGRADER_BACKEND"
QUICK_ENV = "AUTOGRADER_QUICK"
RUBRIC_ENV = "AUTOGRADER_RUBRIC"
# nbgrader sets this while it runs a notebook; "autograde" means the graded cells are about to grade every stage.
NBGRADER_ENV = "NBGRADER_EXECUTION"

MAX_LISTED = 5  # failed cases, compiler messages and findings shown per stage

T = TypeVar("T")


def quietly(work: Callable[[], T]) -> T:
    """`work()` with Python warnings and stderr kept out of the notebook: nbgrader zeroes a cell that writes there."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        return work()


def environment_rubric() -> Rubric:
    """The rubric named by AUTOGRADER_RUBRIC, else the default one."""
    return load_rubric(os.environ.get(RUBRIC_ENV) or None)


def environment_options(backend: str | None = None, quick_by_default: bool = False) -> GradeOptions:
    """GradeOptions from AUTOGRADER_BACKEND, AUTOGRADER_QUICK and AUTOGRADER_RUBRIC.

    They let an instructor (or a test) make the notebook grade as `autograder grade --backend ... --quick
    --rubric ...` does; unset, the notebook grades with `autograder grade`'s defaults.
    """
    quick = os.environ.get(QUICK_ENV)
    return GradeOptions(
        backend=backend or os.environ.get(BACKEND_ENV, "auto"),
        rubric=environment_rubric(),
        quick=quick_by_default if quick is None else quick not in ("", "0"),
    )


def display_or_print(report: object) -> None:
    """Show a report: rich display in an IPython kernel, plain text elsewhere."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        print(report)
        return
    if get_ipython() is None:
        print(report)
    else:
        display(report)


# --- the session -------------------------------------------------------------------------------------------


@dataclass
class _Session:
    """What one notebook session has checked, and the worker process that runs its kernels."""

    sources: dict[str, str] = field(default_factory=dict)
    results: dict[str, StageResult] = field(default_factory=dict)
    worker: Worker | None = None
    options: GradeOptions | None = None

    def grading(self) -> tuple[GradeOptions, Worker]:
        if self.options is None or self.worker is None:
            backend = os.environ.get(BACKEND_ENV, "auto")
            # A student's own kernels on their own machine: sandboxed where bubblewrap is there, else not.
            sandbox = Sandbox(sandbox_available())
            if not sandbox.enabled:
                print("Note: the self-check runs your kernels without the grader's sandbox (bubblewrap is not "
                      "installed here); the grade of record is always computed sandboxed.")
            worker = Worker(backend, sandbox=sandbox)
            atexit.register(worker.close)
            # The worker says which backend `auto` found; the CPU backend checks only the smaller cases by
            # default, because it runs every thread of the largest ones one after another.
            on_cpu = quietly(lambda: worker.device).backend == "cpu"
            self.options = replace(environment_options(backend, quick_by_default=on_cpu), sandbox=sandbox.enabled)
            self.worker = worker
        return self.options, self.worker

    def drop_worker(self) -> None:
        if self.worker is not None:
            quietly(self.worker.close)
        self.worker = None
        self.options = None


_session = _Session()


def reset() -> None:
    """Forget every kernel checked so far (the next check starts a fresh worker)."""
    global _session
    _session.drop_worker()
    _session = _Session()


# --- check ---------------------------------------------------------------------------------------------------


def check(stage_id: str, source: str) -> StageReport:
    """Grade one stage's kernel as the grader would, and return the report (Jupyter shows it)."""
    stage = get_stage(stage_id)
    if os.environ.get(NBGRADER_ENV) == "autograde":
        skipped = "self-check skipped while autograding: the graded cell below grades this stage"
        return StageReport(StageResult(stage.id, Status.NOT_ATTEMPTED, skipped), skipped=True)
    if not isinstance(source, str):
        problem = f"the kernel must be a string of CUDA C, not {type(source).__name__}"
        return StageReport(StageResult(stage.id, Status.INVALID_CELL, problem))
    _session.sources[stage.id] = source
    kernel, notes = _kernel(stage, source)
    try:
        options, worker = _session.grading()
        sources: dict[str, KernelSource | None] = {stage.id: kernel}
        earlier = {}
        if stage.previous in _session.results and stage.previous in _session.sources:
            # Timed against the student's own previous stage when it was checked correct in this session.
            sources[stage.previous] = KernelSource(text=_session.sources[stage.previous])
            earlier[stage.previous] = _session.results[stage.previous]
        result = quietly(
            lambda: grade_stages(sources, only=[stage.id], options=options, worker=worker, earlier=earlier)
        )[-1]
        device = quietly(lambda: worker.device)
    except GraderError as error:
        _session.drop_worker()  # this one could not start or has died: the next check starts a fresh one
        result = StageResult(stage.id, Status.CRASHED, f"the self-check could not run: {error}")
        return StageReport(result, notes=notes)
    except KeyboardInterrupt:
        # An interrupted call leaves its answer in the worker's pipe, where the next call would read it.
        _session.drop_worker()
        raise
    _session.results[stage.id] = result
    return StageReport(result, device=device, notes=notes)


def _kernel(stage: Stage, source: str) -> tuple[KernelSource | None, tuple[str, ...]]:
    """The kernel as the grader will see it, and notes on how the cell must look for that."""
    if is_untouched(stage.id, source):
        return None, ()
    cell_lines = _cell_lines_of(source)
    if cell_lines is None:
        note = (
            "the grader reads the kernel cell's string without running it, and no cell run in this session "
            'assigns this kernel as one plain string literal: keep the kernel cell a single `NAME = r"""..."""`'
        )
        return KernelSource(text=source), (note,)
    location = SourceLocation.of_lines("this notebook", stage.id, -1, cell_lines)
    return KernelSource(text=source, location=location), ()


def _cell_lines_of(source: str) -> tuple[int, ...] | None:
    """The cell line each line of the kernel starts on, from the latest input of this IPython session that
    assigns it (notebook.kernel_literal_lines).

    None when no input holds it as the grader needs it (an f-string, a file read, ...). Outside IPython there
    are no cells: line i is line i, so lines are counted in the kernel string.
    """
    counted = tuple(range(1, source.count("\n") + 2))
    try:
        from IPython import get_ipython
    except ImportError:
        return counted
    shell = get_ipython()
    if shell is None:
        return counted
    for entry in reversed(shell.user_ns.get("In", [])):
        if not isinstance(entry, str) or "=" not in entry:
            continue
        try:
            text, cell_lines = kernel_literal_lines(entry)
        except NotebookError:
            continue
        if text == source:
            return cell_lines
    return None


# --- the report of one stage -----------------------------------------------------------------------------


_COLOURS = {"pass": "#1a7f37", "warn": "#9a6700", "fail": "#cf222e", "todo": "#57606a"}
_MARKS = {"pass": "✔", "warn": "▲", "fail": "✘", "todo": "…"}


def verdict(result: StageResult) -> tuple[str, str]:
    """(level, sentence): level is pass, warn, fail or todo."""
    if result.status is Status.NOT_ATTEMPTED:
        return "todo", "not attempted yet: write the kernel in the cell above, then run this cell again"
    if result.status is not Status.CORRECT:
        return "fail", result.message
    if technique.absent(result.technique):
        names = ", ".join(check.name for check in technique.absent(result.technique))
        return "warn", f"the results are right, but the stage's technique is absent ({names}), which costs points"
    if result.points is not None and result.points.penalty > 0:
        kinds = ", ".join(sorted({f.kind.replace("_", " ") for f in result.findings}))
        return "warn", f"the results are right, but the checker found defects that cost points: {kinds}"
    performance = result.performance
    if performance.verdict is PerfVerdict.TOO_SLOW:
        return "warn", f"correct, but not fast enough: {performance.reason}"
    if performance.verdict is PerfVerdict.FAST_ENOUGH:
        return "pass", f"correct and fast enough: {performance.reason}"
    return "pass", f"correct ({performance.reason})"


class StageReport:
    """What `check` shows for one stage: rows of (label, text) and a verdict."""

    def __init__(
        self,
        result: StageResult,
        device: DeviceInfo | None = None,
        notes: Sequence[str] = (),
        skipped: bool = False,
    ) -> None:
        self.result = result
        self.device = device
        self.notes = tuple(notes)
        self.skipped = skipped  # nothing was graded: the report is just the result's message

    @property
    def stage(self) -> Stage:
        return get_stage(self.result.stage)

    def rows(self) -> list[tuple[str, str]]:
        result, stage = self.result, self.stage
        rows = [("Stage", f"{stage.number}. {stage.title} ({stage.id})")]
        if self.device is not None:
            name, backend = self.device.name, self.device.backend
            rows.append(("Ran on", name if backend in name.lower() else f"{name} ({backend} backend)"))
        if result.cases:
            passed = sum(case.passed for case in result.cases)
            sizes = sorted({case.size for case in result.cases}, key=math.prod)
            rows.append(
                ("Cases", f"{passed} of {len(result.cases)} passed, sizes {_size(sizes[0])} to {_size(sizes[-1])}")
            )
            failed = [case for case in result.cases if not case.passed]
            for case in failed[:MAX_LISTED]:
                got = case.error or f"got {case.got!r}"
                rows.append(("Failed", f"{case.label}: expected {case.expected!r}, {got}"))
            if len(failed) > MAX_LISTED:
                rows.append(("Failed", f"... and {len(failed) - MAX_LISTED} more"))
        for message in result.compiler[:MAX_LISTED]:
            where = f"line {message.line}: " if message.line else ""
            rows.append((f"Compiler {message.severity}", f"{where}{message.text}"))
        for finding in result.findings[:MAX_LISTED]:
            where = f" (line {finding.line})" if finding.line else ""
            thread = f", {finding.thread}" if finding.thread and finding.thread not in finding.message else ""
            rows.append(("Found", f"{finding.kind.replace('_', ' ')}{where}: {finding.message}{thread}"))
        rows.extend(("Technique", technique.describe(check)) for check in result.technique)
        if result.technique and technique.below_noise(result.performance):
            rows.append(("Technique", "the speed step of this stage is within the timing noise on this GPU: the "
                         "measurements above are what show its technique"))
        rows.extend(("Measured", note) for note in metric_notes(result.metrics))
        rows.extend(self._speed_rows())
        if result.points is not None:
            rows.append(
                (
                    "Points",
                    f"{result.points.total:g} of {result.points.max_points:g}: " + "; ".join(result.points.lines),
                )
            )
        rows.extend(("Note", note) for note in self.notes)
        if result.hint:
            rows.append(("Hint", result.hint))
        return rows

    def _speed_rows(self) -> list[tuple[str, str]]:
        performance = self.result.performance
        rows = []
        for timing in performance.timings:
            rows.append(
                (
                    f"Time, {timing.label}",
                    f"{timing.median_ms:.3f} ms ({timing.gbps:.0f} GB/s; median of {timing.repetitions}, "
                    f"±{timing.rse * 100:.2f} %)",
                )
            )
        if performance.speedup is not None:
            required = f", required {performance.required_speedup:.2f}x" if performance.required_speedup else ""
            rows.append(("Speedup", f"{performance.speedup:.2f}x over {performance.baseline}{required}"))
        if performance.time_vs_reference is not None:
            rows.append(
                (
                    "Versus reference",
                    f"{performance.time_vs_reference:.2f}x the reference's time "
                    f"(at most {performance.allowed_time_vs_reference:.2f}x)",
                )
            )
        return rows

    def __str__(self) -> str:
        if self.skipped:
            return f"{self.stage.id}: {self.result.message}"
        level, sentence = verdict(self.result)
        width = max(len(label) for label, _ in self.rows())
        lines = [f"{label.ljust(width)}  {text}" for label, text in self.rows()]
        return "\n".join([*lines, f"{'Verdict'.ljust(width)}  {_MARKS[level]} {sentence}"])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        if self.skipped:
            return f"<p><b>{html.escape(self.stage.id)}</b>: {html.escape(self.result.message)}</p>"
        level, sentence = verdict(self.result)
        body = "".join(
            f"<tr><th style='text-align:left;vertical-align:top'>{html.escape(label)}</th>"
            f"<td style='text-align:left'>{html.escape(text)}</td></tr>"
            for label, text in self.rows()
        )
        colour = _COLOURS[level]
        headline = (
            f"<tr><th style='text-align:left'>Verdict</th><td style='text-align:left;color:{colour};"
            f"font-weight:bold'>{_MARKS[level]} {html.escape(sentence)}</td></tr>"
        )
        return f"<table style='border-left:4px solid {colour}'>{body}{headline}</table>"


def _size(size: tuple[int, ...]) -> str:
    return f"n={size[0]}" if len(size) == 1 else f"{size[0]}x{size[1]}"


# --- the summary -----------------------------------------------------------------------------------------------


def summary() -> SummaryReport:
    """Every stage checked in this session, with a chart of speedups against the required and reference ones."""
    if os.environ.get(NBGRADER_ENV) == "autograde":
        return SummaryReport({}, skipped=True)
    return SummaryReport(dict(_session.results))


class SummaryReport:
    """A table of the stages checked so far, and a bar chart of their speedups."""

    HEADER = ("stage", "verdict", "time (ms)", "GB/s", "speedup", "required", "reference", "points")

    def __init__(self, results: dict[str, StageResult], skipped: bool = False) -> None:
        self.results = results
        self.skipped = skipped

    def table(self) -> list[tuple[str, ...]]:
        rows = []
        for stage in STAGES:
            result = self.results.get(stage.id)
            if result is None:
                rows.append((stage.id, "not checked", "", "", "", "", "", ""))
                continue
            level, _ = verdict(result)
            performance = result.performance
            yours = performance.timings[0] if performance.timings else None
            points = f"{result.points.total:g}/{result.points.max_points:g}" if result.points else ""
            rows.append(
                (
                    stage.id,
                    f"{_MARKS[level]} {result.status.value.replace('_', ' ')}",
                    f"{yours.median_ms:.3f}" if yours else "",
                    f"{yours.gbps:.0f}" if yours else "",
                    _ratio(performance.speedup),
                    _ratio(performance.required_speedup),
                    _ratio(performance.reference_step),
                    points,
                )
            )
        return rows

    def speedups(self) -> list[tuple[str, float, float | None, float | None]]:
        """(stage id, your speedup, required, reference) for the stages with a measured speedup."""
        found = []
        for stage in STAGES:
            result = self.results.get(stage.id)
            if result is not None and result.performance.speedup is not None:
                performance = result.performance
                found.append((stage.id, performance.speedup, performance.required_speedup, performance.reference_step))
        return found

    def chart_png(self) -> bytes | None:
        """The speedup chart as PNG, or None when no speedup was measured (on the CPU backend)."""
        points = self.speedups()
        if not points:
            return None
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        # A Figure without pyplot: no global state, and nothing drawn twice by the inline backend.
        figure = Figure(figsize=(8, 3.5))
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        positions = range(len(points))
        width = 0.27
        series = (
            ("yours", [p[1] for p in points], "#0969da"),
            ("required", [p[2] or math.nan for p in points], "#9a6700"),
            ("reference", [p[3] or math.nan for p in points], "#8c959f"),
        )
        for offset, (label, values, colour) in enumerate(series):
            axes.bar([x + (offset - 1) * width for x in positions], values, width, label=label, color=colour)
        axes.axhline(1.0, color="black", linewidth=0.8)
        axes.set_xticks(list(positions), [p[0] for p in points])
        axes.set_ylabel("speedup over the previous stage")
        axes.legend()
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=100)
        return buffer.getvalue()

    def __str__(self) -> str:
        if self.skipped:
            return "summary skipped while autograding"
        rows = [self.HEADER, *self.table()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(self.HEADER))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
        if not self.speedups():
            lines.append("No speedups measured: speed is measured on a GPU only.")
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        if self.skipped:
            return "<p>summary skipped while autograding</p>"
        head = "".join(f"<th>{html.escape(cell)}</th>" for cell in self.HEADER)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in self.table()
        )
        png = quietly(self.chart_png)
        chart = (
            f"<img alt='speedup per stage' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
            if png
            else "<p>No speedups measured: speed is measured on a GPU only.</p>"
        )
        return f"<table><tr>{head}</tr>{body}</table>{chart}"


def _ratio(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else ""


__all__ = ["StageReport", "SummaryReport", "check", "display_or_print", "quietly", "reset", "summary"]
