"""`nbgrader autograde` gives every stage the same points as `autograder grade` for the same hand-in.

A released notebook is filled in as a student would: reference kernels for most stages, one with a bug, one
renamed (the grader accepts any name for the kernel's string), one left as the stub. nbgrader autogrades it in a
temporary course directory, and its per-cell scores are compared with `grade_notebook` on the same file.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook
from test_notebook_release import KERNELS, make_course, nbgrader

from autograder.grade import GradeOptions, grade_notebook
from autograder.notebook import kernel_cell
from autograder.rubric import load_rubric
from autograder.stages import STAGES

STUDENT = "alice"
BUGGY = "naive"  # reads past n: wrong sums and an out-of-bounds finding
RENAMED = "sequential"  # assigned to another name than the stub's
UNTOUCHED = "shuffle"  # still the released stub: not attempted


def hand_in(released: Path, target: Path) -> None:
    """The released notebook with the kernel cells filled in."""
    notebook = nbformat.read(released, as_version=4)
    for cell in notebook.cells:
        stage_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if stage_id not in {stage.id for stage in STAGES} or stage_id == UNTOUCHED:
            continue
        kernel = (KERNELS / f"{stage_id}.cu").read_text()
        if stage_id == BUGGY:
            kernel = kernel.replace("(i < n) ? g_in[i] : 0.0f", "g_in[i]")
            assert "g_in[i];" in kernel
        name = "MY_KERNEL" if stage_id == RENAMED else f"{stage_id.upper()}_SOURCE"
        cell.source = kernel_cell(stage_id, kernel, name).source
    target.parent.mkdir(parents=True)
    nbformat.write(notebook, target)


@pytest.mark.slow
def test_autograde_gives_the_points_of_autograder_grade(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Both graders on the CPU backend with the quick cases: CI has no GPU, and the points must match anyway.
    monkeypatch.setenv("AUTOGRADER_BACKEND", "cpu")
    monkeypatch.setenv("AUTOGRADER_QUICK", "1")
    course = make_course(tmp_path)
    nbgrader(course, "generate_assignment", "reduction")
    submitted = course / "submissions" / STUDENT / "reduction" / "reduction.ipynb"
    hand_in(course / "assignments" / "reduction" / "reduction.ipynb", submitted)
    shutil.copy(submitted, tmp_path / "handed-in.ipynb")  # autograde must not change what was handed in

    nbgrader(course, "autograde", "reduction")

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        submission = gradebook.find_submission_notebook("reduction", "reduction", STUDENT)
        nbgrader_points = {grade.name.removeprefix("points_"): grade.score for grade in submission.grades}
    ours = grade_notebook(submitted, STUDENT, GradeOptions(backend="cpu", quick=True))
    our_points = {stage.stage: stage.points.total for stage in ours.stages if stage.stage in nbgrader_points}

    # The autograded notebook: its graded cells show the stage reports, and its self-checks stepped aside.
    autograded = nbformat.read(course / "autograded" / STUDENT / "reduction" / "reduction.ipynb", as_version=4)
    outputs = {c.metadata.nbgrader.grade_id: c.outputs for c in autograded.cells if "nbgrader" in c.metadata}
    rubric = load_rubric()
    assert set(nbgrader_points) == {s for s, p in rubric.stages.items() if p.correctness + p.performance > 0}
    differing = [stage for stage in nbgrader_points if nbgrader_points[stage] != pytest.approx(our_points[stage])]
    assert not differing, "\n\n".join(
        f"{stage}: nbgrader {nbgrader_points[stage]}, autograder {our_points[stage]} "
        f"({next(s.message for s in ours.stages if s.stage == stage)})\nnbgrader's cell: {outputs[f'points_{stage}']}"
        for stage in differing
    )
    # The hand-in exercises more than full marks: a bug, a renamed kernel and a stub each get what they should.
    assert nbgrader_points[BUGGY] == 0
    assert nbgrader_points[UNTOUCHED] == 0
    assert nbgrader_points[RENAMED] == rubric.stages[RENAMED].correctness
    assert submitted.read_bytes() == (tmp_path / "handed-in.ipynb").read_bytes()
    assert "skipped while autograding" in str(outputs["check_naive"])
    assert "out of bounds" in str(outputs["points_naive"])
