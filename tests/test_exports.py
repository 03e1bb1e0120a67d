"""Exports: Gradescope results.json per student and the LMS gradebook CSV."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from publish_class import make_class, write_results

from autograder.cli import cli
from autograder.publish import exports
from autograder.records import StudentResult
from autograder.stages import REQUIRED_STAGE_IDS, STAGES

CHECKS = ("correctness", "performance", "findings")


def by_name(results: list[StudentResult]) -> dict[str, StudentResult]:
    return {r.student: r for r in results}


def results_json(name: str, visibility: str = "visible") -> dict:
    results = make_class()
    data = exports.gradescope_results(by_name(results)[name], visibility)
    return json.loads(json.dumps(data))  # what Gradescope reads: plain JSON


@pytest.mark.parametrize("name", ["ada", "barbara", "dennis", "grace", "ken", "linus"])
def test_one_test_per_stage_and_check_adding_up_to_the_score(name: str) -> None:
    result = by_name(make_class())[name]
    data = results_json(name)
    assert data["score"] == result.total
    handed_in = [s.id for s in STAGES if not s.optional or any(r.stage == s.id for r in result.stages)]
    expected_names = [f"{s.number}. {s.title}: {check}" for s in STAGES if s.id in handed_in for check in CHECKS]
    assert [t["name"] for t in data["tests"]] == expected_names
    for test in data["tests"]:
        assert set(test) >= {"score", "max_score", "name", "output", "visibility"}
        assert test["score"] <= test["max_score"] and test["output"]
        assert test["visibility"] == "visible"
    # No stage here has its penalty clamped, so the tests add up to the total and their maxima to the maximum.
    assert sum(t["score"] for t in data["tests"]) == pytest.approx(result.total)
    assert sum(t["max_score"] for t in data["tests"]) == pytest.approx(result.max_total)


def test_each_check_carries_its_own_points_and_reason() -> None:
    tests = {t["name"]: t for t in results_json("linus")["tests"]}
    assert tests["5. Unrolled last warp: findings"]["score"] == -5.0
    assert tests["5. Unrolled last warp: findings"]["status"] == "failed"
    assert "cell line 14" in tests["5. Unrolled last warp: findings"]["output"]
    assert tests["5. Unrolled last warp: correctness"]["score"] == 10.0
    assert tests["5. Unrolled last warp: correctness"]["max_score"] == 10.0
    assert tests["5. Unrolled last warp: performance"]["max_score"] == 5.0
    performance = tests["5. Unrolled last warp: performance"]["output"]
    assert "Speedup over your first_add: 1.29x (required 1.15x)" in performance
    max2d = tests["7. 2-D max by quadrants: correctness"]
    assert max2d["score"] == 0.0 and max2d["max_score"] == 10.0 and max2d["status"] == "failed"
    assert "Failed: 257x3 random: expected 1, got 0.5" in max2d["output"]
    assert "clamp the index" in max2d["output"]
    grace = {t["name"]: t for t in results_json("grace")["tests"]}
    assert "Compiler error (cell line 12)" in grace["5. Unrolled last warp: correctness"]["output"]


def test_cpu_results_have_no_performance_points_to_earn() -> None:
    tests = {t["name"]: t for t in results_json("barbara")["tests"]}
    performance = tests["2. Anti-divergence: performance"]
    assert performance["max_score"] == 0.0 and performance["output"].startswith("Not measured")
    assert tests["2. Anti-divergence: correctness"]["max_score"] == 10.0
    assert "CPU backend" in results_json("barbara")["output"]


def test_leaderboard_entries_give_times_in_ascending_order() -> None:
    board = {e["name"]: e for e in results_json("ada")["leaderboard"]}
    assert board["Total score"] == {"name": "Total score", "value": 100.0, "order": "desc"}
    assert board["Naive (ms)"]["order"] == "asc" and board["Naive (ms)"]["value"] == pytest.approx(0.649)
    assert board["Open stage (ms)"]["value"] == pytest.approx(0.061 * 1.05)
    assert board["Best GB/s"]["order"] == "desc"
    # Only verified kernels: linus's racy stage is not on the board; no times at all from the CPU backend.
    assert "Unrolled last warp (ms)" not in {e["name"] for e in results_json("linus")["leaderboard"]}
    assert [e["name"] for e in results_json("barbara")["leaderboard"]] == ["Total score"]


def test_visibility_is_passed_on_and_checked() -> None:
    data = results_json("ada", "after_published")
    assert data["visibility"] == "after_published"
    assert {t["visibility"] for t in data["tests"]} == {"after_published"}
    with pytest.raises(ValueError, match="visibility"):
        results_json("ada", "sometimes")


def test_each_stage_shows_its_split_of_points_on_either_backend() -> None:
    students = by_name(make_class())
    grace = {t["name"]: t for t in exports.gradescope_results(students["grace"])["tests"]}  # GPU, compile error
    assert grace["4. First add during load: correctness"]["max_score"] == 10.0
    assert grace["4. First add during load: performance"]["max_score"] == 5.0
    ken = {t["name"]: t for t in exports.gradescope_results(students["ken"])["tests"]}  # CPU: speed not counted
    assert ken["4. First add during load: correctness"]["max_score"] == 10.0
    assert ken["4. First add during load: performance"]["max_score"] == 0.0


def test_the_gradebook_has_a_row_per_student_and_a_column_per_stage() -> None:
    results = make_class()
    book = exports.gradebook(results)
    assert list(book.columns) == ["student", *REQUIRED_STAGE_IDS, "total"]  # the open stage carries no points
    assert list(book["student"]) == [r.student for r in results]
    row = book.set_index("student").loc["linus"]
    assert row["unrolled_warp"] == 10.0 and row["max2d"] == 0.0 and row["total"] == 80.0
    assert book.set_index("student").loc["ken", "shuffle"] == 0.0
    assert (book[list(REQUIRED_STAGE_IDS)].sum(axis=1) == book["total"]).all()


def test_the_export_command(tmp_path: Path) -> None:
    results = write_results(tmp_path / "results", make_class())
    outcome = CliRunner().invoke(cli, ["export", str(results), "--out", str(tmp_path / "x"),
                                       "--visibility", "after_due_date"])
    assert outcome.exit_code == 0, outcome.output
    data = json.loads((tmp_path / "x" / "gradescope" / "grace" / "results.json").read_text())
    assert data["score"] == 85.0 and data["visibility"] == "after_due_date"
    book = pd.read_csv(tmp_path / "x" / "gradebook.csv")
    assert len(book) == 6 and book.loc[book["student"] == "ada", "total"].item() == 100
    only_book = CliRunner().invoke(cli, ["export", str(results), "--no-gradescope"])
    assert only_book.exit_code == 0
    assert (results / "exports" / "gradebook.csv").exists() and not (results / "exports" / "gradescope").exists()
