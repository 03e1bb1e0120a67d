from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from autograder.errors import ConfigError
from autograder.pipeline.sanitize import unsafe
from autograder.pipeline.verdict import undefined_end
from autograder.pipeline.work import Phases, StageWork
from autograder.records import Build, Finding, KernelSource, Performance, PerfVerdict, StageResult, Status, Timing
from autograder.rubric import DEFAULT_RUBRIC, judge_speed, load_rubric, score
from autograder.stages import STAGE_IDS, get_stage

FAST = Performance(PerfVerdict.FAST_ENOUGH, "1.30x over your naive (needs 1.27x)")
SLOW = Performance(PerfVerdict.TOO_SLOW, "1.01x over your naive (needs 1.27x)")


def test_default_rubric_gives_points_to_every_stage() -> None:
    rubric = load_rubric()
    assert set(rubric.stages) == set(STAGE_IDS)
    assert rubric.block_size == 256 and rubric.timing.n == 2**26
    required = sum(p.correctness + p.performance for s, p in rubric.stages.items() if s != "open")
    assert required == 100


def test_required_speedup_is_half_the_reference_gain() -> None:
    rubric = load_rubric()
    assert rubric.required_speedup(1.59) == pytest.approx(1.295)
    assert rubric.required_speedup(None) is None


def test_correct_and_fast_gets_everything() -> None:
    points = score(load_rubric(), "sequential", Status.CORRECT, 32, 32, (), FAST, performance_measured=True)
    assert (points.correctness, points.performance, points.penalty, points.total, points.max_points) == (
        10,
        5,
        0,
        15,
        15,
    )
    assert points.lines[0].startswith("correctness 10/10: 32 of 32")


def test_slow_loses_only_performance() -> None:
    points = score(load_rubric(), "sequential", Status.CORRECT, 32, 32, (), SLOW, performance_measured=True)
    assert points.total == 10 and "needs 1.27x" in points.lines[1]


def test_incorrect_gets_no_performance_points_even_if_fast() -> None:
    points = score(load_rubric(), "shuffle", Status.INCORRECT, 30, 32, (), FAST, performance_measured=True)
    assert points.total == 0 and points.max_points == 15


def test_on_the_cpu_backend_performance_is_not_counted_in_the_maximum() -> None:
    not_measured = Performance(PerfVerdict.NOT_MEASURED, "not measured on the CPU backend")
    points = score(load_rubric(), "shuffle", Status.CORRECT, 32, 32, (), not_measured, performance_measured=False)
    assert (points.total, points.max_points) == (10, 10)
    assert "not measured on the CPU backend" in points.lines[-1]


def test_a_race_costs_what_the_rubric_says() -> None:
    race = (Finding("race_syncwarp", "lanes 0 and 16 race", line=12),)
    points = score(load_rubric(), "unrolled_warp", Status.CORRECT, 32, 32, race, FAST, performance_measured=True)
    assert points.penalty == 5 and points.total == 10
    assert "race_syncwarp" in points.lines[-1]


def test_a_barrier_that_part_of_the_block_skips_costs_what_a_race_costs() -> None:
    rubric = load_rubric()
    assert rubric.penalties["barrier_divergence"] == rubric.penalties["race_syncthreads"] > 0
    divergent = (Finding("barrier_divergence", "__syncthreads() on line 9 was reached by only 128", line=9),)
    points = score(rubric, "sequential", Status.CORRECT, 32, 32, divergent, FAST, performance_measured=True)
    assert points.penalty == 5 and "barrier_divergence" in points.lines[-1]


def test_penalties_add_up_to_at_most_the_correctness_points() -> None:
    findings = (Finding("deadlock", "x"), Finding("race_syncthreads", "y"))
    points = score(load_rubric(), "naive", Status.CORRECT, 32, 32, findings, FAST, performance_measured=True)
    assert points.penalty == 10 and points.total == 0


def test_bad_rubrics_say_what_is_wrong(tmp_path: Path) -> None:
    text = DEFAULT_RUBRIC.read_text()
    cases = {
        "block_size = 256": ("block_size = 100", "block_size must be one of"),
        "[stages.open]": ("[stages.opn]", "unknown stages"),
        "deadlock = 1.0": ("deadlocks = 1.0", "unknown finding kinds"),
    }
    for original, (replacement, message) in cases.items():
        path = tmp_path / "rubric.toml"
        path.write_text(text.replace(original, replacement))
        with pytest.raises(ConfigError, match=message):
            load_rubric(path)
    path.write_text("block_size = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_rubric(path)
    with pytest.raises(ConfigError, match="no such rubric"):
        load_rubric(tmp_path / "missing.toml")


def timing(label: str, micros: float) -> Timing:
    return Timing(label, micros / 1000, 0.002, 10, 1.0)


def test_speed_needs_the_required_speedup_and_the_reference_time() -> None:
    rubric = load_rubric()  # half the reference's gain, within 1.25x of the reference, 0.02 tolerance
    fast = judge_speed(rubric, (timing("yours", 316), timing("your x", 407), timing("ref", 316)), "your x", 1.29)
    assert fast.verdict is PerfVerdict.FAST_ENOUGH and fast.speedup == pytest.approx(407 / 316)
    assert fast.required_speedup == pytest.approx(1.145)
    no_gain = judge_speed(rubric, (timing("yours", 400), timing("your x", 407), timing("ref", 316)), "your x", 1.29)
    assert no_gain.verdict is PerfVerdict.TOO_SLOW and "needs 1.15x" in no_gain.reason


def test_a_slow_previous_stage_cannot_inflate_the_speedup() -> None:
    # 3x over a deliberately slow previous stage, but 1.3x the reference's time.
    result = judge_speed(load_rubric(), (timing("yours", 410), timing("your x", 1230), timing("ref", 316)), "x", 1.29)
    assert result.verdict is PerfVerdict.TOO_SLOW and result.time_vs_reference == pytest.approx(410 / 316)


def test_a_shortfall_within_the_tolerance_still_counts() -> None:
    # The H200's quadrant max2d gains nothing over its baseline (step 0.99): parity within drift is enough.
    result = judge_speed(load_rubric(), (timing("yours", 141), timing("b", 138.5), timing("ref", 140.6)), "b", 0.99)
    assert result.verdict is PerfVerdict.FAST_ENOUGH
    assert (
        judge_speed(load_rubric(), (timing("yours", 145), timing("b", 138.5), timing("ref", 140.6)), "b", 0.99).verdict
        is PerfVerdict.TOO_SLOW
    )


def test_the_first_stage_has_no_speedup_only_the_reference_time() -> None:
    result = judge_speed(load_rubric(), (timing("yours", 700), timing("ref", 648)), None, None)
    assert result.speedup is None and result.verdict is PerfVerdict.FAST_ENOUGH


# --- a crash or a hang with a finding of undefined behaviour ---------------------------------------------------


def ended(status: Status, *kinds: str) -> StageResult:
    findings = tuple(Finding(kind, f"a {kind}", line=12) for kind in kinds)
    return StageResult("sequential", status, f"{status.value} on n=1 integers: why", findings=findings)


@pytest.mark.parametrize(("status", "did"), [(Status.CRASHED, "crashed"), (Status.TIMEOUT, "hung")])
def test_a_crash_or_a_hang_with_a_finding_of_undefined_behaviour_is_incorrect(status: Status, did: str) -> None:
    judged = undefined_end(load_rubric(), ended(status, "out_of_bounds", "race_syncthreads"))
    assert judged.status is Status.INCORRECT
    assert judged.message.startswith("incorrect: the kernel's result is undefined (out of bounds, race syncthreads at")
    assert f"here it {did} ({status.value} on n=1 integers: why)" in judged.message
    assert judged.hint


def test_a_crash_or_a_hang_stays_one_without_such_a_finding_or_under_the_penalty_rubric() -> None:
    rubric = load_rubric()
    for result in (ended(Status.CRASHED), ended(Status.TIMEOUT, "deadlock"), ended(Status.INCORRECT, "out_of_bounds")):
        assert undefined_end(rubric, result) == result
    crashed = ended(Status.CRASHED, "race_syncthreads")
    assert undefined_end(replace(rubric, undefined="penalty"), crashed) == crashed


def test_a_kernel_made_incorrect_after_a_crash_is_still_one_that_crashed_for_its_workers() -> None:
    """Its main worker is not kept and compute-sanitizer runs it in sessions of the student's own
    (pipeline.sanitize.unsafe), as for any kernel that crashed or hung."""
    source = KernelSource("// a kernel")
    build = Build("cpu", "sequential", source, (), ())
    for how in (Status.CRASHED, Status.TIMEOUT):
        result = undefined_end(load_rubric(), ended(how, "race_syncthreads"))
        work = StageWork(get_stage("sequential"), source, build, result, Phases(lambda: 0.0), None, None, how)
        assert result.status is Status.INCORRECT and work.ran_as is how and unsafe(work)
