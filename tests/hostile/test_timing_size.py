"""Kernels that choose other code at the timing size, where the GPU times them and no correctness case runs: each
is caught on the timing size's sampled blocks (autograder.at_scale), by the CPU backend and, for a GPU run, by its
CPU analysis. Each kernel has a switch (CHEAT) for the code it keeps to the timing size; with a switch that is
never on, the same kernel is correct and its technique present, so that what a test sees is the switch's doing."""

from __future__ import annotations

import mmap
import shutil
from dataclasses import replace

import numpy as np
import pytest

from autograder.at_scale import AT_SCALE_HINT, AT_TIMING_SIZE, DRAWN, EDGE, blocks_run, readable, values
from autograder.grade import GradeOptions, _student_run, grade_stages
from autograder.isolation import Worker
from autograder.pipeline.analyse import analyse_on_cpu, analyse_stage
from autograder.records import KernelSource, StageResult, Status
from autograder.references import reference_source
from autograder.stages import get_stage
from autograder.technique import AT_SCALE_HOW
from autograder.verify import draw

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CPU backend needs g++")

OPTIONS = GradeOptions(backend="cpu", seed=20261127, case_seconds=10.0, per_element_seconds=1e-6, measure_speed=False)
NEVER = "n == 0xffffffffu"
SWITCHES = {
    "by n": "n >= (1u << 25)",
    "by the grid's size": "gridDim.x > 100000",
    # Only between the first and last 64 blocks (a launch's sampled blocks hold 16 at each end): the drawn ones
    # find it.
    "in the middle blocks": "n >= (1u << 25) && blockIdx.x >= 64 && blockIdx.x < gridDim.x - 64",
}

# Four times a thread's loads, so a quarter of the blocks do all the work (the rest write 0): the final sum is
# right, and the GPU would time a kernel with fewer, larger blocks.
MORE_PER_THREAD = r"""
__global__ void reduce_first_add(const float *g_in, float *g_out, unsigned int n) {
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int per = (CHEAT) ? 8 : 2;
    unsigned int start = blockIdx.x * blockDim.x * per + tid;
    float sum = 0.0f;
    for (unsigned int k = 0; k < per; ++k) {
        unsigned int i = start + k * blockDim.x;
        if (i < n) sum += g_in[i];
    }
    sdata[tid] = sum;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid == 0) g_out[blockIdx.x] = sdata[0];
}
"""

# Looks outside its own slice, far away, to tell the sampled run (whose unsampled input could be left empty) from a
# timed call, and shares the work out otherwise where it thinks it is timed.
DETECTOR = MORE_PER_THREAD.replace(
    "unsigned int per = (CHEAT) ? 8 : 2;",
    "unsigned int per = (n >= (1u << 25) && g_in[(blockIdx.x * 7919u + n / 2) % n] != 0.0f) ? 8 : 2;",
)

# Tells the sampled run by its input's values (red team): the stand-in's hash once stepped by a fixed amount from one
# value to the next, which four values of a block's own slice showed; a timed call's input does not, and there the
# kernel shares its work out.
RECOGNISER = r"""
__device__ unsigned int units(float v) { return (unsigned int)((v + 0.75f) * 8388608.0f); }
__device__ bool fixed_steps(const float *v) {
    unsigned int first = (units(v[1]) - units(v[0])) & 0xFFFFFFu;
    for (int k = 1; k < 3; ++k) {
        unsigned int step = (units(v[k + 1]) - units(v[k])) & 0xFFFFFFu;
        if (step > first + 1u || step + 1u < first) return false;
    }
    return true;
}
""" + MORE_PER_THREAD.replace(
    "unsigned int per = (CHEAT) ? 8 : 2;",
    "unsigned int per = (n >= (1u << 25) && !fixed_steps(g_in + blockIdx.x * blockDim.x * 2)) ? 8 : 2;",
)

# Shared-memory atomics instead of the tree the stage teaches.
ATOMICS = r"""
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n) {
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x, i = blockIdx.x * blockDim.x + tid;
    float v = (i < n) ? g_in[i] : 0.0f;
    if (CHEAT) {
        if (tid == 0) sdata[0] = 0.0f;
        __syncthreads();
        atomicAdd(&sdata[0], v);
        __syncthreads();
    } else {
        sdata[tid] = v;
        __syncthreads();
        for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
            if (tid < s) sdata[tid] += sdata[tid + s];
            __syncthreads();
        }
    }
    if (tid == 0) g_out[blockIdx.x] = sdata[0];
}
"""

# Its choice, to switch on in other ways.
ATOMICS_OR_TREE = ATOMICS[ATOMICS.index("    if (CHEAT)") : ATOMICS.index("    if (tid == 0) g_out")]

# State kept between launches (found by a red-team helper): the first pass at the timing size notes that it ran, the
# last pass arms a flag, and the first pass of the next whole reduction (the next timed call) uses atomics. The
# sampled run loads the kernel afresh and reduces once, so the flag is never armed where a check looks.
KEPT_FLAG = r"""
__device__ unsigned int seen_big;
__device__ unsigned int armed;
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n) {
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x, i = blockIdx.x * blockDim.x + tid;
    if (n >= (1u << 25) && blockIdx.x == 0 && tid == 0) seen_big = 1;
    float v = (i < n) ? g_in[i] : 0.0f;
ATOMICS_OR_TREE    if (tid == 0) {
        g_out[blockIdx.x] = sdata[0];
        if (gridDim.x == 1 && seen_big) armed = 1;
    }
}
""".replace("ATOMICS_OR_TREE", ATOMICS_OR_TREE.replace("CHEAT", "armed && n >= (1u << 25)"))
# Armed late (review): the flag is read in pass 1, where nothing wrote it yet, and armed in pass 2 of the timing size,
# which no case reaches; from the next reduction on, pass 1 uses atomics. The sampled run reduces twice.
KEPT_LATE = KEPT_FLAG.replace("gridDim.x == 1 && seen_big", "n == 262144u && gridDim.x == 1024u")
# The same with function-scope statics, which are __device__ variables too.
SHARED_ARRAY = "    extern __shared__ float sdata[];\n"
KEPT_STATIC = KEPT_FLAG.replace("__device__ unsigned int seen_big;\n__device__ unsigned int armed;\n", "").replace(
    SHARED_ARRAY, f"{SHARED_ARRAY}    static unsigned int seen_big, armed;\n", 1
)
# The flag read through memcpy, of a size the compiler cannot see (red team): the copy was the C library's, where no
# check saw the read.
KEPT_COPIED = KEPT_FLAG.replace(
    "    float v = (i < n) ? g_in[i] : 0.0f;\n",
    "    float v = (i < n) ? g_in[i] : 0.0f;\n    unsigned int flag = 0, seen = 0;\n"
    "    memcpy(&flag, &armed, blockDim.x >> 6);\n    memcpy(&seen, &seen_big, blockDim.x >> 6);\n",
    1,
).replace("armed && n >= (1u << 25)", "flag && n >= (1u << 25)").replace("&& seen_big)", "&& seen)")
# The state in the input instead (red team): at the timing size each block marks the lowest mantissa bits of its first
# 16 values, a few ulps that no sum notices, and a block that finds the mark (the next timed call, which reads the
# same input) uses atomics.
MARKED_INPUT = r"""
#define SIG 0xA5C3u
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n) {
    extern __shared__ float sdata[];
    __shared__ int marked;
    unsigned int tid = threadIdx.x, i = blockIdx.x * blockDim.x + tid, base = blockIdx.x * blockDim.x;
    float v = (i < n) ? g_in[i] : 0.0f;
    bool big = n >= (1u << 25) && base + 16 <= n;
    if (tid == 0) {
        int m = big;
        for (unsigned int k = 0; big && k < 16; ++k)
            if ((__float_as_uint(g_in[base + k]) & 1u) != ((SIG >> k) & 1u)) m = 0;
        marked = m;
    }
    __syncthreads();
    bool cheat = marked;
    if (big && tid < 16) ((float *)g_in)[i] = __uint_as_float((__float_as_uint(v) & ~1u) | ((SIG >> tid) & 1u));
ATOMICS_OR_TREE    if (tid == 0) g_out[blockIdx.x] = sdata[0];
}
""".replace("ATOMICS_OR_TREE", ATOMICS_OR_TREE.replace("CHEAT", "cheat"))

# Tells a timed pass 2 by its values (red team): it reads block sums, about 64 each, where a first pass reads values
# below 1.25; then it takes other code (here plainly wrong, to show that it runs).
LATER_PASS = ATOMICS.replace(
    "    if (CHEAT) {",
    "    if (n >= (1u << 17) && fabsf(g_in[blockIdx.x * blockDim.x]) > 16.0f) {\n"
    "        if (tid == 0) g_out[blockIdx.x] = 12345.0f;\n"
    "        return;\n"
    "    }\n"
    "    if (false) {",
)

# The tree without its barriers.
RACE = r"""
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n) {
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x, i = blockIdx.x * blockDim.x + tid;
    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        if (!(CHEAT)) __syncthreads();
    }
    if (tid == 0) g_out[blockIdx.x] = sdata[0];
}
"""

CRASH = RACE.replace("if (!(CHEAT)) __syncthreads();", "__syncthreads();").replace(
    "    if (tid == 0) g_out", "    if (CHEAT) { volatile unsigned int zero = 0; sdata[tid] += (float)(tid / zero); }\n"
    "    if (tid == 0) g_out"
)

# Two quadrants' loads instead of four.
TWO_QUADRANTS = r"""
__global__ void max2d(const float *g_in, float *g_out, unsigned int width, unsigned int height) {
    unsigned int half_w = (width + 1) / 2, half_h = (height + 1) / 2;
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= half_w || y >= half_h) return;
    bool right = x + half_w < width, below = y + half_h < height;
    size_t row = (size_t)y * width, row_below = (size_t)(y + half_h) * width;
    float m = g_in[row + x];
    if (right) m = fmaxf(m, g_in[row + x + half_w]);
    if (!((size_t)width * height >= (1u << 25))) {
        if (below) m = fmaxf(m, g_in[row_below + x]);
        if (right && below) m = fmaxf(m, g_in[row_below + x + half_w]);
    }
    g_out[(size_t)y * half_w + x] = m;
}
"""


@pytest.fixture(scope="module")
def worker():
    with Worker("cpu") as worker:
        yield worker


def graded(worker: Worker, stage: str, text: str) -> StageResult:
    options = replace(OPTIONS, backend=worker.backend_name)
    (result,) = grade_stages({stage: KernelSource(text)}, only=[stage], options=options, worker=worker)
    return result


def analysed(stage_id: str, text: str) -> StageResult:
    """As a GPU run grades it, where the GPU found every case right: with its CPU analysis."""
    stage = get_stage(stage_id)
    with _student_run(OPTIONS, None, share=False) as run:
        source = KernelSource(text)
        correct = StageResult(stage.id, Status.CORRECT, "correct: all 24 cases right")
        return analyse_stage(run, stage, source, correct, analyse_on_cpu(run, stage, source))


def at_scale(result: StageResult):
    (case,) = [case for case in result.cases if case.sampled]
    assert AT_TIMING_SIZE in case.label
    return case


@pytest.mark.parametrize("switch", SWITCHES)
def test_a_kernel_that_shares_the_work_out_otherwise_at_the_timing_size_is_wrong_there(worker, switch) -> None:
    honest = graded(worker, "first_add", MORE_PER_THREAD.replace("CHEAT", NEVER))
    assert honest.status is Status.CORRECT and at_scale(honest).passed, honest.message
    # A block that reads its neighbours' slices crashes where their pages are not those of a sampled block.
    for result in (graded(worker, "first_add", MORE_PER_THREAD.replace("CHEAT", SWITCHES[switch])),
                   analysed("first_add", MORE_PER_THREAD.replace("CHEAT", SWITCHES[switch]))):
        assert result.status in (Status.INCORRECT, Status.CRASHED), result.message
        assert AT_TIMING_SIZE in result.message and result.hint == AT_SCALE_HINT
        if result.status is Status.INCORRECT:
            case = at_scale(result)
            assert case.error.startswith(f"{AT_TIMING_SIZE}, pass 1 of the reduction: g_out[")
            assert [c for c in result.cases if not c.passed] == [case]


@pytest.mark.gpu
def test_on_a_gpu_the_timing_size_s_sampled_blocks_give_the_cpu_backend_s_verdicts() -> None:
    with Worker("gpu") as worker:
        honest = graded(worker, "first_add", MORE_PER_THREAD.replace("CHEAT", NEVER))
        cheat = graded(worker, "first_add", MORE_PER_THREAD.replace("CHEAT", SWITCHES["by the grid's size"]))
        atomics = graded(worker, "sequential", ATOMICS.replace("CHEAT", SWITCHES["in the middle blocks"]))
    assert honest.status is Status.CORRECT and at_scale(honest).passed, honest.message
    assert cheat.status in (Status.INCORRECT, Status.CRASHED) and AT_TIMING_SIZE in cheat.message, cheat.message
    assert atomics.status is Status.CORRECT, atomics.message
    assert [check.how for check in atomics.technique if check.passed is False] == [AT_SCALE_HOW]


def test_a_kernel_that_looks_outside_its_slice_to_tell_the_sampled_run_from_a_timed_call_fails(worker) -> None:
    # Only the pages the sampled blocks read can be read: the probe faults (or, where it lands on one of them,
    # finds a value there and the kernel shares its work out).
    for result in (graded(worker, "first_add", DETECTOR), analysed("first_add", DETECTOR)):
        assert result.status in (Status.CRASHED, Status.INCORRECT), result.message
        assert AT_TIMING_SIZE in result.message and result.hint == AT_SCALE_HINT


@pytest.mark.parametrize("switch", SWITCHES)
def test_a_technique_kept_to_the_timing_size_is_measured_there(worker, switch) -> None:
    honest = graded(worker, "sequential", ATOMICS.replace("CHEAT", NEVER))
    assert honest.status is Status.CORRECT and all(check.passed is not False for check in honest.technique)
    for result in (graded(worker, "sequential", ATOMICS.replace("CHEAT", SWITCHES[switch])),
                   analysed("sequential", ATOMICS.replace("CHEAT", SWITCHES[switch]))):
        assert result.status is Status.CORRECT and at_scale(result).passed, result.message
        failed = [check for check in result.technique if check.passed is False]
        assert [check.name for check in failed] == ["shared atomics"], result.technique
        assert failed[0].how == AT_SCALE_HOW


def test_a_technique_kept_to_the_first_pass_is_measured_on_the_first_pass(worker) -> None:
    # The tree all the way down in pass 1 alone, the one the GPU's timing is nearly all of (red team): averaged
    # with the later passes' blocks, its barriers a block came out under the stage's limit.
    text = reference_source("unrolled_warp").text
    loop = "for (unsigned int s = blockDim.x / 2; s > 32; s >>= 1) {"
    whole_tree = (
        "unsigned int stop = (CHEAT) ? 0u : 32u;\n    for (unsigned int s = blockDim.x / 2; s > stop; s >>= 1) {"
    )
    ending = "    if (tid < 32) {"
    early = "    if (stop == 0u) {\n        if (tid == 0) g_out[blockIdx.x] = sdata[0];\n        return;\n    }\n"
    code = text.replace(loop, whole_tree).replace(ending, early + ending, 1)
    assert whole_tree in code and early + ending in code
    honest = graded(worker, "unrolled_warp", code.replace("CHEAT", NEVER))
    assert honest.status is Status.CORRECT and all(check.passed is not False for check in honest.technique)
    for result in (graded(worker, "unrolled_warp", code.replace("CHEAT", SWITCHES["by n"])),
                   analysed("unrolled_warp", code.replace("CHEAT", SWITCHES["by n"]))):
        assert result.status is Status.CORRECT and at_scale(result).passed, result.message
        failed = [check for check in result.technique if check.passed is False]
        assert failed and {check.how for check in failed} == {AT_SCALE_HOW}, result.technique


def test_a_race_kept_to_the_timing_size_is_found_there(worker) -> None:
    code = RACE.replace("CHEAT", SWITCHES["by n"])
    for result in (graded(worker, "sequential", code), analysed("sequential", code)):
        races = [finding for finding in result.findings if finding.kind == "race_syncthreads"]
        assert races and all(finding.line for finding in races), result.findings
        assert result.status is not Status.CORRECT or result.points.total < result.points.max_points


def test_a_crash_kept_to_the_timing_size_is_the_stage_s_verdict(worker) -> None:
    code = CRASH.replace("CHEAT", SWITCHES["by the grid's size"])
    result = graded(worker, "sequential", code)
    assert result.status is Status.CRASHED and AT_TIMING_SIZE in result.message, result.message
    result = analysed("sequential", code)
    assert result.status is Status.CRASHED, result.message
    assert result.message.startswith(f"crashed in the CPU race analysis on n=67108864 {AT_TIMING_SIZE}")


@pytest.mark.parametrize(
    "code",
    [KEPT_FLAG, KEPT_STATIC, KEPT_LATE, KEPT_COPIED],
    ids=["device variables", "static variables", "armed late", "read through memcpy"],
)
def test_state_kept_between_launches_for_the_next_timed_call_is_found(worker, code) -> None:
    assert KEPT_STATIC != KEPT_FLAG and "static unsigned int" in KEPT_STATIC
    assert "flag &&" in KEPT_COPIED and "&& seen)" in KEPT_COPIED
    # The GPU run's analysis reports it; the rubric's [undefined_behaviour] makes the stage incorrect on both.
    for result in (graded(worker, "sequential", code), analysed("sequential", code)):
        kept = [finding for finding in result.findings if finding.kind == "kept_state"]
        assert kept and kept[0].line, result.findings
    assert graded(worker, "sequential", code).status is Status.INCORRECT


def test_a_mark_left_in_the_input_for_the_next_timed_call_is_found(worker) -> None:
    for result in (graded(worker, "sequential", MARKED_INPUT), analysed("sequential", MARKED_INPUT)):
        assert result.status is Status.INCORRECT, result.message
        assert "input_changed" in {finding.kind for finding in result.findings}
        assert at_scale(result).error.startswith(f"{AT_TIMING_SIZE}, pass 1: the kernel changed its input g_in")


def test_a_kernel_that_tells_the_sampled_run_by_its_own_slice_s_values_is_wrong_there(worker) -> None:
    honest = graded(worker, "first_add", RECOGNISER.replace("!fixed_steps", "fixed_steps"))
    assert honest.status is Status.CORRECT and at_scale(honest).passed, honest.message
    # It shares its work out in the sampled run too: reading its neighbours' slices, it crashes or sums wrong.
    for result in (graded(worker, "first_add", RECOGNISER), analysed("first_add", RECOGNISER)):
        assert result.status in (Status.INCORRECT, Status.CRASHED), result.message
        assert AT_TIMING_SIZE in result.message and result.hint == AT_SCALE_HINT


@pytest.mark.parametrize("seed", [0, 1, 20261127, 2**63 - 1])
def test_the_sampled_run_s_input_has_no_pattern_from_one_value_to_the_next(seed) -> None:
    # As a timed call's random input: no step between neighbours more common than chance, no correlation.
    first, later = values(np.arange(1 << 16), seed), values(np.arange(1 << 16), seed, stands_for=512)
    timed = draw("random", 1 << 16, seed)
    for data in (first, timed):
        steps = np.diff(np.round((data + 0.75) * 2**23).astype(np.int64)) % 2**24
        assert np.unique(steps, return_counts=True)[1].max() <= 3
    for data in (first, later, timed):
        assert abs(np.corrcoef(data[:-1], data[1:])[0, 1]) < 0.02


def test_a_later_pass_that_tells_a_timed_call_by_its_values_is_wrong_there(worker) -> None:
    # Each pass's input looks like what a timed call's pass reads: block sums in pass 2, maxima of maxima for max2d.
    for result in (graded(worker, "sequential", LATER_PASS), analysed("sequential", LATER_PASS)):
        assert result.status is Status.INCORRECT, result.message
        assert at_scale(result).error.startswith(f"{AT_TIMING_SIZE}, pass 2 of the reduction: g_out[")


def test_the_open_stage_may_keep_state_between_launches(worker) -> None:
    # A launch counter, as a last-block ticket keeps one: the open stage is judged by its final value alone.
    text = reference_source("open").text
    opening = text.index("{", text.index("reduce_open")) + 1
    counted = (f"__device__ unsigned int launches;\n{text[:opening]}\n"
               "    if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(&launches, 1u);\n" + text[opening:])
    result = graded(worker, "open", counted)
    assert result.status is Status.CORRECT and result.findings == (), (result.message, result.findings)


def test_a_max2d_step_that_loads_less_at_the_timing_size_is_wrong_there(worker) -> None:
    for result in (graded(worker, "max2d", TWO_QUADRANTS), analysed("max2d", TWO_QUADRANTS)):
        assert result.status is Status.INCORRECT, result.message
        assert at_scale(result).error.startswith(f"{AT_TIMING_SIZE}, pass 1 of the reduction: out(")


def test_the_timing_size_counts_only_for_a_stage_the_gpu_found_correct() -> None:
    # As the CPU backend, which runs it only once every other case was right: a wrong stage stays wrong, with its
    # own cases and findings, whatever it does at the timing size.
    stage = get_stage("sequential")
    code = CRASH.replace("CHEAT", SWITCHES["by n"])
    with _student_run(OPTIONS, None, share=False) as run:
        source = KernelSource(code)
        wrong = StageResult(stage.id, Status.INCORRECT, "wrong on 1 of 24 cases", hint="a hint")
        result = analyse_stage(run, stage, source, wrong, analyse_on_cpu(run, stage, source))
    assert result.status is Status.INCORRECT and result.cases == () and result.message == "wrong on 1 of 24 cases"


def test_the_sampled_blocks_hold_both_ends_and_a_draw_from_the_seed_between() -> None:
    count = 1 << 18
    first, second = blocks_run(count, 1, 0), blocks_run(count, 2, 0)
    for blocks in (first, second):
        assert blocks.size == 2 * EDGE + DRAWN and np.all(np.diff(blocks) > 0)
        assert set(range(EDGE)) | set(range(count - EDGE, count)) <= set(blocks.tolist())
    assert not np.array_equal(first, second)
    assert np.array_equal(blocks_run(2 * EDGE + DRAWN, 1, 0), np.arange(2 * EDGE + DRAWN))


def test_the_readable_pages_are_those_of_the_values_read_merged_and_cut_at_the_end() -> None:
    per_page = mmap.PAGESIZE // 4
    reads = np.array([5, 6, per_page + 1, 3 * per_page, 10 * per_page - 1, 10 * per_page])
    assert readable(reads, 10 * per_page + 7) == [(0, 2 * per_page), (3 * per_page, 4 * per_page),
                                                  (9 * per_page, 10 * per_page + 7)]
