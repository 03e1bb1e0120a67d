"""Exports for other systems: Gradescope's results.json per student, and a gradebook CSV for an LMS.

Gradescope (https://gradescope-autograders.readthedocs.io/en/latest/specs/): `tests[]` holds one entry per
stage and check (correctness, performance, findings: races, bounds and an absent technique), each with `score`,
`max_score`, `name`, `output` and `visibility`; the top-level `score` is the student's total and overrides the
sum of the tests (a stage's points never drop below zero, while its findings entry may be negative). The
`leaderboard` list carries the total, the best bandwidth and each verified stage's time (`order: "asc"`: lower
is better).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from autograder import technique
from autograder.publish.feedback import file_stems
from autograder.publish.figures import StageFigures, all_figures, best_verified, case_value, fmt_number
from autograder.publish.render import write_text
from autograder.publish.results import load_results, results_folder
from autograder.records import PerfVerdict, Status, StudentResult
from autograder.spreadsheets import csv_text
from autograder.stages import STAGES

VISIBILITIES = ("visible", "after_due_date", "after_published", "hidden")
FAILED_CASES_SHOWN = 10  # a test's output is read on one screen


def gradescope_results(result: StudentResult, visibility: str = "visible") -> dict[str, Any]:
    """The results.json of one student."""
    if visibility not in VISIBILITIES:
        raise ValueError(f"visibility must be one of {', '.join(VISIBILITIES)}, not {visibility!r}")
    tests: list[dict[str, Any]] = []
    for figures in all_figures(result):
        if figures.result is None and figures.stage.optional:
            continue  # an optional stage the student did not hand in is no failed test
        tests += _stage_tests(figures, visibility)
    summary = f"{result.total:g} of {result.max_total:g} points."
    if result.problems:
        summary += "\nProblems with the notebook:\n" + "\n".join(f"- {p}" for p in result.problems)
    if result.device.backend != "gpu":
        summary += "\nGraded on the CPU backend: speed was not measured."
    return {
        "score": result.total,
        "output": summary,
        "visibility": visibility,
        "tests": tests,
        "leaderboard": _leaderboard(result),
    }


def _stage_tests(figures: StageFigures, visibility: str) -> list[dict[str, Any]]:
    """The correctness, performance and findings entries of one stage; penalties for findings are negative
    scores on the findings entry, whose maximum is 0. On the CPU backend performance is not counted: its
    maximum is 0."""
    stage = figures.stage
    name = f"{stage.number}. {stage.title}"
    record = figures.result
    points = record.points if record else None
    correctness_lines = [record.message if record else "No cell for this stage was found in the notebook."]
    if record and record.hint:
        correctness_lines.append(f"Hint: {record.hint}")
    if record:
        correctness_lines += [
            f"Compiler {m.severity}" + (f" (cell line {m.line})" if m.line else "") + f": {m.text}"
            for m in record.compiler
        ]
        failed = [c for c in record.cases if not c.passed]
        correctness_lines += [
            f"Failed: {c.label}: expected {case_value(c.expected)}, got {c.error or case_value(c.got)}"
            for c in failed[:FAILED_CASES_SHOWN]
        ]
        if len(failed) > FAILED_CASES_SHOWN:
            correctness_lines.append(
                f"... and {len(failed) - FAILED_CASES_SHOWN} more failed cases (all of them are in the feedback page)."
            )
    findings = record.findings if record else ()
    absent = technique.absent(record.technique) if record else ()
    findings_lines = [
        f.kind.replace("_", " ") + (f" at cell line {f.line}" if f.line else "") + f": {f.message}" for f in findings
    ] + [f"Technique absent: {technique.describe(check)}" for check in absent] or ["No race or bounds findings."]
    fast = record is not None and record.performance.verdict is PerfVerdict.FAST_ENOUGH
    return [
        _test(
            f"{name}: correctness",
            points.correctness if points else 0.0,
            points.max_correctness if points else 0.0,
            "\n".join(correctness_lines),
            figures.status is Status.CORRECT,
            visibility,
        ),
        _test(
            f"{name}: performance",
            points.performance if points else 0.0,
            points.max_performance if points else 0.0,
            _performance_text(figures),
            fast,
            visibility,
        ),
        _test(
            f"{name}: findings",
            0.0 - points.penalty - points.technique if points else 0.0,
            0.0,
            "\n".join(findings_lines),
            not findings and not absent,
            visibility,
        ),
    ]


def _performance_text(figures: StageFigures) -> str:
    record = figures.result
    if record is None:
        return "Not measured: the stage was not attempted."
    performance = record.performance
    if performance.verdict is PerfVerdict.NOT_MEASURED:
        return f"Not measured: {performance.reason}."
    parts = [f"{performance.verdict.value.replace('_', ' ').capitalize()}: {performance.reason}."]
    if figures.yours:
        parts.append(
            f"Your time {fmt_number(figures.yours.median_ms, 4)} ms, {fmt_number(figures.yours.gbps, 4)} GB/s."
        )
    if figures.reference:
        parts.append(f"Reference time {fmt_number(figures.reference.median_ms, 4)} ms.")
    if performance.speedup is not None:
        required = f" (required {fmt_number(performance.required_speedup)}x)" if performance.required_speedup else ""
        parts.append(f"Speedup over {performance.baseline}: {fmt_number(performance.speedup)}x{required}.")
    return " ".join(parts)


def _test(name: str, score: float, max_score: float, output: str, passed: bool, visibility: str) -> dict[str, Any]:
    return {
        "name": name,
        "score": score,
        "max_score": max_score,
        "status": "passed" if passed else "failed",
        "output": output,
        "visibility": visibility,
    }


def _leaderboard(result: StudentResult) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = [{"name": "Total score", "value": result.total, "order": "desc"}]
    best = best_verified(result)
    if best and best.yours:
        entries.append({"name": "Best GB/s", "value": round(best.yours.gbps, 1), "order": "desc"})
    for figures in all_figures(result):
        if figures.verified and figures.yours:
            entries.append(
                {"name": f"{figures.stage.title} (ms)", "value": round(figures.yours.median_ms, 5), "order": "asc"}
            )
    return entries


def gradebook(results: Sequence[StudentResult]) -> pd.DataFrame:
    """One row per student, one column of points per stage that carries points, and the total."""
    scored = [
        s
        for s in STAGES
        if any(
            f.points is not None and (f.max_points or not s.optional)
            for r in results
            for f in all_figures(r)
            if f.stage is s
        )
    ]
    rows = []
    for result in results:
        by_id = {f.stage.id: f for f in all_figures(result)}
        row: dict[str, object] = {"student": result.student}
        for stage in scored:
            points = by_id[stage.id].points
            row[stage.id] = points if points is not None else 0.0
        row["total"] = result.total
        rows.append(row)
    return pd.DataFrame(rows, columns=["student", *(s.id for s in scored), "total"])


def main(
    results_path: Path,
    out: Path | None = None,
    *,
    gradescope: bool = True,
    lms: bool = True,
    visibility: str = "visible",
) -> list[Path]:
    """Write `gradescope/<student>/results.json` and `gradebook.csv` under `out`; the files written."""
    results = load_results(results_path)
    target = out or results_folder(results_path) / "exports"
    written: list[Path] = []
    if gradescope:
        stems = file_stems([r.student for r in results])
        for result in results:
            data = gradescope_results(result, visibility)
            path = target / "gradescope" / stems[result.student] / "results.json"
            written.append(write_text(path, json.dumps(data, indent=2) + "\n"))
    if lms:
        written.append(write_text(target / "gradebook.csv", csv_text(gradebook(results), float_format="%g")))
    return written
