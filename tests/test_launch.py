from __future__ import annotations

from autograder.launch import launch_geometry, output_count, pass_sizes
from autograder.stages import get_stage


def test_one_element_per_thread_until_one_value_remains() -> None:
    stage = get_stage("sequential")
    assert pass_sizes(stage, (2**26,), 256) == [(2**26,), (262144,), (1024,), (4,)]
    assert pass_sizes(stage, (1,), 256) == [(1,)]
    assert pass_sizes(stage, (257,), 256) == [(257,), (2,)]


def test_first_add_launches_half_the_blocks() -> None:
    assert launch_geometry(get_stage("first_add"), (2**26,), 256) == ((131072, 1), (256, 1), 1024)
    assert launch_geometry(get_stage("sequential"), (2**26,), 256) == ((262144, 1), (256, 1), 1024)


def test_max2d_halves_both_sides_rounding_up_until_one_by_one() -> None:
    stage = get_stage("max2d")
    assert pass_sizes(stage, (5, 1), 256) == [(5, 1), (3, 1), (2, 1)]
    assert pass_sizes(stage, (1, 1), 256) == [(1, 1)]
    assert output_count(stage, (31, 33), 256) == 16 * 17
    grid, block, shared = launch_geometry(stage, (8192, 8192), 256)
    assert block == (32, 8) and grid == (128, 512) and shared == 0
