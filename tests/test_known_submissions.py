"""Known-wrong kernels and cheats (tests/known) and the reference kernels, each graded as a stage.

Every case is a real kernel run through the whole stage pipeline: compile, verify in a worker with time limits,
check for races and bounds, score.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from expectations import KNOWN, known_cases, mismatches

from autograder.grade import GradeOptions, grade_stages
from autograder.isolation import Worker
from autograder.records import KernelSource, Status
from autograder.references import reference_source
from autograder.stages import STAGE_IDS

CASES = known_cases()
# Short limits: the hanging cases must not cost minutes each.
OPTIONS = GradeOptions(case_seconds=5.0, per_element_seconds=1e-6, measure_speed=False)


@pytest.fixture(scope="module", params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def worker(request: pytest.FixtureRequest):
    with Worker(request.param) as worker:
        yield worker


def grade_one(worker: Worker, stage: str, text: str):
    options = replace(OPTIONS, backend=worker.backend_name)
    (result,) = grade_stages({stage: KernelSource(text=text)}, only=[stage], options=options, worker=worker)
    return result


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_known_submission_gets_its_verdict(worker: Worker, case: dict) -> None:
    # On the GPU the findings are the CPU analysis's and compute-sanitizer's: `findings_gpu` says where they differ.
    result = grade_one(worker, case["stage"], (KNOWN / case["file"]).read_text())
    assert mismatches(result, case | {"perf": None}, worker.device.backend) == [], case["why"]


@pytest.mark.parametrize("stage", STAGE_IDS)
def test_reference_kernels_are_correct_and_clean(worker: Worker, stage: str) -> None:
    result = grade_one(worker, stage, reference_source(stage).text)
    assert result.status is Status.CORRECT, result.message
    assert result.findings == ()
    assert result.points.total == result.points.max_points  # speed is not measured here: correctness only
