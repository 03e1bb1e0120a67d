from __future__ import annotations

import hashlib
import json
import os
import tracemalloc
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from test_records import sample

from autograder.batch import (
    NOT_REGULAR,
    ClassOptions,
    _sha256,
    discover,
    find_submissions,
    grade_class,
    grade_table,
    write_json,
)
from autograder.errors import GraderError
from autograder.grade import GradeOptions
from autograder.notebook import MAX_NOTEBOOK_BYTES
from autograder.publish.results import left_out, load_results
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


def test_a_folder_holding_no_notebook_never_hides_the_students_notebook(tmp_path: Path) -> None:
    notebook(tmp_path / "zed.ipynb")
    (tmp_path / "zed").mkdir()
    (tmp_path / "zed" / "report.pdf").write_bytes(b"%PDF")
    notebook(tmp_path / "amy.ipynb")
    notebook(tmp_path / "amy" / ".ipynb_checkpoints" / "amy-checkpoint.ipynb")
    found = discover(tmp_path)
    assert [(s.student, s.shown) for s in found.submissions] == [("amy", "amy.ipynb"), ("zed", "zed.ipynb")]
    assert found.skipped == (("amy/", "no notebook in amy/; amy.ipynb, of the same student name, is graded"),
                             ("zed/", "no notebook in zed/; zed.ipynb, of the same student name, is graded"))


def test_hidden_files_and_macos_zip_debris_in_a_student_folder_are_no_notebooks(tmp_path: Path) -> None:
    notebook(tmp_path / "mac" / "hw1.ipynb")
    (tmp_path / "mac" / "__MACOSX").mkdir()
    (tmp_path / "mac" / "__MACOSX" / "._hw1.ipynb").write_bytes(b"\x00\x05\x16\x07")
    notebook(tmp_path / "hid" / "hw1.ipynb")
    notebook(tmp_path / "hid" / ".hw1-backup.ipynb")
    notebook(tmp_path / "git" / "reduction" / "reduction.ipynb")
    notebook(tmp_path / "git" / ".git" / "old.ipynb")
    found = discover(tmp_path)
    chosen = {s.student: s.shown for s in found.submissions}
    assert chosen == {"git": "git/reduction/reduction.ipynb", "hid": "hid/hw1.ipynb", "mac": "mac/hw1.ipynb"}
    assert found.skipped == (("hid/.hw1-backup.ipynb", "a hidden entry (its name starts with a dot)"),)


def test_several_notebooks_in_one_folder_get_advice_that_works(tmp_path: Path) -> None:
    notebook(tmp_path / "multi" / "hw.ipynb")
    notebook(tmp_path / "multi" / "hw-old.ipynb")
    notebook(tmp_path / "nbg" / "reduction" / "a.ipynb")
    notebook(tmp_path / "nbg" / "reduction" / "b.ipynb")
    multi, nbg = find_submissions(tmp_path)  # --assignment chooses a folder: it cannot choose between these
    for submission in (multi, nbg):
        assert "--assignment" not in submission.problem and "name it reduction.ipynb" in submission.problem
    assert "several notebooks (hw-old.ipynb, hw.ipynb)" in multi.problem


def test_a_fifo_in_a_student_folder_is_listed(tmp_path: Path) -> None:
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "reduction.ipynb")
    found = discover(tmp_path)
    assert found.submissions[0].problem == "no notebook in fifo/ (fifo/reduction.ipynb refused: see the class summary)"
    assert found.skipped == (("fifo/reduction.ipynb", NOT_REGULAR),)


def test_the_hash_of_a_hand_in_reads_it_within_the_notebook_bound(tmp_path: Path) -> None:
    small = tmp_path / "small.ipynb"
    small.write_bytes(b"{}" * 1000)
    assert _sha256(small) == hashlib.sha256(small.read_bytes()).hexdigest()
    huge = tmp_path / "huge.ipynb"
    with huge.open("wb") as file:
        file.truncate(MAX_NOTEBOOK_BYTES + 1)  # sparse: nothing on disk, but it reads as 32 MiB of zeros
    tracemalloc.start()
    try:
        assert _sha256(huge) == ""  # too large to be graded (its verdict says so), so never resumed
        assert tracemalloc.get_traced_memory()[1] < 4 << 20  # read a chunk at a time, never whole
    finally:
        tracemalloc.stop()
    (tmp_path / "link.ipynb").symlink_to(small)
    assert _sha256(tmp_path / "link.ipynb") == ""


@pytest.mark.parametrize("assignment", ["../ben/reduction", "/tmp/elsewhere", "..", ".", "", "a/b"])
def test_the_assignment_must_be_a_folder_name(tmp_path: Path, assignment: str) -> None:
    notebook(tmp_path / "ben" / "reduction" / "reduction.ipynb")
    with pytest.raises(GraderError, match="give the assignment as a folder name"):
        discover(tmp_path, assignment)


def test_a_student_without_the_assignment_folder_has_nothing_else_graded(tmp_path: Path) -> None:
    notebook(tmp_path / "ann" / "ps0" / "ps0.ipynb")
    notebook(tmp_path / "ben" / "reduction" / "reduction.ipynb")
    (tmp_path / "cy" / "reduction").mkdir(parents=True)
    notebook(tmp_path / "cy" / "reduction.ipynb")  # a file, not the assignment's folder
    ann, ben, cy = find_submissions(tmp_path, assignment="reduction")
    assert ann.notebook is None and ann.problem == "no notebook for this assignment: no folder ann/reduction/"
    assert ben.notebook == tmp_path / "ben" / "reduction" / "reduction.ipynb"
    assert cy.notebook is None and cy.problem == "no notebook in cy/reduction/"


def test_the_results_folder_inside_the_submissions_is_no_student(tmp_path: Path) -> None:
    notebook(tmp_path / "alice.ipynb")
    out = tmp_path / "results"
    for _ in range(2):  # the second run finds the folder the first one wrote
        run = grade_class(tmp_path, out, GradeOptions(backend="cpu", quick=True))
        assert [result.student for result in run.results] == ["alice"]
        assert run.skipped == (("results", "the folder the results are written to (--out)"),)
    assert list(pd.read_csv(out / "grades.csv")["student"]) == ["alice"]


def test_publishing_reads_the_students_of_the_latest_run_only(tmp_path: Path) -> None:
    submissions, out = tmp_path / "submissions", tmp_path / "results"
    for student in ("alice", "carol", "grace"):
        notebook(submissions / f"{student}.ipynb")
    options = GradeOptions(backend="cpu", quick=True, seed=11)
    grade_class(submissions, out, options)
    (submissions / "carol.ipynb").unlink()
    (submissions / "grace.ipynb").rename(submissions / "Grace.ipynb")
    grade_class(submissions, out, options, spread=ClassOptions(resume=True))
    assert [result.student for result in load_results(out)] == ["Grace", "alice"]
    assert left_out(out) == ["carol.json", "grace.json"]  # kept, not deleted, and named when publishing
    assert (out / "carol.json").is_file()


def test_a_resumed_result_names_where_the_notebook_is_now(tmp_path: Path) -> None:
    submissions, out = tmp_path / "submissions", tmp_path / "results"
    notebook(submissions / "bob.ipynb")
    options = GradeOptions(backend="cpu", quick=True, seed=11)
    grade_class(submissions, out, options)
    (submissions / "bob").mkdir()
    (submissions / "bob.ipynb").rename(submissions / "bob" / "reduction.ipynb")
    (kept,) = grade_class(submissions, out, options, spread=ClassOptions(resume=True)).results
    assert kept.notebook == "bob/reduction.ipynb" and load_results(out)[0].notebook == "bob/reduction.ipynb"


def test_an_unreadable_notebook_names_the_student_in_every_stage(tmp_path: Path) -> None:
    (tmp_path / "zero" / "reduction").mkdir(parents=True)
    (tmp_path / "zero" / "reduction" / "reduction.ipynb").write_bytes(b"")
    (result,) = grade_class(tmp_path, tmp_path.parent / f"{tmp_path.name}-out", GradeOptions(backend="cpu")).results
    assert {stage.message for stage in result.stages} == {"zero: reduction.ipynb: not a readable notebook (not JSON)"}
