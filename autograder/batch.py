"""Grading a class: find the hand-ins, grade each, and write every result as soon as it is known.

Layouts accepted under the submissions folder:
- nbgrader's: `<student>/<assignment>/<notebook>.ipynb`
- flat: `<student>.ipynb`
- one folder per student: `<student>/<notebook>.ipynb`

Each student's result is written to `<out>/<student>.json` with an atomic rename, so a crash or a Ctrl-C never
leaves a half-written file and never loses the results already written. The class table `<out>/grades.csv`
is rewritten (atomically) after every student.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from autograder.errors import GraderError
from autograder.grade import GradeOptions, grade_notebook
from autograder.isolation import Worker
from autograder.records import StudentResult, to_dict
from autograder.stages import STAGE_IDS

PREFERRED_NOTEBOOK = "reduction.ipynb"


@dataclass(frozen=True)
class Submission:
    student: str
    notebook: Path | None
    problem: str | None = None  # why no notebook could be chosen


@dataclass(frozen=True)
class ClassRun:
    """What a class run produced: the results written and the students the grader itself failed on."""

    results: tuple[StudentResult, ...]
    failures: tuple[tuple[str, str], ...]  # (student, what went wrong in the grader)
    out: Path


def find_submissions(folder: Path, assignment: str | None = None) -> list[Submission]:
    """Every student's hand-in under `folder`, sorted by student."""
    if not folder.is_dir():
        raise GraderError(f"{folder}: no such folder of submissions")
    found: list[Submission] = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_file() and entry.suffix == ".ipynb":
            found.append(Submission(entry.stem, entry))
        elif entry.is_dir():
            found.append(_student_folder(entry, assignment))
    return found


def _student_folder(folder: Path, assignment: str | None) -> Submission:
    root = folder / assignment if assignment and (folder / assignment).is_dir() else folder
    notebooks = sorted(p for p in root.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    if not notebooks:
        return Submission(folder.name, None, f"no notebook under {root}")
    if len(notebooks) == 1:
        return Submission(folder.name, notebooks[0])
    preferred = [p for p in notebooks if p.name == PREFERRED_NOTEBOOK]
    if len(preferred) == 1:
        return Submission(folder.name, preferred[0])
    names = ", ".join(str(p.relative_to(folder)) for p in notebooks)
    return Submission(folder.name, None, f"several notebooks ({names}); pass --assignment to choose")


def grade_class(
    folder: Path,
    out: Path,
    options: GradeOptions,
    assignment: str | None = None,
    on_student: Callable[[str, int, int], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> ClassRun:
    """Grade every submission under `folder` with one seed for the run, writing results under `out`."""
    options = options.with_seed()
    out.mkdir(parents=True, exist_ok=True)
    submissions = find_submissions(folder, assignment)
    results: list[StudentResult] = []
    failures: list[tuple[str, str]] = []
    with Worker(options.backend, dict(options.backend_options)) as worker:
        for index, submission in enumerate(submissions):
            if on_student:
                on_student(submission.student, index, len(submissions))
            notebook = submission.notebook or folder / submission.student
            try:
                result = grade_notebook(notebook, submission.student, options, worker=worker, progress=on_stage)
            except Exception as error:  # a bug in the grader must not stop the class
                failures.append((submission.student, f"{error!r}\n{traceback.format_exc()}"))
                continue
            if submission.problem:
                result = replace(result, problems=(submission.problem, *result.problems))
            write_json(out / f"{file_stem(submission.student)}.json", to_dict(result))
            results.append(result)
            write_grade_table(results, out / "grades.csv")
    if failures:
        write_json(out / "grader-failures.json", [{"student": s, "error": e} for s, e in failures])
    return ClassRun(tuple(results), tuple(failures), out)


def file_stem(student: str) -> str:
    """A file name for a student's files: ids may hold spaces, slashes or an @."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", student).strip("._") or "student"


def write_json(path: Path, data: object) -> None:
    _atomic_write(path, json.dumps(data, indent=2, allow_nan=True) + "\n")


def grade_table(results: list[StudentResult] | tuple[StudentResult, ...]) -> pd.DataFrame:
    """One row per student: total, maximum, and each stage's points and status."""
    rows = []
    for result in results:
        row: dict[str, object] = {"student": result.student, "total": result.total, "max": result.max_total}
        for stage in result.stages:
            row[f"{stage.stage}_points"] = stage.points.total if stage.points else 0.0
            row[f"{stage.stage}_status"] = stage.status.value
            row[f"{stage.stage}_speed"] = stage.performance.verdict.value
        row.update(seed=result.seed, device=result.device.name, backend=result.device.backend)
        rows.append(row)
    columns = ["student", "total", "max"]
    for stage_id in STAGE_IDS:
        columns += [f"{stage_id}_points", f"{stage_id}_status", f"{stage_id}_speed"]
    columns += ["seed", "device", "backend"]
    return pd.DataFrame(rows, columns=columns)


def write_grade_table(results: list[StudentResult], path: Path) -> None:
    _atomic_write(path, grade_table(results).to_csv(index=False))


def _atomic_write(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
