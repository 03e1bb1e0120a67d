"""Every CSV the project writes (grades, the LMS gradebook, the leaderboards) is safe to open in a spreadsheet:
a hand-in's name cannot become a formula there (CSV injection, OWASP)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from autograder.cli import cli
from autograder.spreadsheets import FORMULA_START, csv_text, safe_cell

RELEASED = Path(__file__).resolve().parents[1] / "assignments" / "reduction" / "reduction.ipynb"
HOSTILE_NAMES = ('=HYPERLINK("http___x","a")', "+cmd", "-2+3+cmd", "@SUM(A1)", "=1+1")


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ('=HYPERLINK("http://x","a")', '\'=HYPERLINK("http://x","a")'),
        ("+1+1", "'+1+1"),
        ("-1+cmd|' /C calc'!A0", "'-1+cmd|' /C calc'!A0"),
        ("@SUM(A1:A2)", "'@SUM(A1:A2)"),
        ("\t=1", "'\t=1"),
        ("\r=1", "'\r=1"),
        ("-2.5", "-2.5"),  # a number written as text stays a number
        ("-inf", "-inf"),
        ("alice", "alice"),
        ("a=b", "a=b"),
        (-3.0, -3.0),
        (None, None),
    ],
)
def test_a_cell_a_spreadsheet_would_run_is_written_as_text(value: object, written: object) -> None:
    assert safe_cell(value) == written


def test_csv_text_neutralises_text_cells_and_keeps_numbers() -> None:
    frame = pd.DataFrame({"student": ["=1+1", "bob"], "total": [-1.5, 2.0]})
    rows = list(csv.reader(csv_text(frame).splitlines()))
    assert rows == [["student", "total"], ["'=1+1", "-1.5"], ["bob", "2.0"]]


def test_hand_ins_named_as_formulas_reach_no_csv_as_formulas(tmp_path: Path) -> None:
    # Hand-ins named as formulas: the released notebook, every stage a stub, so nothing compiles.
    submissions = tmp_path / "submissions"
    submissions.mkdir()
    for name in HOSTILE_NAMES:
        shutil.copy(RELEASED, submissions / f"{name}.ipynb")
    out = tmp_path / "results"
    runner = CliRunner()
    graded = runner.invoke(cli, ["grade", str(submissions), "--out", str(out), "--backend", "cpu", "--seed", "1"])
    assert graded.exit_code == 0, graded.output
    for command in (["leaderboard", str(out), "--real-names"], ["export", str(out)]):
        done = runner.invoke(cli, command)
        assert done.exit_code == 0, done.output
    written = sorted(out.rglob("*.csv"))
    assert {path.name for path in written} >= {"grades.csv", "gradebook.csv", "leaderboard.csv"}
    names_seen = set()
    for path in written:
        with open(path, newline="", encoding="utf-8") as file:
            cells = [cell for row in csv.reader(file) for cell in row]
        for cell in cells:
            assert not cell.startswith(FORMULA_START) or safe_cell(cell) == cell, f"{path.name}: {cell!r}"
        names_seen |= {cell[1:] for cell in cells if cell.startswith("'")}
    assert set(HOSTILE_NAMES) <= names_seen  # every name is there, shown as text
