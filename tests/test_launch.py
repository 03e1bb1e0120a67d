"""The launch contract (autograder.launch): passes, geometry, and a checked run on every backend."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from autograder.backends import create_backend
from autograder.backends.base import Backend
from autograder.build import Builder
from autograder.launch import Plan, expect, launch_geometry, output_count, pass_sizes
from autograder.records import KernelSource
from autograder.references import reference_source
from autograder.sandbox import Sandbox
from autograder.stages import get_stage
from autograder.verify import correctness_cases, draw, first_pass, make_input, reference, run_case


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


# --- each pass held to the contract, whatever the final value -------------------------------------------------


def tree_kernel(stage_id: str, load: str, store: str = "g_out[blockIdx.x]") -> KernelSource:
    """A kernel of the stage that puts `load` into slot tid of the shared array, folds it as stage 3 does and has
    thread 0 write the block's sum to `store`."""
    return KernelSource(f"""
__global__ void {get_stage(stage_id).kernel_name}(const float *g_in, float *g_out, unsigned int n)
{{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int b = blockIdx.x, B = blockDim.x;
    sdata[tid] = {load};
    __syncthreads();
    for (unsigned int s = B / 2; s > 0; s >>= 1) {{
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }}
    if (tid == 0) {store} = sdata[0];
}}
""")


def at(index: str) -> str:
    return f"({index} < n ? g_in[{index}] : 0.0f)"


# Kernels whose every final sum is right: the first three share the work out between blocks otherwise than the
# contract says, and the pass that shows it; the others are unusual but keep to it.
SUM_KERNELS = {
    "blocks write each other's outputs": (
        "sequential", at("b * B + tid"), "g_out[gridDim.x - 1 - b]", "pass 1",
    ),
    "a second element a grid apart": (
        "first_add", f"{at('b * B + tid')} + {at('b * B + tid + gridDim.x * B')}", "g_out[b]", "pass 1",
    ),
    "the last pass's blocks in one": (  # the second pass (n = 391 here) puts everything in block 0
        "sequential", f"(n > 1000 ? {at('b * B + tid')} : (b == 0 ? {at('tid')} + {at('tid + B')} : 0.0f))",
        "g_out[b]", "pass 2",
    ),
    "the slice in reverse": ("sequential", at("b * B + (B - 1 - tid)"), "g_out[b]", None),
    "first add of neighbours": (
        "first_add", f"{at('2 * (b * B + tid)')} + {at('2 * (b * B + tid) + 1')}", "g_out[b]", None,
    ),
    "the open stage's blocks a grid apart": (
        "open", " + ".join(at(f"b * B + tid + {k} * gridDim.x * B") for k in range(16)), "g_out[b]", None,
    ),
}


@pytest.mark.parametrize("name", SUM_KERNELS)
@pytest.mark.parametrize("kind", ["integers", "random"])
def test_every_pass_of_a_sum_writes_its_blocks_slices(backend: Backend, name: str, kind: str) -> None:
    stage_id, load, store, wrong_pass = SUM_KERNELS[name]
    stage = get_stage(stage_id)
    kernel = backend.compile(tree_kernel(stage_id, load, store), stage)
    n = 100_003
    data = draw(kind, n, 5)
    plan = Plan.create(backend, kernel, (n,), 256)
    try:
        plan.load(data)
        assert plan.run(check_each_pass=True) == ()
        expected, tolerance = reference(stage, data, 256)
        assert abs(plan.result() - expected) <= tolerance  # the final sum is right either way
        wrong = plan.wrong_output()
    finally:
        plan.release()
    if wrong_pass is None:
        assert wrong is None
    else:
        assert wrong is not None and wrong.startswith(f"{wrong_pass} of the reduction: g_out[")
        assert "blocks wrong): block b writes the sum of its own slice to g_out[b]" in wrong


@pytest.mark.parametrize("stage_id", ["first_add", "max2d"])
def test_a_kept_first_pass_holds_the_next_kernel_to_the_same_contract(
    backend: Backend, stage_id: str, cache_dir: Path
) -> None:
    # A worker keeps what the contract makes of each case's input for the students it serves (verify.first_pass):
    # the same case run by a right kernel, then by one whose first pass is wrong, gets the same verdicts as fresh.
    stage = get_stage(stage_id)
    case = next(case for case in correctness_cases(stage, 3) if case.input_kind == "random" and case.count > 5000)
    wrong_kernel = {
        "first_add": tree_kernel("first_add", f"{at('b * B + tid')} + {at('b * B + tid + gridDim.x * B')}"),
        "max2d": KernelSource(FLAT_QUARTERS),
    }[stage_id]
    builder = Builder(backend.device(), Sandbox(), {"cache_dir": str(cache_dir)})
    verdicts = []
    for source in (reference_source(stage_id), wrong_kernel, reference_source(stage_id)):
        _, findings, wrong = run_case(backend, builder.build(stage, source), case, 256)
        assert findings == ()
        verdicts.append(None if wrong is None else wrong.split(" of the reduction: ")[0])
    assert verdicts == [None, "pass 1", None]
    assert first_pass(case, stage, 256) is first_pass(case, stage, 256)  # made once
    kept, fresh = vars(first_pass(case, stage, 256)), vars(expect(stage, make_input(case).ravel(), case.size, 256))
    assert kept.keys() == fresh.keys() and all(np.array_equal(kept[name], fresh[name]) for name in kept)


def test_a_wrong_sum_of_one_block_is_found_within_float32_rounding() -> None:
    # Random values: one block's sum off by less than the final tolerance but more than its own slice allows.
    stage = get_stage("sequential")
    values = draw("random", 1024, 3)
    sums = np.add.reduceat(values, np.arange(0, 1024, 256), dtype=np.float64)
    expected = expect(stage, values, (1024,), 256)
    assert expected.wrong(sums.astype(np.float32)) is None  # float32 rounding of right sums
    sums[2] += 0.01
    assert expected.wrong(sums.astype(np.float32)).startswith("g_out[2] = ")


FLAT_QUARTERS = """
__global__ void max2d(const float *g_in, float *g_out, unsigned int width, unsigned int height)
{
    unsigned int half_w = (width + 1) / 2, half_h = (height + 1) / 2;
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= half_w || y >= half_h) return;
    size_t quarter = (size_t)half_w * half_h, total = (size_t)width * height, k = (size_t)y * half_w + x;
    float m = g_in[k];
    for (size_t j = k + quarter; j < total && j < k + 4 * quarter; j += quarter) m = fmaxf(m, g_in[j]);
    g_out[k] = m;
}
"""


@pytest.mark.parametrize("size", [(37, 29), (1, 1000), (1000, 1)])
def test_every_step_of_max2d_writes_the_quadrant_maxima(backend: Backend, size: tuple[int, int]) -> None:
    stage = get_stage("max2d")
    data = draw("random", size[0] * size[1], 9)
    found = {}
    baseline = KernelSource(reference_source("max2d_baseline").text.replace("max2d_baseline(", "max2d("))
    kernels = {"reference": reference_source("max2d"), "baseline": baseline}
    kernels["flat quarters"] = KernelSource(FLAT_QUARTERS)
    for name, source in kernels.items():
        plan = Plan.create(backend, backend.compile(source, stage), size, 256)
        try:
            plan.load(data)
            plan.run(check_each_pass=True)
            assert plan.result() == data.max()
            found[name] = plan.wrong_output()
        finally:
            plan.release()
    assert found["reference"] is None and found["baseline"] is None  # the baseline's step: a technique, not a bug
    if size == (37, 29):  # for one row or one column, quarters and quadrants are the same
        assert found["flat quarters"].startswith("pass 1 of the reduction: out(")
