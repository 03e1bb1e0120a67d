"""Feedback for each student: one readable page, in Markdown and in HTML, from their result file.

The page says what each stage got and why: the stage table against the reference kernels, the sizes that
failed with the hint (and the sizes drawn for this run), the compiler errors and the race and bounds findings
with the cell line, the stage's technique measured against the reference kernels, the speedup chart, and the
points line by line of the rubric. It leaves out the grading seed, which stays with the staff.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from autograder import __version__, technique
from autograder.batch import file_stem
from autograder.publish.figures import StageFigures, all_figures, case_value, fmt_number, speed_series
from autograder.publish.plots import Chart, stage_speedups
from autograder.publish.pseudonyms import SALT_FILE, pseudonym, read_salt_file
from autograder.publish.render import Table, render, write_text
from autograder.publish.results import ResultsError, load_results, results_folder
from autograder.records import CaseResult, PerfVerdict, StageResult, Status, StudentResult
from autograder.report import metric_notes


@dataclass(frozen=True)
class StageSection:
    """What the page says about one stage, below the table."""

    heading: str
    status: str
    ok: bool
    message: str
    hint: str | None
    compiler: Table | None
    failed_cases: Table | None
    findings: Table | None
    timings: Table | None
    performance: str
    points: Sequence[str]
    measured: Sequence[str] = ()  # bank conflicts and divergence, from the CPU backend
    technique: Sequence[str] = ()  # the stage's technique, measured against the reference kernels
    technique_note: str | None = None  # why the measurement, not the speed, shows this stage's lesson
    drawn: str = ""  # the sizes drawn from the run's seed, besides the fixed ones


@dataclass(frozen=True)
class FeedbackPage:
    student: str
    leaderboard_name: str | None
    result: StudentResult
    stage_table: Table
    sections: Sequence[StageSection]
    chart: Chart | None  # None when nothing was timed (the CPU backend)


def build_page(result: StudentResult, leaderboard_name: str | None = None) -> FeedbackPage:
    # The optional open stage shows only when the student handed one in.
    figures = [f for f in all_figures(result) if not f.stage.optional or f.result is not None]
    chart = None
    if any(f.measured for f in figures):
        steps, versus = speed_series([figures], [f.stage for f in figures])
        chart = stage_speedups(steps, versus, f"Speedups of {result.student}", "speedups")
    return FeedbackPage(result.student, leaderboard_name, result, stage_table(figures),
                        [_section(f) for f in figures], chart)


def stage_table(figures: Sequence[StageFigures]) -> Table:
    """Per stage: status, your time against the reference's, bandwidth, speedup against the requirement, points."""
    columns = ["Stage", "Status", "Your time (ms)", "Reference (ms)", "Yours / reference (allowed)", "GB/s",
               "Speedup (required)", "Points"]
    rows = []
    for f in figures:
        performance = f.result.performance if f.result else None
        ratio = ""
        if f.yours and f.reference:
            allowed = performance.allowed_time_vs_reference if performance else None
            ratio = f"{fmt_number(f.yours.median_ms / f.reference.median_ms)}"
            ratio += f" ({fmt_number(allowed)})" if allowed else ""
        speedup = ""
        if f.speedup is not None:
            required = performance.required_speedup if performance else None
            speedup = f"{fmt_number(f.speedup)}x" + (f" ({fmt_number(required)}x)" if required else "")
        points = f"{f.points:g} / {f.max_points:g}" if f.points is not None and f.max_points is not None else ""
        rows.append([
            f"{f.stage.number}. {f.stage.title}", f.status.value.replace("_", " "),
            fmt_number(f.yours.median_ms, 4) if f.yours else ("not measured" if f.status is Status.CORRECT else ""),
            fmt_number(f.reference.median_ms, 4) if f.reference else "",
            ratio, fmt_number(f.yours.gbps, 4) if f.yours else "", speedup, points,
        ])
    return Table(columns, rows, numeric=[False, False, True, True, True, True, True, True], name="stages")


def _section(f: StageFigures) -> StageSection:
    heading = f"{f.stage.number}. {f.stage.title} ({f.stage.id})"
    record = f.result
    if record is None:
        return StageSection(heading, "not attempted", False, "No cell for this stage was found in the notebook.",
                            None, None, None, None, None, "", ())
    compiler = Table(["Severity", "Cell line", "Message"],
                     [[m.severity, _line(m.line), m.text] for m in record.compiler], name="compiler") \
        if record.compiler else None
    failed = [c for c in record.cases if not c.passed]
    failed_cases = Table(["Case", "Size", "Expected", "Got", "Error"],
                         [[c.label, _size(c), case_value(c.expected), case_value(c.got), c.error or ""]
                          for c in failed],
                         numeric=[False, True, True, True, False], name="failed-cases") if failed else None
    findings = Table(["Finding", "Cell line", "Where", "Message"],
                     [[x.kind.replace("_", " "), _line(x.line), ", ".join(filter(None, (x.kernel, x.thread))),
                       x.message] for x in record.findings], name="findings") if record.findings else None
    timed = record.performance.timings
    timings = Table(["Kernel", "Median (ms)", "GB/s", "Rel. std. error", "Calls"],
                    [[t.label, fmt_number(t.median_ms, 4), fmt_number(t.gbps, 4), f"{100 * t.rse:.2f}%",
                      str(t.repetitions)] for t in timed],
                    numeric=[False, True, True, True, True], name="timings") if timed else None
    verdict = record.performance.verdict
    performance = ("Speed: not measured (" + record.performance.reason + ")." if verdict is PerfVerdict.NOT_MEASURED
                   else f"Speed: {verdict.value.replace('_', ' ')} ({record.performance.reason}).")
    lines = record.points.lines if record.points else ()
    return StageSection(heading, f.status.value.replace("_", " "), f.status is Status.CORRECT and not findings,
                        record.message, record.hint, compiler, failed_cases, findings, timings, performance, lines,
                        metric_notes(record.metrics), [technique.describe(c) for c in record.technique],
                        technique_note(record), ", ".join(dict.fromkeys(_size(c) for c in record.cases if c.seeded)))


def _size(case: CaseResult) -> str:
    return " x ".join(str(n) for n in case.size)


def technique_note(record: StageResult) -> str | None:
    """Why the technique measurement is what shows the lesson of this stage, where the speed cannot."""
    if not record.technique:
        return None
    step = record.performance.reference_step
    if technique.below_noise(record.performance):
        return (f"On this GPU the reference kernel of this stage is only {step:.2f}x as fast as the previous "
                "stage's, within the timing noise, so the speed check cannot see the technique: the measurement "
                "below is what shows it.")
    return ("Measured deterministically (no timing noise), against the reference kernels of this stage and of the "
            "previous one.")


def _line(line: int | None) -> str:
    return "" if line is None else str(line)


def file_stems(students: Sequence[str]) -> dict[str, str]:
    """Each student's file stem; two ids that would write the same file are refused, not overwritten."""
    stems: dict[str, str] = {}
    owners: dict[str, str] = {}
    for student in students:
        stem = file_stem(student)
        if stem in owners:
            raise ResultsError(f"students {owners[stem]!r} and {student!r} would get the same file name {stem!r}; "
                               "rename one of their result files' students")
        owners[stem] = student
        stems[student] = stem
    return stems


def write_feedback(page: FeedbackPage, out: Path, stem: str | None = None) -> list[Path]:
    """<stem>.md, <stem>.html and, where there is a chart, <stem>-speedups.svg for the Markdown."""
    stem = stem or file_stem(page.student)
    written = []
    chart_file = None
    if page.chart is not None:
        chart_file = write_text(out / f"{stem}-speedups.svg", page.chart.svg)
        written.append(chart_file)
    context = {"page": page, "version": __version__, "title": f"Feedback: {page.student}",
               "chart_file": chart_file.name if chart_file else None}
    written.append(write_text(out / f"{stem}.md", render("feedback.md.j2", **context)))
    written.append(write_text(out / f"{stem}.html", render("feedback.html.j2", **context)))
    return written


def main(
    results_path: Path,
    out: Path | None = None,
    *,
    students: Sequence[str] = (),
    salt: str | None = None,
    salt_file: Path | None = None,
) -> list[Path]:
    """Write the feedback pages of every student (or of `students`); the files written.

    A page names the student's leaderboard pseudonym when the salt is known (given, or in the salt file that
    `autograder leaderboard` keeps next to the results), so students can find themselves on the board.
    """
    results = load_results(results_path)
    folder = results_folder(results_path)
    if students:
        unknown = sorted(set(students) - {r.student for r in results})
        if unknown:
            raise ResultsError(f"no results for {', '.join(unknown)} in {results_path}; the students there are: "
                               + ", ".join(r.student for r in results))
        results = [r for r in results if r.student in students]
    known_salt = salt if salt is not None else read_salt_file(Path(salt_file or folder / SALT_FILE)) or None
    target = out or folder / "feedback"
    stems = file_stems([r.student for r in results])
    written: list[Path] = []
    for result in results:
        name = pseudonym(result.student, known_salt) if known_salt else None
        written += write_feedback(build_page(result, name), target, stems[result.student])
    return written
