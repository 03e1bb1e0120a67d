"""`nbgrader autograde` runs the student's Python before the hidden graded cells, so a student cell can replace
what those cells would call. The graded cells grade the notebook file in a fresh, isolated Python instead
(autograder/nbgrade.py): these tests fail if a student cell that patches the grader, shadows its modules or
changes the grading settings changes the points.

What no graded cell can stop (a cell that replaces `subprocess` or the kernel's display) is why `autograder
grade` is the grade of record; the last test checks that it reports a gradebook that disagrees with it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import nbformat
import pytest
from click.testing import CliRunner
from nbgrader.api import Gradebook
from test_notebook_release import make_course, nbgrader

from autograder.cli import cli
from autograder.grade import GradeOptions, grade_notebook
from autograder.notebook import kernel_cell
from autograder.references import reference_source

STUDENT = "mallory"

# One student cell, run before every graded cell: the attack (replace `award`) and its relatives.
ATTACK = r'''
import json, os, pathlib, stat
import autograder.grade, autograder.nbgrade, autograder.selfcheck

# Replace what grades, in the kernel.
autograder.selfcheck.award = lambda *args, **kwargs: 10.0
autograder.grade.grade_stages = lambda *args, **kwargs: ()
autograder.nbgrade.grade = lambda *args, **kwargs: {"points": 10.0, "report": "forged"}

# A grader of my own where a new Python would look: beside the notebook, on PYTHONPATH, as sitecustomize.
forged = "import sys; print('{\"points\": 10.0, \"report\": \"forged\"}'); sys.exit(0)\n"
for folder in (pathlib.Path("."), pathlib.Path("shadow")):
    (folder / "autograder").mkdir(parents=True, exist_ok=True)
    (folder / "autograder" / "__init__.py").write_text(forged)
    (folder / "autograder" / "nbgrade.py").write_text(forged)
pathlib.Path("sitecustomize.py").write_text(forged)
os.environ["PYTHONPATH"] = str(pathlib.Path("shadow").resolve())

# Tools and settings the grader reads: compilers that fail, and a backend that is not there.
tools = pathlib.Path("shadow/bin")
tools.mkdir(parents=True, exist_ok=True)
for tool in ("g++", "c++", "gcc", "nvcc", "bwrap"):
    (tools / tool).write_text("#!/bin/sh\nexit 1\n")
    (tools / tool).chmod(0o755)
os.environ["PATH"] = f"{tools.resolve()}:{os.environ['PATH']}"
os.environ["AUTOGRADER_BACKEND"] = "gpu"
'''


def hand_in(released: Path, target: Path) -> None:
    """The released notebook with a correct naive stage, every other stage untouched, and the attack cell."""
    notebook = nbformat.read(released, as_version=4)
    for index, cell in enumerate(notebook.cells):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id == "naive":
            cell.source = kernel_cell("naive", reference_source("naive").text).source
        if grade_id == "setup":
            setup = index
    notebook.cells.insert(setup + 1, nbformat.v4.new_code_cell(ATTACK))
    target.parent.mkdir(parents=True)
    nbformat.write(notebook, target)


@pytest.fixture(scope="module")
def autograded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A course where nbgrader has autograded the attacker's hand-in on the CPU backend: (course, hand-in)."""
    with pytest.MonkeyPatch.context() as environment:
        environment.setenv("AUTOGRADER_BACKEND", "cpu")
        environment.setenv("AUTOGRADER_QUICK", "1")
        course = make_course(tmp_path_factory.mktemp("course"))
        nbgrader(course, "generate_assignment", "reduction")
        submitted = course / "submissions" / STUDENT / "reduction" / "reduction.ipynb"
        hand_in(course / "assignments" / "reduction" / "reduction.ipynb", submitted)
        nbgrader(course, "autograde", "reduction")
    return course, submitted


def nbgrader_points(course: Path) -> dict[str, float]:
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        submission = gradebook.find_submission_notebook("reduction", "reduction", STUDENT)
        return {grade.name.removeprefix("points_"): grade.score for grade in submission.grades}


@pytest.mark.slow
def test_patching_the_kernel_changes_no_points(autograded: tuple[Path, Path]) -> None:
    course, submitted = autograded
    points = nbgrader_points(course)
    ours = grade_notebook(submitted, STUDENT, GradeOptions(backend="cpu", quick=True))
    assert points == {stage.stage: stage.points.total for stage in ours.stages if stage.stage in points}
    assert points["naive"] == 10 and sum(points.values()) == 10  # the stubs stay at 0
    autograded_notebook = nbformat.read(course / "autograded" / STUDENT / "reduction" / "reduction.ipynb", 4)
    graded = [str(cell.outputs) for cell in autograded_notebook.cells if cell.metadata.get("nbgrader", {}).get("grade")]
    assert len(graded) == len(points) and not any("forged" in outputs for outputs in graded)
    assert "10 of 10: correctness 10/10" in graded[0]  # the naive stage's report


@pytest.mark.slow
def test_autograder_grade_reports_where_the_gradebook_disagrees(autograded: tuple[Path, Path], tmp_path: Path) -> None:
    course, _ = autograded
    args = ["grade", str(course / "submissions"), "--assignment", "reduction", "--out", str(tmp_path / "results"),
            "--backend", "cpu", "--quick"]
    agreeing = CliRunner().invoke(cli, args)
    assert agreeing.exit_code == 0, agreeing.output
    assert "the gradebook agrees" in agreeing.output
    # A forged score in the gradebook, as a student cell with the TA's rights could write it.
    with sqlite3.connect(course / "gradebook.db") as database:
        database.execute("UPDATE grade SET auto_score = 10")
    forged = CliRunner().invoke(cli, args)
    assert forged.exit_code == 0, forged.output
    assert f"{STUDENT}" in forged.output and "disagree" in forged.output
    assert "anti_divergence" in forged.output
