"""The launch contract (autograder.launch): passes, geometry, and a checked run on every backend."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from autograder.backends import create_backend
from autograder.backends.base import Backend
from autograder.launch import Plan, launch_geometry, output_count, pass_sizes
from autograder.records import KernelSource
from autograder.references import reference_source
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


# --- a checked run, on every backend ---------------------------------------------------------------------------


def straying() -> KernelSource:
    """The reference sequential kernel, also writing one value past its output on every pass, and the value after
    its input."""
    text = reference_source("sequential").text
    store = "        g_out[blockIdx.x] = sdata[0];\n"
    assert store in text
    strays = "        g_out[gridDim.x + blockIdx.x] = 1.0f;\n        if (i == 0) ((float *)g_in)[n] = 2.0f;\n"
    text = text.replace(store, store + strays)
    return KernelSource(text)


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def backend(request: pytest.FixtureRequest, cache_dir: Path) -> Iterator[Backend]:
    if request.param == "cpu" and shutil.which("g++") is None:
        pytest.skip("the CPU backend needs g++")
    made = create_backend(request.param, cache_dir=cache_dir)
    yield made
    made.close()


def test_a_checked_run_names_every_pass_that_wrote_past_its_output_and_a_changed_input(backend: Backend) -> None:
    """Each pass's output guard is judged as that pass left it, though the run waits for the device only at its
    end (the next pass's input guard is written over it on the device first); so is the input, after the last."""
    stage = get_stage("sequential")
    kernel = backend.compile(straying(), stage)
    n = 65537
    data = np.arange(n, dtype=np.float32) % 4
    plan = Plan.create(backend, kernel, (n,), 256)
    try:
        plan.load(data)
        findings = plan.run(check_each_pass=True)
        assert plan.result() == data.sum()  # every pass read only its n values: the guards stayed out of the sum
    finally:
        plan.release()
    assert [(finding.kind, finding.message.split(",")[0]) for finding in findings] == [
        ("output_guard", "pass 1 wrote g_out[257]"),
        ("output_guard", "pass 2 wrote g_out[2]"),
        ("output_guard", "pass 3 wrote g_out[1]"),
        ("input_changed", f"the kernel changed its input g_in (first at index {n}"),
    ]
    assert "1 values in all" in findings[-1].message


def test_copy_moves_values_between_buffers_after_what_is_queued(backend: Backend) -> None:
    source, target = backend.alloc(6, guard=2), backend.alloc(4)
    try:
        backend.write(source, np.arange(8, dtype=np.float32))
        backend.fill(target, -1.0)
        backend.copy(source, target, 3, start=5, to=1)
        assert backend.download(target).tolist() == [-1.0, 5.0, 6.0, 7.0]
    finally:
        backend.free(source)
        backend.free(target)
