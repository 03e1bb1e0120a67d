"""The command line on the CPU backend: arguments, outputs, exit statuses, and bad hand-ins in a class."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from click.testing import CliRunner
from expectations import EXAMPLES

from autograder.cli import cli
from autograder.notebook import kernel_cell
from autograder.references import reference_source


@pytest.fixture(scope="module")
def small_class(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two real hand-ins, a damaged notebook, and a student folder with no notebook."""
    folder = tmp_path_factory.mktemp("submissions")
    shutil.copy(EXAMPLES / "frank.ipynb", folder / "frank.ipynb")
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [kernel_cell("naive", reference_source("naive").text)]
    nbformat.write(notebook, folder / "nina.ipynb")
    (folder / "broken.ipynb").write_text('{"cells": [')
    (folder / "empty_folder").mkdir()
    return folder


@pytest.fixture(scope="module")
def graded(small_class: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("results")
    args = ["grade", str(small_class), "--out", str(out), "--backend", "cpu", "--quick", "--seed", "11"]
    return CliRunner().invoke(cli, args), out


def test_grade_writes_a_result_per_student_and_the_class_table(graded) -> None:
    result, out = graded
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.glob("*.json")) == ["broken.json", "empty_folder.json", "frank.json", "nina.json"]
    table = pd.read_csv(out / "grades.csv").set_index("student")
    assert table.loc["nina", "naive_status"] == "correct" and table.loc["nina", "total"] == 10
    assert table.loc["frank", "first_add_status"] == "compile_error"
    assert "graded 4 student(s)" in result.output
    assert "graded on the CPU backend" in result.output and "speed not measured" in result.output


def test_bad_hand_ins_get_a_verdict_and_a_reason_and_grading_goes_on(graded) -> None:
    _, out = graded
    broken = json.loads((out / "broken.json").read_text())
    assert broken["problems"] and "not a readable notebook" in broken["problems"][0]
    assert {stage["status"] for stage in broken["stages"]} == {"invalid_cell"}
    empty = json.loads((out / "empty_folder.json").read_text())
    assert "no notebook" in empty["problems"][0]
    frank = json.loads((out / "frank.json").read_text())
    first_add = next(s for s in frank["stages"] if s["stage"] == "first_add")
    assert "does not compile at line" in first_add["message"] and first_add["compiler"][0]["line"]


def test_the_seed_is_recorded_and_reproduces_the_inputs(graded) -> None:
    _, out = graded
    assert json.loads((out / "nina.json").read_text())["seed"] == 11


def test_check_prints_the_stage_table_with_details(tmp_path: Path) -> None:
    target = tmp_path / "frank.json"
    args = ["check", str(EXAMPLES / "frank.ipynb"), "--backend", "cpu", "--quick", "--json", str(target)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "frank: 60 / 70 points" in result.output
    assert "does not compile at line" in result.output
    assert json.loads(target.read_text())["student"] == "frank"


def test_a_bad_rubric_is_a_configuration_error(tmp_path: Path) -> None:
    rubric = tmp_path / "rubric.toml"
    rubric.write_text("block_size = 100\n")
    result = CliRunner().invoke(cli, ["check", str(EXAMPLES / "alice.ipynb"), "--rubric", str(rubric)])
    assert result.exit_code == 1 and "block_size must be one of" in result.output


def test_usage_errors_name_the_problem(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["grade", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "does not exist" in result.output
    result = CliRunner().invoke(cli, ["grade", str(tmp_path), "--backend", "tpu"])
    assert result.exit_code == 2 and "'tpu' is not one of" in result.output


def test_an_out_folder_under_a_file_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    for out in ("afile", "afile/sub", "afile/sub/deeper"):
        result = CliRunner().invoke(cli, ["grade", str(tmp_path), "--out", str(tmp_path / out), "--backend", "cpu"])
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
        assert "Invalid value for '--out'" in result.output and "afile" in result.output


def test_a_read_only_out_folder_is_a_usage_error_before_any_grading(tmp_path: Path) -> None:
    submissions = tmp_path / "submissions"
    submissions.mkdir()
    nbformat.write(nbformat.v4.new_notebook(), submissions / "nobody.ipynb")
    out = tmp_path / "read-only"
    out.mkdir()
    command = [sys.executable, "-m", "autograder.cli", "grade", str(submissions), "--out", str(out),
               "--backend", "cpu", "--quick"]
    if os.geteuid() != 0:
        out.chmod(0o555)
    else:  # root writes through permissions: make the folder a read-only mount in a mount namespace of its own
        remount = f"mount --bind {out} {out} && mount -o remount,ro,bind {out} {out}"
        if subprocess.run(["unshare", "-m", "sh", "-c", remount], capture_output=True).returncode != 0:
            pytest.skip("no mount namespace here to make a read-only folder for root")
        command = ["unshare", "-m", "sh", "-c", f"{remount} && exec {shlex.join(command)}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr
    assert f"Invalid value for '--out': {out} cannot be written" in done.stderr and "Traceback" not in done.stderr
    assert "grading" not in done.stderr  # refused before the class was graded


def test_the_results_of_a_run_can_be_published(graded, tmp_path: Path) -> None:
    _, out = graded  # the grader's own result files pass the publishing commands' checks
    for command in ("leaderboard", "feedback", "export"):
        result = CliRunner().invoke(cli, [command, str(out), "--out", str(tmp_path / command)])
        assert result.exit_code == 0, result.output


def test_an_assignment_that_is_not_a_folder_name_is_a_usage_error(tmp_path: Path) -> None:
    nbformat.write(nbformat.v4.new_notebook(), tmp_path / "nobody.ipynb")
    for assignment in (str(tmp_path), "../ben/reduction"):
        result = CliRunner().invoke(cli, ["grade", str(tmp_path), "--assignment", assignment, "--backend", "cpu",
                                          "--out", str(tmp_path.parent / f"{tmp_path.name}-out")])
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
        assert "Invalid value for '--assignment'" in result.output and "a folder name" in result.output


def test_a_damaged_gradebook_is_one_line_after_the_results_and_a_configuration_error(tmp_path: Path) -> None:
    course = tmp_path / "course"
    (course / "submitted" / "ann" / "reduction").mkdir(parents=True)
    nbformat.write(nbformat.v4.new_notebook(), course / "submitted" / "ann" / "reduction" / "reduction.ipynb")
    (course / "gradebook.db").write_text("not a database")
    out = tmp_path / "results"
    result = CliRunner().invoke(cli, ["grade", str(course / "submitted"), "--assignment", "reduction", "--out",
                                      str(out), "--backend", "cpu", "--quick"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output and (out / "ann.json").is_file()
    (line,) = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert line == (f"error: {course / 'gradebook.db'}: nbgrader's gradebook cannot be read (file is not a "
                    "database), so these grades were not compared with it (they are written)")


def test_publishing_names_the_results_the_latest_run_left_out(tmp_path: Path) -> None:
    submissions, out = tmp_path / "submissions", tmp_path / "results"
    submissions.mkdir()
    for student in ("alice", "carol"):
        nbformat.write(nbformat.v4.new_notebook(), submissions / f"{student}.ipynb")
    grade = ["grade", str(submissions), "--out", str(out), "--backend", "cpu", "--quick", "--seed", "3"]
    assert CliRunner().invoke(cli, grade).exit_code == 0
    (submissions / "carol.ipynb").unlink()
    assert CliRunner().invoke(cli, grade).exit_code == 0
    for command in ("leaderboard", "feedback", "export"):
        result = CliRunner().invoke(cli, [command, str(out)])
        assert result.exit_code == 0, result.output
        assert "left out 1 result file(s) that the latest grading run did not write" in result.output
        assert "carol.json" in result.output and "carol" not in "".join(p.name for p in out.rglob("*") if p.is_dir())
    assert list(pd.read_csv(out / "exports" / "gradebook.csv")["student"]) == ["alice"]


def test_the_class_legend_names_every_short_status() -> None:
    from autograder.report import CLASS_LEGEND, SHORT_STATUS

    for short in SHORT_STATUS.values():
        assert f"{short} " in CLASS_LEGEND or f"{short}," in CLASS_LEGEND, short
