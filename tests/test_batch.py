from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from test_records import sample

from autograder.batch import discover, find_submissions, grade_class, grade_table, write_json
from autograder.errors import GraderError
from autograder.grade import GradeOptions
from autograder.records import Status


def notebook(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nbformat.v4.new_notebook(), path)
    return path


def test_finds_flat_nbgrader_and_folder_layouts(tmp_path: Path) -> None:
    notebook(tmp_path / "ada.ipynb")
    notebook(tmp_path / "bob" / "reduction" / "reduction.ipynb")
    notebook(tmp_path / "cy" / "homework.ipynb")
    notebook(tmp_path / "cy" / ".ipynb_checkpoints" / "homework-checkpoint.ipynb")
    (tmp_path / "dee").mkdir()
    found = {s.student: s for s in find_submissions(tmp_path)}
    assert set(found) == {"ada", "bob", "cy", "dee"}
    assert found["bob"].notebook.name == "reduction.ipynb"
    assert found["cy"].notebook.name == "homework.ipynb"
    assert found["dee"].notebook is None and "no notebook" in found["dee"].problem


def test_several_notebooks_need_a_choice(tmp_path: Path) -> None:
    notebook(tmp_path / "eve" / "reduction" / "a.ipynb")
    notebook(tmp_path / "eve" / "other" / "b.ipynb")
    (submission,) = find_submissions(tmp_path)
    assert submission.notebook is None and "--assignment" in submission.problem
    (chosen,) = find_submissions(tmp_path, assignment="reduction")
    assert chosen.notebook.name == "a.ipynb"


def test_a_folder_without_a_notebook_to_grade_says_why_in_every_stage(tmp_path: Path) -> None:
    submissions = tmp_path / "submissions"
    notebook(submissions / "eve" / "reduction" / "a.ipynb")
    notebook(submissions / "eve" / "other" / "b.ipynb")
    (submissions / "dee").mkdir(parents=True)
    run = grade_class(submissions, tmp_path / "out", GradeOptions(backend="cpu", quick=True))
    assert not run.failures
    for result in run.results:
        why = result.problems[0]
        assert ("--assignment" if result.student == "eve" else "no notebook in dee/") in why
        assert {stage.status for stage in result.stages} == {Status.INVALID_CELL}
        assert {stage.message for stage in result.stages} == {f"{result.student}: {why}"}


def test_one_student_with_two_hand_ins_is_graded_once_and_the_other_listed(tmp_path: Path) -> None:
    notebook(tmp_path / "ada.ipynb")
    notebook(tmp_path / "ada" / "reduction.ipynb")
    found = discover(tmp_path)
    assert [(s.student, s.shown) for s in found.submissions] == [("ada", "ada/reduction.ipynb")]
    assert found.skipped == (("ada.ipynb", "another hand-in, ada/reduction.ipynb, has the same student name"),)


def test_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(GraderError, match="no such folder"):
        find_submissions(tmp_path / "nope")


def test_writes_are_atomic_and_leave_no_temporary_files(tmp_path: Path) -> None:
    target = tmp_path / "ada.json"
    write_json(target, {"old": True})
    with pytest.raises(TypeError):
        write_json(target, {"new": object()})  # fails half-way through serialising
    assert json.loads(target.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["ada.json"]


def test_grade_table_has_a_row_per_student_and_columns_per_stage() -> None:
    table = grade_table([sample()])
    assert isinstance(table, pd.DataFrame) and len(table) == 1
    row = table.iloc[0]
    assert row["student"] == "ada" and row["total"] == 15
    assert row["sequential_status"] == "correct" and row["sequential_speed"] == "fast_enough"
    assert pd.isna(row["max2d_points"])
