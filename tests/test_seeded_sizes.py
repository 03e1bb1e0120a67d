"""Correctness sizes drawn from the run's secret seed, besides the fixed edge sizes, and the input check.

A kernel that is right only on the published sizes must fail; the same seed must always give the same cases;
a kernel that writes its read-only input must fail on every backend with a message that says so.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from autograder.grade import GradeOptions, grade_stages
from autograder.publish import feedback
from autograder.records import (
    CaseResult,
    DeviceInfo,
    KernelSource,
    StageResult,
    Status,
    StudentResult,
    from_dict,
    to_dict,
)
from autograder.stages import MAX2D_SHAPES, SUM_SIZES, get_stage
from autograder.verify import QUICK_LIMIT, correctness_cases, seeded_sizes

KNOWN = Path(__file__).parent / "known"
SUM, FIRST_ADD, MAX = get_stage("sequential"), get_stage("first_add"), get_stage("max2d")
cpu_only = pytest.mark.skipif(shutil.which("g++") is None, reason="the CPU backend needs g++")


def drawn(cases) -> list[tuple[int, ...]]:
    return sorted({case.size for case in cases if case.seeded})


def test_the_fixed_sizes_stay_and_odd_sizes_are_drawn_around_the_block_and_above_2_to_the_20() -> None:
    cases = correctness_cases(SUM, seed=7)
    assert {(n,) for n in SUM_SIZES} <= {case.size for case in cases}
    sizes = [size[0] for size in drawn(cases)]
    assert all(n % 2 for n in sizes)
    below, between, passes, large = sizes
    assert 1 < below < 256 and 512 < between < 1 << 16 and 1 << 16 < passes < QUICK_LIMIT < large <= 3 << 20
    # first_add's block covers twice the elements.
    assert 1024 < [s[0] for s in drawn(correctness_cases(FIRST_ADD, seed=7))][1] < 1 << 16
    shapes = drawn(correctness_cases(MAX, seed=7))
    assert len(shapes) == 4 and all(side % 2 for shape in shapes for side in shape)
    assert set(MAX2D_SHAPES) <= {case.size for case in correctness_cases(MAX, seed=7)}


def test_the_same_seed_always_gives_the_same_cases() -> None:
    assert correctness_cases(SUM, seed=7) == correctness_cases(SUM, seed=7)
    assert drawn(correctness_cases(SUM, seed=7)) != drawn(correctness_cases(SUM, seed=8))
    # Pinned: the sizes come from SHA-256 of the seed, not from a generator whose stream may change.
    assert seeded_sizes(SUM, 12345, 256) == [(105,), (30415,), (123081,), (450367,)]
    assert seeded_sizes(MAX, 12345, 256) == [(39, 33), (241, 31), (23, 219), (689, 999)]


def test_no_window_of_sizes_between_the_published_ones_is_safe_from_the_draws() -> None:
    # A kernel wrong only for 20000 <= n <= 60000, for n between 2^17 and 2^20, or for a max2d width from 1536 to
    # 8191, used to pass every seed; now about one run in five or more draws each window.
    sums = [[n for (n,) in seeded_sizes(SUM, seed, 256)] for seed in range(200)]
    for low, high in ((20_000, 60_000), (QUICK_LIMIT, 1 << 20), (2 << 20, 3 << 20)):
        assert sum(any(low <= n <= high for n in sizes) for sizes in sums) > 20, (low, high)
    widths = [seeded_sizes(MAX, seed, 256)[3][0] for seed in range(200)]
    assert sum(1536 <= width <= 8191 for width in widths) > 40
    assert max(w * h for w, h in (seeded_sizes(MAX, seed, 256)[3] for seed in range(200))) <= 1535 * 1535


def test_a_quick_check_keeps_the_drawn_sizes_below_its_limit() -> None:
    quick = correctness_cases(SUM, seed=7, quick=True)
    assert max(case.count for case in quick) <= QUICK_LIMIT
    assert len(drawn(quick)) == 3
    assert [case.count for case in quick] == sorted(case.count for case in quick)


@cpu_only
def test_a_kernel_right_only_on_the_published_sizes_fails_on_the_drawn_ones() -> None:
    text = (KNOWN / "right_only_on_published_sizes.cu").read_text()
    options = GradeOptions(backend="cpu", seed=3, quick=True, measure_speed=False)
    (result,) = grade_stages({"sequential": KernelSource(text)}, only=["sequential"], options=options)
    assert result.status is Status.INCORRECT
    failed = [case for case in result.cases if not case.passed]
    assert failed and all(case.seeded for case in failed)
    assert all(case.passed for case in result.cases if not case.seeded)
    # The results record the drawn sizes, and the feedback page names them.
    back = from_dict(StageResult, json.loads(json.dumps(to_dict(result))))
    assert [case.seeded for case in back.cases] == [case.seeded for case in result.cases]
    student = StudentResult("ada", "ada.ipynb", 3, "now", DeviceInfo("cpu", "CPU"), "rubric.toml", (result,))
    section = next(s for s in feedback.build_page(student).sections if s.heading.startswith("3."))
    assert section.drawn and all(str(case.size[0]) in section.drawn for case in failed)


@cpu_only
def test_a_kernel_that_writes_its_input_fails_every_case_that_shows_it_and_says_why() -> None:
    text = (KNOWN / "input_in_place_tree.cu").read_text()
    options = GradeOptions(backend="cpu", seed=3, quick=True, measure_speed=False)
    (result,) = grade_stages({"sequential": KernelSource(text)}, only=["sequential"], options=options)
    assert result.status is Status.INCORRECT
    assert all(case.got == case.expected for case in result.cases if case.input_kind == "integers")  # sums right
    changed = [case for case in result.cases if not case.passed]
    assert changed and all("the kernel changed its input g_in (first at index" in case.error for case in changed)
    assert "read-only (const float *)" in changed[0].error
    assert "changed its input g_in" in result.message
    assert result.hint.startswith("leave g_in as it was")
    assert [finding.kind for finding in result.findings] == ["input_changed"]


def test_a_case_result_written_before_sizes_were_drawn_still_loads() -> None:
    data = {"label": "n=1 integers", "size": [1], "input_kind": "integers", "expected": 1.0, "got": 1.0,
            "passed": True, "error": None}
    assert from_dict(CaseResult, data).seeded is False
