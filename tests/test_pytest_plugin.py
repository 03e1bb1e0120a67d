"""The pytest plugin (autograder/pytest_plugin.py): `pytest --grade` on a small class, against `autograder grade`.

pytest runs in a subprocess, as a TA or a CI job runs it, on three hand-ins that show every kind of item: bob (wrong
kernels with bounds findings) and grace (stages not attempted, an optional cell that is no string literal) from the
example class, and hank, alice's hand-in with a shuffle that sums right but reads inactive lanes (undefined
behaviour: an incorrect stage whose cases all passed, the rubric's [undefined_behaviour]). `autograder grade` on
the same class with the same seed must give the same points.
The gpu-marked variant does the same on a GPU, where speed counts.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from click.testing import CliRunner
from expectations import EXAMPLES, KNOWN, ROOT

from autograder.cli import cli
from autograder.notebook import kernel_cell
from autograder.publish.figures import StageFigures
from autograder.publish.results import load_results
from autograder.pytest_plugin import CHECKS, FAILED, PASSED, SKIPPED, check_verdict
from autograder.records import (
    CaseResult,
    Performance,
    PerfVerdict,
    Points,
    StageResult,
    Status,
    StudentResult,
    to_dict,
)
from autograder.rubric import load_rubric
from autograder.stages import STAGE_IDS, get_stage

sys.path.insert(0, str(ROOT / "solutions" / "reduction"))
import build_notebook  # noqa: E402  (a script beside the notebook, not a package module)

SEED = 7
STUDENTS = ("bob", "grace", "hank")
ON_CPU = ["--grade-backend", "cpu", "--grade-quick", "--grade-seed", str(SEED)]
RELEASE = ROOT / "assignments" / "reduction"


@dataclass(frozen=True)
class Item:
    """One testcase of a JUnit XML file."""

    outcome: str  # PASSED, FAILED or SKIPPED
    points: float
    max_points: float
    message: str


def run_pytest(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    # Installed, the package registers the plugin (pytest11); on a machine where it is only on the path (the GPU
    # machine's carried packages), it is named.
    registered = any(e.name == "autograder" for e in importlib.metadata.entry_points(group="pytest11"))
    plugin = [] if registered else ["-p", "autograder.pytest_plugin"]
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin, *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)


def junit_items(path: Path) -> dict[str, Item]:
    """The testcases of a JUnit XML file by node id (`student::stage::check`), from their recorded properties."""
    items: dict[str, Item] = {}
    for case in ElementTree.parse(path).iter("testcase"):
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        student, stage, check = properties["student"], properties["stage"], properties["check"]
        assert (case.get("classname"), case.get("name")) == (f"{student}.{stage}", check)
        failure, skipped = case.find("failure"), case.find("skipped")
        outcome, message = PASSED, ""
        if failure is not None:
            outcome, message = FAILED, failure.get("message", "") + "\n" + (failure.text or "")
        elif skipped is not None:
            outcome, message = SKIPPED, skipped.get("message", "")
        nodeid = f"{student}::{stage}::{check}"
        assert nodeid not in items, f"{nodeid} twice"
        items[nodeid] = Item(outcome, float(properties["points"]), float(properties["max_points"]), message)
    return items


def with_kernel(notebook: Path, stage_id: str, kernel: str, target: Path) -> None:
    """A copy of `notebook` whose kernel cell of `stage_id` holds `kernel`."""
    book = nbformat.read(notebook, as_version=4)
    (index,) = [i for i, c in enumerate(book.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == stage_id]
    book.cells[index] = kernel_cell(stage_id, kernel)
    nbformat.write(book, target)


@pytest.fixture(scope="module")
def small_class(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("submissions")
    for student in ("bob", "grace"):
        shutil.copy(EXAMPLES / f"{student}.ipynb", folder / f"{student}.ipynb")
    racy_shuffle = (KNOWN / "shuffle_half_warp_mask.cu").read_text()
    with_kernel(EXAMPLES / "alice.ipynb", "shuffle", racy_shuffle, folder / "hank.ipynb")
    return folder


@pytest.fixture(scope="module")
def graded(small_class: Path, tmp_path_factory: pytest.TempPathFactory):
    """`pytest --grade` on the class: its run, its items from the JUnit XML, and its --grade-out folder."""
    out = tmp_path_factory.mktemp("pytest-results")
    xml = out / "junit.xml"
    # --grade=PATH: with a space, pytest's early look at the command line takes a path outside the repository for
    # the rootdir, and this test checks that the repository's own testpaths are not collected.
    done = run_pytest(f"--grade={small_class}", *ON_CPU, "--grade-out", str(out), f"--junitxml={xml}", "-q")
    return done, junit_items(xml), out


@pytest.fixture(scope="module")
def reference(small_class: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, StudentResult]]:
    """`autograder grade` on the same class with the same settings and seed."""
    out = tmp_path_factory.mktemp("grade-results")
    args = ["grade", str(small_class), "--out", str(out), "--backend", "cpu", "--quick", "--seed", str(SEED)]
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 0, done.output
    return out, {result.student: result for result in load_results(out)}


def verdict(stage: StageResult) -> str:
    """What a stage was graded, as JSON (a NaN that a kernel returned never equals itself), without durations."""
    graded = (stage.status, stage.message, stage.hint, stage.cases, stage.findings, stage.points)
    return json.dumps(to_dict(graded))


def stage_of(result: StudentResult, stage_id: str) -> StageResult:
    return next(stage for stage in result.stages if stage.stage == stage_id)


def test_one_item_per_student_stage_and_check_and_no_project_test(graded) -> None:
    done, items, _ = graded
    assert done.returncode == 1, done.stdout + done.stderr  # some items fail
    assert set(items) == {f"{s}::{stage}::{check}" for s in STUDENTS for stage in STAGE_IDS for check in CHECKS}
    ran = re.findall(r"(\d+) (?:failed|passed|skipped)", done.stdout.splitlines()[-1])
    assert sum(int(count) for count in ran) == len(items), done.stdout.splitlines()[-1]  # and no test of tests/


def test_items_pass_fail_or_skip_with_the_words_of_the_feedback_page(graded, reference) -> None:
    _, items, _ = graded
    _, results = reference
    bob_naive = stage_of(results["bob"], "naive")
    assert items["bob::naive::correct"].outcome == FAILED
    assert bob_naive.message in items["bob::naive::correct"].message
    assert f"hint: {bob_naive.hint}" in items["bob::naive::correct"].message
    assert items["bob::naive::races"].outcome == FAILED and "out of bounds" in items["bob::naive::races"].message
    # A terminal shows the findings as the result holds them: `g_in[1000]`, not Markdown's `g\_in\[1000\]`.
    assert all(" ".join(f.message.split()) in items["bob::naive::races"].message for f in bob_naive.findings)
    assert items["bob::open::correct"].outcome == SKIPPED  # the optional stage, not handed in
    hank_shuffle = items["hank::shuffle::correct"]
    assert (hank_shuffle.outcome, hank_shuffle.points, hank_shuffle.max_points) == (FAILED, 0.0, 10.0)
    assert "the kernel's result is undefined (inactive lane" in hank_shuffle.message  # though every case was right
    assert items["hank::shuffle::races"].outcome == FAILED and "inactive lane" in items["hank::shuffle::races"].message
    assert items["hank::shuffle::races"].points == 0.0  # no correctness points left to take a penalty from
    assert items["grace::unrolled_warp::correct"].outcome == FAILED
    assert "not attempted" in items["grace::unrolled_warp::correct"].message
    assert items["grace::unrolled_warp::races"].outcome == SKIPPED  # the kernel never ran
    speed = [item for nodeid, item in items.items() if nodeid.endswith("::speed")]
    assert {item.outcome for item in speed} == {SKIPPED}  # not measured on the CPU backend, and not counted
    assert "not measured on the CPU backend" in items["hank::naive::speed"].message


def test_the_points_add_up_to_the_totals_of_autograder_grade(graded, reference) -> None:
    _, items, _ = graded
    _, results = reference
    for student, result in results.items():
        mine = [item for nodeid, item in items.items() if nodeid.startswith(f"{student}::")]
        assert sum(item.points for item in mine) == result.total, student
        assert sum(item.max_points for item in mine) == result.max_total, student
        for stage in result.stages:
            checks = [items[f"{student}::{stage.stage}::{check}"] for check in CHECKS]
            assert stage.points is not None
            assert sum(item.points for item in checks) == stage.points.total, (student, stage.stage)
            assert sum(item.max_points for item in checks) == stage.points.max_points, (student, stage.stage)
    assert {student: results[student].total for student in STUDENTS} == {"bob": 50.0, "grace": 50.0, "hank": 60.0}


def test_grade_out_writes_the_results_of_autograder_grade(graded, reference) -> None:
    _, _, out = graded
    reference_out, results = reference
    mine = {result.student: result for result in load_results(out)}
    assert sorted(mine) == sorted(results)
    for student, result in results.items():
        assert [verdict(stage) for stage in mine[student].stages] == [verdict(stage) for stage in result.stages]
        assert mine[student].seed == SEED
    ours, theirs = pd.read_csv(out / "grades.csv"), pd.read_csv(reference_out / "grades.csv")
    pd.testing.assert_frame_equal(ours, theirs)


def test_the_terminal_shows_a_line_per_student_and_stage(graded) -> None:
    done, _, _ = graded
    for student in STUDENTS:
        for stage_id in STAGE_IDS:
            line = rf"^{student}\s+{stage_id}\s+\d+ / \d+\s+correct \w+, races \w+, technique \w+, speed \w+$"
            assert re.search(line, done.stdout, re.MULTILINE), (student, stage_id)
    assert re.search(r"^hank\s+total\s+60 / 70$", done.stdout, re.MULTILINE)
    assert f"--grade-seed {SEED}" in done.stdout


def test_k_selects_grades_only_whom_it_needs_and_xdist_gives_the_same_items(graded, small_class, tmp_path) -> None:
    _, everyone, _ = graded
    xml = tmp_path / "junit.xml"
    done = run_pytest("--grade", str(small_class), *ON_CPU, "--grade-out", str(tmp_path), f"--junitxml={xml}",
                      "-n", "2", "-k", "hank or grace")
    assert done.returncode == 1, done.stdout + done.stderr
    items = junit_items(xml)
    assert items == {nodeid: item for nodeid, item in everyone.items() if not nodeid.startswith("bob::")}
    assert sorted(path.name for path in tmp_path.glob("*.json")) == ["grace.json", "hank.json"]  # bob never graded
    assert list(pd.read_csv(tmp_path / "grades.csv")["student"]) == ["grace", "hank"]


def test_x_stops_at_the_first_failed_item(small_class) -> None:
    done = run_pytest("--grade", str(small_class / "bob.ipynb"), *ON_CPU, "-x")
    assert done.returncode == 1
    assert "1 failed" in done.stdout and "passed" not in done.stdout.splitlines()[-1]


def test_bad_grading_options_are_usage_errors(small_class) -> None:
    done = run_pytest("--grade", str(small_class / "nobody.ipynb"))
    assert done.returncode == pytest.ExitCode.USAGE_ERROR and "no such notebook" in done.stderr
    done = run_pytest("--grade", str(small_class), "--grade-backend", "gpu", "-n", "2")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR and "-n" in done.stderr


def _stage(status: Status, performance: Performance, points: Points) -> StageFigures:
    case = CaseResult("n=1 integers", (1,), "integers", 1.0, 1.0, status is Status.CORRECT)
    message = "correct: all 1 cases right" if status is Status.CORRECT else "wrong on 1 of 1 cases"
    record = StageResult("shuffle", status, message, cases=(case,), performance=performance, points=points)
    return StageFigures(get_stage("shuffle"), record, None, None)


def test_speed_passes_fails_or_is_skipped_as_it_counts() -> None:
    fast = Performance(PerfVerdict.FAST_ENOUGH, "1.10x over your unrolled_warp (needs 1.01x)")
    slow = Performance(PerfVerdict.TOO_SLOW, "0.90x over your unrolled_warp (needs 1.01x)")
    unmeasured = Performance(PerfVerdict.NOT_MEASURED, "the stage is not correct")
    on_cpu = Performance(PerfVerdict.NOT_MEASURED, "not measured on the CPU backend: speed is graded on a GPU")
    cases = [
        (_stage(Status.CORRECT, fast, Points(10, 5, 0, 10, 5)), PASSED, 5.0, 5.0),
        (_stage(Status.CORRECT, slow, Points(10, 0, 0, 10, 5)), FAILED, 0.0, 5.0),
        (_stage(Status.INCORRECT, unmeasured, Points(0, 0, 0, 10, 5)), FAILED, 0.0, 5.0),  # counted, not earned
        (_stage(Status.CORRECT, on_cpu, Points(10, 0, 0, 10, 0)), SKIPPED, 0.0, 0.0),
    ]
    for figures, outcome, points, maximum in cases:
        verdict = check_verdict("speed", figures)
        assert (verdict.outcome, verdict.points, verdict.max_points) == (outcome, points, maximum)
        assert figures.result is not None and figures.result.performance.reason in verdict.text


def test_classroom_tests_are_the_rubric_stages() -> None:
    classroom = json.loads((ROOT / "solutions/reduction/.github/classroom/autograding.json").read_text())
    assert classroom == build_notebook.classroom_tests(), "run solutions/reduction/build_notebook.py --release"
    worth = {stage: p.correctness + p.performance for stage, p in load_rubric().stages.items()}
    worth = {stage: points for stage, points in worth.items() if points}
    assert {test["run"].split()[-1]: test["points"] for test in classroom["tests"]} == worth
    assert sum(test["points"] for test in classroom["tests"]) == 100


def test_a_students_repository_grades_itself(small_class, tmp_path) -> None:
    """The release as a student's repository, with hank's hand-in: each Classroom test runs its stage's items."""
    repo = tmp_path / "repo"
    shutil.copytree(RELEASE, repo)
    shutil.copy(small_class / "hank.ipynb", repo / "reduction.ipynb")
    done = run_pytest("--collect-only", "-q", cwd=repo)  # `pytest` there: tests/conftest.py names the notebook
    assert done.returncode == 0, done.stdout + done.stderr
    names = {"reduction", *STAGE_IDS, *CHECKS}  # the node names `-k` matches, by substring
    expected = [f"reduction::{stage_id}::{check}" for stage_id in STAGE_IDS for check in CHECKS]
    assert re.findall(r"^reduction::\S+", done.stdout, re.MULTILINE) == expected
    tests = json.loads((repo / ".github/classroom/autograding.json").read_text())["tests"]
    for test in tests:  # `-k <stage id>` selects that stage's items and no other
        stage_id = shlex.split(test["run"])[-1]
        assert [name for name in names if stage_id in name] == [stage_id]
    (shuffle,) = [test for test in tests if test["run"].endswith("-k shuffle")]
    done = run_pytest(*shlex.split(shuffle["run"])[3:], *ON_CPU, cwd=repo)
    assert done.returncode == 1, done.stdout  # right, but undefined: Classroom gives the stage no points
    assert "FAILED reduction::shuffle::correct" in done.stdout and "FAILED reduction::shuffle::races" in done.stdout
    assert "2 failed, 1 passed, 1 skipped, 28 deselected" in done.stdout


@pytest.mark.gpu
def test_on_a_gpu_the_items_give_the_points_of_autograder_grade(small_class, tmp_path) -> None:
    """Speed counts here, and timings vary between two runs: the items must add up to their own run's results
    exactly, and to `autograder grade`'s except for the speed points of a stage whose verdict flipped between the
    runs (max2d sits at its threshold on an H200, EXPECTED.toml says)."""
    out, reference_out, xml = tmp_path / "pytest", tmp_path / "grade", tmp_path / "junit.xml"
    done = run_pytest(f"--grade={small_class}", "--grade-backend", "gpu", "--grade-seed", str(SEED),
                      "--grade-out", str(out), f"--junitxml={xml}")
    assert done.returncode == 1, done.stdout + done.stderr
    graded = CliRunner().invoke(cli, ["grade", str(small_class), "--out", str(reference_out), "--backend", "gpu",
                                      "--seed", str(SEED)])
    assert graded.exit_code == 0, graded.output
    items = junit_items(xml)
    mine = {result.student: result for result in load_results(out)}
    theirs = {result.student: result for result in load_results(reference_out)}
    for student in STUDENTS:
        assert sum(i.points for n, i in items.items() if n.startswith(f"{student}::")) == mine[student].total
        flipped = 0.0
        for stage in mine[student].stages:
            other = stage_of(theirs[student], stage.stage)
            assert stage.points is not None and other.points is not None
            assert (stage.status, stage.points.correctness, stage.points.penalty) == (
                other.status, other.points.correctness, other.points.penalty)
            if stage.performance.verdict is not other.performance.verdict:
                flipped += abs(stage.points.performance - other.points.performance)
            speed = items[f"{student}::{stage.stage}::speed"]
            if stage.status is Status.CORRECT:
                assert speed.outcome != SKIPPED  # timed and counted on a GPU
        assert abs(mine[student].total - theirs[student].total) <= flipped, student


def test_hand_ins_of_the_same_name_each_get_their_own_result(tmp_path) -> None:
    """GitHub Classroom clones all hold `reduction.ipynb`; two sections may both have an `alice.ipynb`."""
    repos, sections = tmp_path / "repos", tmp_path / "sections"
    for place in (repos / "alice-repo", repos / "frank-repo", sections / "sec1", sections / "sec2"):
        place.mkdir(parents=True)
    shutil.copy(EXAMPLES / "alice.ipynb", repos / "alice-repo" / "reduction.ipynb")
    shutil.copy(EXAMPLES / "frank.ipynb", repos / "frank-repo" / "reduction.ipynb")
    shutil.copy(EXAMPLES / "frank.ipynb", sections / "sec1" / "alice.ipynb")
    shutil.copy(EXAMPLES / "alice.ipynb", sections / "sec2" / "alice.ipynb")
    out = tmp_path / "out"
    paths = (repos / "frank-repo" / "reduction.ipynb", repos / "alice-repo" / "reduction.ipynb", sections / "sec1",
             sections / "sec2")
    done = run_pytest(*(f"--grade={path}" for path in paths), *ON_CPU, "--grade-out", str(out), "-k", "correct")
    assert done.returncode == 1, done.stdout + done.stderr  # frank's first_add does not compile
    totals = {result.student: result.total for result in load_results(out)}
    assert totals == {"alice-repo-reduction": 70.0, "frank-repo-reduction": 60.0, "sec1-alice": 60.0,
                      "sec2-alice": 70.0}
    assert re.findall(r"^FAILED (\S+?)::", done.stdout, re.MULTILINE) == ["frank-repo-reduction", "sec1-alice"]


def test_hand_ins_whose_names_cannot_be_told_apart_are_refused(tmp_path) -> None:
    for section in ("a", "b"):
        (tmp_path / section / "x").mkdir(parents=True)
        shutil.copy(EXAMPLES / "alice.ipynb", tmp_path / section / "x" / "reduction.ipynb")
    done = run_pytest(*(f"--grade={tmp_path / s / 'x' / 'reduction.ipynb'}" for s in ("a", "b")), *ON_CPU)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    assert "both hold a hand-in named 'x-reduction'; grade them in separate runs" in done.stderr
