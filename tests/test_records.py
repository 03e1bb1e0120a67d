from __future__ import annotations

import json

from autograder.pipeline.work import joined
from autograder.records import (
    CaseResult,
    CompilerMessage,
    DeviceInfo,
    Finding,
    Performance,
    PerfVerdict,
    Points,
    StageResult,
    Status,
    StudentResult,
    Timing,
    from_dict,
    merged,
    to_dict,
)


def sample() -> StudentResult:
    stage = StageResult(
        stage="sequential",
        status=Status.CORRECT,
        message="correct",
        compiler=(CompilerMessage("warning", 4, "unused variable"),),
        cases=(CaseResult("n=1 integers", (1,), "integers", 3.0, 3.0, True),),
        findings=(Finding("race_syncwarp", "lanes 0 and 16", 12, "block 0 thread 0", "reduce_sequential"),),
        performance=Performance(
            PerfVerdict.FAST_ENOUGH,
            "ok",
            (Timing("yours", 0.41, 0.002, 20, 650.0),),
            1.3,
            "your naive",
            1.15,
            1.01,
            1.25,
        ),
        points=Points(10, 5, 0, 10, 5, ("correctness 10/10",)),
    )
    return StudentResult(
        student="ada",
        notebook="ada.ipynb",
        seed=42,
        started="2026-11-21T10:00:00Z",
        device=DeviceInfo("gpu", "NVIDIA H200", "9.0", 62914560, (("pycuda", "2026.1"),)),
        rubric="rubric.toml",
        stages=(stage, StageResult("naive", Status.NOT_ATTEMPTED, "not attempted")),
    )


def test_a_result_survives_json_both_ways() -> None:
    result = sample()
    text = json.dumps(to_dict(result))
    back = from_dict(StudentResult, json.loads(text))
    assert back == result
    assert back.stages[0].performance.timings[0].median_ms == 0.41
    assert back.total == 15 and back.max_total == 15


def test_enums_are_written_by_value() -> None:
    data = to_dict(sample())
    assert data["stages"][0]["status"] == "correct"
    assert data["stages"][0]["performance"]["verdict"] == "fast_enough"


def test_findings_of_one_line_stand_for_a_write_where_any_checker_saw_one() -> None:
    read = Finding("out_of_bounds", "thread (0,0,0) reads g_in[1000]", 7, reads_only=True)
    write = Finding("out_of_bounds", "thread (0,0,0) writes g_out[4]", 7)  # or a checker that cannot tell
    assert merged(None, read) is read and merged(read, read) is read
    assert merged(read, write) is write and merged(write, read) is write
    for order in ((read, write), (write, read)):
        [finding] = joined(*((f,) for f in order))
        assert finding is write
    assert joined((read,), (Finding("out_of_bounds", "elsewhere", 8, reads_only=True),)) == (
        read,
        Finding("out_of_bounds", "elsewhere", 8, reads_only=True),
    )
