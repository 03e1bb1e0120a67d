"""What the terminal shows: one student's stage table, the class table, and the class summary."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape as escape_markup
from rich.table import Table

from autograder import technique
from autograder.records import DeviceInfo, KernelMetrics, PerfVerdict, StageResult, Status, StudentResult
from autograder.stages import REQUIRED_STAGE_IDS, get_stage
from autograder.wire import printable


def escape(text: str) -> str:
    """A student's text (a name, a message quoting the kernel's output or source) as the terminal shows it:
    neither markup nor control characters act."""
    return escape_markup(printable(text))


STATUS_STYLE = {
    Status.CORRECT: "green",
    Status.INCORRECT: "red",
    Status.COMPILE_ERROR: "red",
    Status.TIMEOUT: "red",
    Status.CRASHED: "red",
    Status.INVALID_CELL: "yellow",
    Status.NOT_ATTEMPTED: "dim",
    Status.GRADER_ERROR: "magenta",
}


def verdict(stage: StageResult) -> str:
    """A stage's verdict in a few words: its status, then its speed where measured."""
    text = stage.status.value.replace("_", " ")
    if stage.status is Status.CORRECT and stage.performance.verdict is not PerfVerdict.NOT_MEASURED:
        text += ", " + stage.performance.verdict.value.replace("_", " ")
    if stage.findings:
        text += ", " + ", ".join(sorted({f.kind for f in stage.findings}))
    return text


def student_table(result: StudentResult) -> Table:
    title = f"{escape(result.student)}: {result.total:g} / {result.max_total:g} points"
    table = Table(title=title, title_justify="left")
    for column in ("stage", "verdict", "cases", "time", "speedup", "points"):
        table.add_column(column, overflow="fold")
    for stage in result.stages:
        yours = next((t for t in stage.performance.timings if t.label == "yours"), None)
        passed = sum(case.passed for case in stage.cases)
        speedup = stage.performance.speedup
        required = stage.performance.required_speedup
        table.add_row(
            get_stage(stage.stage).title,
            f"[{STATUS_STYLE[stage.status]}]{verdict(stage)}[/]",
            f"{passed}/{len(stage.cases)}" if stage.cases else "-",
            f"{yours.median_ms * 1e3:.0f} us" if yours else "-",
            (f"{speedup:.2f}x" + (f" (needs {required:.2f}x)" if required else "")) if speedup else "-",
            f"{stage.points.total:g}/{stage.points.max_points:g}" if stage.points else "-",
        )
    return table


CONFLICTED = 1.5  # transactions per warp request above which a line is worth naming


def metric_notes(metrics: KernelMetrics | None) -> list[str]:
    """What the CPU backend measured, in words: the lines with bank conflicts and the share of divergent
    warp steps. Teaching approximations of what a profiler reports, not the profiler's figures."""
    if metrics is None:
        return []
    notes = [
        f"shared memory: {line.shared_transactions / line.shared_requests:.1f} transactions per warp request "
        f"at line {line.line} ({line.text.strip()}): bank conflicts"
        for line in metrics.lines
        if line.shared_requests and line.shared_transactions / line.shared_requests > CONFLICTED
    ]
    if metrics.lines:
        notes.append(f"shared memory overall: {metrics.transactions_per_request:.2f} transactions per warp request")
    notes.append(f"divergence: lanes of a warp took different paths in {metrics.divergence:.0%} of warp steps")
    return notes


def stage_details(stage: StageResult) -> list[str]:
    """What went wrong in a stage and what to do, one line each; nothing for a clean, fast stage."""
    lines = []
    if stage.status not in (Status.CORRECT, Status.NOT_ATTEMPTED):
        lines.append(stage.message)
    if stage.hint:
        lines.append(f"hint: {stage.hint}")
    for finding in stage.findings:
        where = f"line {finding.line}: " if finding.line else ""
        lines.append(f"{finding.kind}: {where}{finding.message}")
    if stage.performance.verdict is PerfVerdict.TOO_SLOW:
        lines.append(f"too slow: {stage.performance.reason}")
    lines += [f"technique: {technique.describe(check)}" for check in technique.absent(stage.technique)]
    return lines


SHORT_STATUS = {
    Status.CORRECT: "ok",
    Status.INCORRECT: "wrong",
    Status.COMPILE_ERROR: "comp",
    Status.TIMEOUT: "time",
    Status.CRASHED: "crash",
    Status.INVALID_CELL: "cell?",
    Status.NOT_ATTEMPTED: "-",
    Status.GRADER_ERROR: "ERR",
}
SHORT_SPEED = {PerfVerdict.FAST_ENOUGH: "+", PerfVerdict.TOO_SLOW: " slow", PerfVerdict.NOT_MEASURED: ""}
CLASS_TABLE_LIMIT = 40  # larger classes get the summary and grades.csv, not a table of hundreds of rows


def short_verdict(stage: StageResult) -> str:
    """A stage's verdict in a table cell: status, speed where measured, and a mark (!) for findings."""
    text = SHORT_STATUS[stage.status]
    if stage.status is Status.CORRECT:
        text += SHORT_SPEED[stage.performance.verdict]
    return text + ("!" if stage.findings else "")


def class_table(results: tuple[StudentResult, ...]) -> Table:
    """One row per student, readable in an 80-column terminal and in a CI log: names are cut, never folded."""
    table = Table(
        title="Class results", title_justify="left", caption=CLASS_LEGEND, caption_justify="left",
        box=box.SIMPLE_HEAD, pad_edge=False,
    )
    table.add_column("student", no_wrap=True, overflow="ellipsis", min_width=8, max_width=18)
    table.add_column("total", justify="right", no_wrap=True, min_width=7)
    for stage_id in REQUIRED_STAGE_IDS:
        table.add_column(str(get_stage(stage_id).number), no_wrap=True, min_width=3)
    for result in results:
        by_id = {stage.stage: stage for stage in result.stages}
        cells = []
        for stage_id in REQUIRED_STAGE_IDS:
            stage = by_id.get(stage_id)
            cells.append(f"[{STATUS_STYLE[stage.status]}]{short_verdict(stage)}[/]" if stage else "-")
        table.add_row(escape(result.student), f"{result.total:g}/{result.max_total:g}", *cells)
    return table


CLASS_LEGEND = (
    "Columns are stages: "
    + ", ".join(f"{get_stage(s).number} {s}" for s in REQUIRED_STAGE_IDS)
    + ".\nok = correct (+ fast enough, slow too slow), wrong, comp = compile error, time = timeout, crash, "
    "cell? = a cell or notebook that cannot be read, ! = races or bounds findings, - = not attempted, "
    "ERR = the grader failed."
)


def phase_summary(results: tuple[StudentResult, ...], wall_seconds: float) -> str:
    """Where the run's time went: each phase's total over the students, and students per minute."""
    totals: dict[str, float] = {}
    for result in results:
        for stage in result.stages:
            for phase, seconds in stage.phases:
                totals[phase] = totals.get(phase, 0.0) + seconds
    rate = len(results) / wall_seconds * 60 if wall_seconds > 0 else 0.0
    parts = ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in totals.items())
    return f"{len(results)} student(s) in {wall_seconds:.1f} s ({rate:.1f} a minute); summed over students: {parts}"


def class_summary(
    results: tuple[StudentResult, ...],
    failures: tuple[tuple[str, str], ...],
    skipped: tuple[tuple[str, str], ...] = (),
) -> str:
    """How many were graded, the pass rate per stage, any failures of the grader itself, and the entries of the
    submissions folder that were not graded (path, why). Names are escaped: a student's folder name is not markup."""
    lines = [f"graded {len(results)} student(s)" + (f"; the grader failed on {len(failures)}" if failures else "")]
    for stage_id in REQUIRED_STAGE_IDS:
        stages = [s for r in results for s in r.stages if s.stage == stage_id]
        correct = sum(s.status is Status.CORRECT for s in stages)
        fast = sum(s.performance.verdict is PerfVerdict.FAST_ENOUGH for s in stages)
        measured = any(s.performance.verdict is not PerfVerdict.NOT_MEASURED for s in stages)
        rate = f"{correct}/{len(stages)} correct" + (f", {fast}/{len(stages)} fast enough" if measured else "")
        lines.append(f"  {stage_id:16} {rate}")
    for student, error in failures:
        lines.append(f"  grader failure on {escape(student)}: {escape(error.splitlines()[0])}")
    if skipped:
        lines.append(f"skipped {len(skipped)} entr{'y' if len(skipped) == 1 else 'ies'} of the submissions folder:")
        lines += [f"  {escape(path)}: {escape(why)}" for path, why in skipped]
    return "\n".join(lines)


def backend_note(device: DeviceInfo, asked: str) -> str:
    """Which backend graded, and why speed is or is not in the grades."""
    if device.backend == "gpu":
        return f"graded on {device.name} (gpu backend)"
    why = "no GPU here (no PyCUDA, or no CUDA device), so " if asked == "auto" else ""
    return f"{why}graded on the CPU backend ({device.name}): correctness and races only, speed not measured"


def print_student(result: StudentResult, console: Console | None = None, asked: str = "auto") -> None:
    console = console or Console()
    console.print(student_table(result))
    for stage in result.stages:
        details = stage_details(stage) + [f"measured: {note}" for note in metric_notes(stage.metrics)]
        if details:
            console.print(f"[bold]{get_stage(stage.stage).title}[/]")
            for line in details:
                console.print(f"  {printable(line)}", markup=False, highlight=False)
    for problem in result.problems:
        console.print(f"[yellow]problem:[/] {escape(problem)}")
    console.print(f"seed {result.seed}; {backend_note(result.device, asked)}")
