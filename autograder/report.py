"""What the terminal shows: one student's stage table, the class table, and the class summary."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from autograder.records import PerfVerdict, StageResult, Status, StudentResult
from autograder.stages import REQUIRED_STAGE_IDS, get_stage

STATUS_STYLE = {
    Status.CORRECT: "green",
    Status.INCORRECT: "red",
    Status.COMPILE_ERROR: "red",
    Status.TIMEOUT: "red",
    Status.CRASHED: "red",
    Status.INVALID_CELL: "yellow",
    Status.NOT_ATTEMPTED: "dim",
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
    table = Table(title=f"{result.student}: {result.total:g} / {result.max_total:g} points", title_justify="left")
    for column in ("stage", "verdict", "cases", "time", "speedup", "points", "what to do"):
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
            (f"{speedup:.2f}x" + (f" (≥{required:.2f}x)" if required else "")) if speedup else "-",
            f"{stage.points.total:g}/{stage.points.max_points:g}" if stage.points else "-",
            _advice(stage),
        )
    return table


def _advice(stage: StageResult) -> str:
    if stage.status is Status.CORRECT and not stage.findings:
        return "" if stage.performance.verdict is not PerfVerdict.TOO_SLOW else stage.performance.reason
    parts = [stage.message]
    if stage.hint:
        parts.append(stage.hint)
    for finding in stage.findings[:3]:
        where = f" (line {finding.line})" if finding.line else ""
        parts.append(f"{finding.kind}{where}: {finding.message}")
    return "\n".join(parts)


def class_table(results: tuple[StudentResult, ...]) -> Table:
    table = Table(title="Class results", title_justify="left")
    table.add_column("student")
    table.add_column("total", justify="right")
    for stage_id in REQUIRED_STAGE_IDS:
        table.add_column(stage_id, overflow="fold")
    for result in results:
        by_id = {stage.stage: stage for stage in result.stages}
        cells = []
        for stage_id in REQUIRED_STAGE_IDS:
            stage = by_id.get(stage_id)
            cells.append(f"[{STATUS_STYLE[stage.status]}]{verdict(stage)}[/]" if stage else "-")
        table.add_row(result.student, f"{result.total:g}/{result.max_total:g}", *cells)
    return table


def class_summary(results: tuple[StudentResult, ...], failures: tuple[tuple[str, str], ...]) -> str:
    """How many were graded, the pass rate per stage, and any failures of the grader itself."""
    lines = [f"graded {len(results)} student(s)" + (f"; the grader failed on {len(failures)}" if failures else "")]
    for stage_id in REQUIRED_STAGE_IDS:
        stages = [s for r in results for s in r.stages if s.stage == stage_id]
        correct = sum(s.status is Status.CORRECT for s in stages)
        fast = sum(s.performance.verdict is PerfVerdict.FAST_ENOUGH for s in stages)
        measured = any(s.performance.verdict is not PerfVerdict.NOT_MEASURED for s in stages)
        rate = f"{correct}/{len(stages)} correct" + (f", {fast}/{len(stages)} fast enough" if measured else "")
        lines.append(f"  {stage_id:16} {rate}")
    for student, error in failures:
        lines.append(f"  grader failure on {student}: {error.splitlines()[0]}")
    return "\n".join(lines)


def print_student(result: StudentResult, console: Console | None = None) -> None:
    console = console or Console()
    console.print(student_table(result))
    for problem in result.problems:
        console.print(f"[yellow]problem:[/] {problem}")
    console.print(f"seed {result.seed}, {result.device.name} ({result.device.backend} backend)")
