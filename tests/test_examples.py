"""The example class, graded end to end through `grade_class`, gets the verdicts written in EXPECTED.toml.

On the CPU backend in CI; on the GPU (gpu-marked) where there is one, with speed verdicts too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from expectations import EXAMPLES, expected_class, mismatches

from autograder.batch import grade_class
from autograder.grade import GradeOptions
from autograder.records import StudentResult, from_dict, to_dict

EXPECTED = expected_class()


def graded(tmp_path_factory: pytest.TempPathFactory, backend: str) -> tuple[Path, dict[str, StudentResult]]:
    out = tmp_path_factory.mktemp(f"results-{backend}")
    run = grade_class(EXAMPLES, out, GradeOptions(backend=backend))
    assert run.failures == ()
    return out, {result.student: result for result in run.results}


@pytest.fixture(scope="module")
def cpu_class(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, StudentResult]]:
    return graded(tmp_path_factory, "cpu")


@pytest.fixture(scope="module")
def gpu_class(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, StudentResult]]:
    return graded(tmp_path_factory, "gpu")


def check_student(results: dict[str, StudentResult], student: str, backend: str) -> None:
    result = results[student]
    assert result.device.backend == backend
    problems = {
        stage.stage: mismatches(stage, EXPECTED[student][stage.stage], backend)
        for stage in result.stages
        if mismatches(stage, EXPECTED[student][stage.stage], backend)
    }
    assert problems == {}, f"{student}: {EXPECTED[student]['shows']}"


@pytest.mark.parametrize("student", sorted(EXPECTED))
def test_each_example_gets_its_written_verdicts_on_the_cpu(cpu_class, student: str) -> None:
    check_student(cpu_class[1], student, "cpu")


def test_the_class_results_are_written_and_read_back(cpu_class) -> None:
    out, results = cpu_class
    for student, result in results.items():
        # Compared as JSON: a NaN that a kernel returned never equals itself.
        back = from_dict(StudentResult, json.loads((out / f"{student}.json").read_text()))
        assert json.dumps(to_dict(back)) == json.dumps(to_dict(result))
    table = pd.read_csv(out / "grades.csv")
    assert sorted(table["student"]) == sorted(EXPECTED)
    assert table.set_index("student")["total"].to_dict() == {s: r.total for s, r in results.items()}
    assert len({r.seed for r in results.values()}) == 1  # one secret seed per run, recorded


def test_the_complete_hand_in_gets_full_marks_on_the_cpu(cpu_class) -> None:
    complete = cpu_class[1]["alice"]
    assert complete.total == complete.max_total == 70


@pytest.mark.gpu
@pytest.mark.parametrize("student", sorted(EXPECTED))
def test_each_example_gets_its_written_verdicts_on_the_gpu(gpu_class, student: str) -> None:
    check_student(gpu_class[1], student, "gpu")


@pytest.mark.gpu
def test_the_complete_hand_in_gets_full_marks_on_the_gpu(gpu_class) -> None:
    complete = gpu_class[1]["alice"]
    assert complete.total == complete.max_total == 100


@pytest.mark.gpu
def test_grading_twice_gives_the_same_points(gpu_class, tmp_path: Path) -> None:
    again = grade_class(EXAMPLES, tmp_path, GradeOptions(backend="gpu"))
    assert {r.student: r.total for r in again.results} == {s: r.total for s, r in gpu_class[1].items()}
