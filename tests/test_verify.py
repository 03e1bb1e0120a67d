from __future__ import annotations

import numpy as np
import pytest

from autograder.records import CaseResult
from autograder.stages import STAGES, Shape, get_stage
from autograder.verify import QUICK_LIMIT, Case, analysis_cases, correctness_cases, hint, judge, make_input, reference

SUM = get_stage("sequential")
MAX = get_stage("max2d")


def test_cases_cover_the_edge_sizes_and_both_input_kinds() -> None:
    cases = correctness_cases(SUM, seed=7)
    sizes = {case.size[0] for case in cases}
    assert {1, 31, 32, 33, 255, 256, 257, 1000, 65535, 1_000_003} <= sizes and max(sizes) > 4_000_000
    assert {case.input_kind for case in cases} == {"integers", "random"}
    assert {case.input_kind for case in correctness_cases(MAX, seed=7)} == {"random", "negative"}
    assert max(case.count for case in correctness_cases(SUM, seed=7, quick=True)) <= 1 << 17


@pytest.mark.parametrize("seed", [1, 2, 12345])
def test_a_gpu_runs_race_analysis_sees_the_drawn_sizes_up_to_two_passes(seed: int) -> None:
    # Every size drawn from the seed up to QUICK_LIMIT (below a block, a few blocks, two passes above 65536) and
    # the fixed partial block and two passes: a kernel cannot keep a race to the sizes between the fixed ones.
    for stage in STAGES:
        drawn = [case for case in correctness_cases(stage, seed) if case.seeded and case.input_kind != "random"]
        analysed = analysis_cases(stage, seed)
        assert [case for case in drawn if case.count <= QUICK_LIMIT] == [case for case in analysed if case.seeded]
        assert len({case.size for case in analysed if case.seeded}) == 3, stage.id
        if stage.shape is Shape.SUM_1D:
            assert max(case.count for case in analysed) > 65536, stage.id
        assert all(case.input_kind != "random" for case in analysed)


def test_inputs_follow_the_seed() -> None:
    first, second = correctness_cases(SUM, seed=1)[5], correctness_cases(SUM, seed=2)[5]
    assert np.array_equal(make_input(first), make_input(correctness_cases(SUM, seed=1)[5]))
    assert not np.array_equal(make_input(first), make_input(second))


def test_a_drawn_input_is_drawn_once_and_read_only() -> None:
    """A worker serves every stage and many students one input per case: none of them can change it."""
    case = correctness_cases(SUM, seed=1)[-1]
    data = make_input(case)
    assert make_input(case) is data and not data.flags.writeable
    with pytest.raises(ValueError):
        data[0] = 1.0


def test_integer_inputs_are_checked_exactly() -> None:
    case = Case((1000,), "integers", seed=3)
    expected, tolerance = reference(SUM, make_input(case), 256)
    assert tolerance == 0.0
    assert judge(SUM, case, expected, 256).passed
    assert not judge(SUM, case, expected + 1.0, 256).passed


def test_random_inputs_allow_float32_rounding_but_not_rescaled_partial_sums() -> None:
    case = Case((1_000_003,), "random", seed=4)
    data = make_input(case)
    float32_sum = float(np.sum(data, dtype=np.float32))
    assert judge(SUM, case, float32_sum, 256).passed
    # Half the elements, doubled: the offset inputs make the error far larger than rounding.
    assert not judge(SUM, case, 2.0 * float(data[::2].astype(np.float64).sum()), 256).passed


def test_a_dropped_element_fails_exactly_on_integers_at_any_size() -> None:
    # Among random floats a single element can hide in float32 rounding at a million elements; the
    # integer-valued case of the same size is what catches it.
    case = Case((1_000_003,), "integers", seed=4)
    data = make_input(case)
    expected, _ = reference(SUM, data, 256)
    nonzero = int(np.flatnonzero(data)[0])
    assert not judge(SUM, case, expected - float(data[nonzero]), 256).passed
    small = Case((1000,), "random", seed=4)
    small_data = make_input(small)
    assert not judge(SUM, small, reference(SUM, small_data, 256)[0] - float(small_data[10]), 256).passed


def test_nan_and_missing_results_fail() -> None:
    case = Case((33,), "integers", seed=5)
    assert not judge(SUM, case, float("nan"), 256).passed
    assert not judge(SUM, case, None, 256, error="timed out").passed


def results(stage, sizes_failed: set, kinds=("integers", "random"), sizes=(1, 255, 256, 257, 512, 1000, 65536)):
    return tuple(
        CaseResult(f"n={n} {k}", (n,), k, 1.0, 1.0 if n not in sizes_failed else 2.0, n not in sizes_failed)
        for n in sizes
        for k in kinds
    )


def test_hint_for_a_missing_bounds_check() -> None:
    text = hint(SUM, results(SUM, {1, 255, 257, 1000}), 256)
    assert "not a multiple of 256" in text and "bounds" in text


def test_hint_for_a_race_that_shows_only_at_scale() -> None:
    text = hint(SUM, results(SUM, {65536}), 256)
    assert "from there" in text and "__syncthreads" in text


def test_hint_for_nan() -> None:
    cases = results(SUM, set())[:-1] + (CaseResult("n=65536 random", (65536,), "random", 1.0, float("nan"), False),)
    assert "NaN" in hint(SUM, cases, 256)


def test_hint_for_a_max_that_starts_from_zero() -> None:
    cases = tuple(
        CaseResult(f"{w}x{h} {k}", (w, h), k, -1.0, 0.0 if k == "negative" else -1.0, k != "negative")
        for (w, h) in ((3, 3), (32, 32))
        for k in ("random", "negative")
    )
    assert "-INFINITY" in hint(MAX, cases, 256)


def test_no_hint_when_everything_passed() -> None:
    assert hint(SUM, results(SUM, set()), 256) is None


def test_a_race_comes_before_the_size_pattern() -> None:
    from autograder.records import Finding

    race = (Finding("race_syncthreads", "sdata[32] written and read unordered", line=17),)
    text = hint(SUM, results(SUM, {1, 255, 257, 1000}), 256, race)
    assert "data race reported at line 17" in text


def test_a_barrier_that_part_of_the_block_skips_comes_before_the_size_pattern() -> None:
    from autograder.records import Finding

    divergent = (Finding("barrier_divergence", "__syncthreads() on line 12 was reached by only 128", line=12),)
    text = hint(SUM, results(SUM, {1, 255, 257, 1000}), 256, divergent)
    assert "__syncthreads() at line 12" in text and "part of the block" in text
