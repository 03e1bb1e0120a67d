"""Kernels that try to slip past the CPU backend's checker: a race, by confusing its rewrite of shared memory; a
write out of bounds, behind a read out of bounds, so that its student would look as if it only read astray and
keep its GPU worker for the next student (autograder.executors); a write past its output, wiped by its next pass
before the grader looks (autograder.launch)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from autograder.backends.cpu import CpuBackend
from autograder.grade import GradeOptions, _student_run
from autograder.launch import Plan
from autograder.pipeline.analyse import analyse_on_cpu, analyse_stage
from autograder.records import KernelSource, StageResult, Status
from autograder.stages import get_stage

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CPU backend needs g++")

# A shared variable of a struct type defined in its declaration, whose body holds braces and semicolons in
# character and string literals, before the array that races: a rewrite that lost count of the braces would
# leave `sdata` an unchecked local array, and the missing barriers of the loop unreported.
DECOY_FIRST = r"""
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n) {
    __shared__ struct { float v; __device__ int f() const { return '}' + ";}}"[0]; } } decoy;
    __shared__ float sdata[256];
    unsigned int tid = threadIdx.x, i = blockIdx.x * blockDim.x + tid;
    if (tid == 0) decoy.v = 0.0f;
    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
    }
    if (tid == 0) g_out[blockIdx.x] = sdata[0] + decoy.v * decoy.f();
}
"""


def test_a_struct_body_s_braces_do_not_hide_a_later_shared_array_from_the_race_checker(cache_dir: Path) -> None:
    cpu = CpuBackend(cache_dir=cache_dir)
    kernel = cpu.compile(KernelSource(DECOY_FIRST), get_stage("sequential"))
    plan = Plan.create(cpu, kernel, (1000,), 256)
    try:
        plan.load(np.ones(1000, np.float32))
        plan.run(check_each_pass=True)
    finally:
        plan.release()
    assert "race_syncthreads" in {finding.kind for finding in cpu.findings()}


# Reads one past its input on every analysis case, and `extra` before the tree.
STRAY_READ = r"""
#include <cstring>
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n) {
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x, i = blockIdx.x * blockDim.x + tid;
    sdata[tid] = (i <= n) ? g_in[i] : 0.0f;
    EXTRA
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid == 0) g_out[blockIdx.x] = sdata[0];
}
"""
EXTRAS = {
    "nothing more": ("", True),
    "a math function": ("if (tid == 0) sdata[0] += 0.0f * fmodf(fabsf(g_in[0]) + 2.0f, 3.0f);", True),
    # A library call writes where no instrumented access is (here far past g_out, beyond its guard tail).
    "a math function that writes through a pointer": (
        "if (i == 0) { int *e = (int *)(g_out + gridDim.x + 8192); sdata[0] += frexpf(g_in[0], e); }", False
    ),
    "a C library call": ("if (i == 0) sdata[0] += (float)strtol((const char *)g_in, 0, 10);", False),
}


@pytest.mark.parametrize("extra", EXTRAS)
def test_a_read_out_of_bounds_is_trusted_as_all_only_where_every_write_could_be_seen(
    extra: str, cache_dir: Path
) -> None:
    code, trusted = EXTRAS[extra]
    cpu = CpuBackend(cache_dir=cache_dir)
    kernel = cpu.compile(KernelSource(STRAY_READ.replace("EXTRA", code)), get_stage("sequential"))
    plan = Plan.create(cpu, kernel, (1000,), 256)
    try:
        plan.load(np.ones(1000, np.float32))
        plan.run()
    finally:
        plan.release()
    [stray] = [finding for finding in cpu.findings() if finding.kind == "out_of_bounds"]
    assert stray.reads_only == trusted


# Reads one past its input on the small analysis case, and never ends on the larger one, where a write out of
# bounds could hide: what the analysis did not see to the end cannot vouch for its reads. Or crashes the CPU
# analysis's worker there (a GPU may well not fault at the same place; an integer division by zero traps on a CPU
# and not on a GPU). A kernel that ends the analysis so gets the CPU backend's verdict, not the GPU's: else it
# could keep its races and its technique from being checked at will.
ENDINGS = {
    "finishes": ("", None, Status.INCORRECT),
    "never ends": (
        "if (n == 65535) { volatile int spin = 1; while (spin) {} }",
        "hung in the CPU race analysis on n=65535 ",
        Status.TIMEOUT,
    ),
    "crashes": (
        "if (n == 65535 && tid == 0) *(volatile int *)(g_out + (1L << 40)) = 1;",
        "crashed in the CPU race analysis on n=65535 ",
        Status.CRASHED,
    ),
    "prints that the machine killed it, and divides by zero": (
        # The text printed in the first pass (a launch's output shows at its end), the crash in the second.
        'if (n == 65535 && i == 0) printf("the worker died during run_case: killed by signal 9 (SIGKILL)\\n"); '
        "if (n == 256) { volatile unsigned int zero = 0; sdata[tid] += (float)(tid / zero); }",
        "crashed in the CPU race analysis on n=65535 ",
        Status.CRASHED,
    ),
    "divides by zero": (
        "if (n == 65535) { volatile unsigned int zero = 0; sdata[tid] += (float)(tid / zero); }",
        "crashed in the CPU race analysis on n=65535 ",
        Status.CRASHED,
    ),
}


@pytest.mark.parametrize("ending", ENDINGS)
def test_an_analysis_that_did_not_finish_vouches_for_no_read_and_is_the_stage_s_verdict(ending: str) -> None:
    code, note, status = ENDINGS[ending]
    options = GradeOptions(backend="cpu", seed=20261125, case_seconds=5.0)
    stage = get_stage("sequential")
    with _student_run(options, None, share=False) as run:
        source = KernelSource(STRAY_READ.replace("EXTRA", code))
        # What a GPU makes of a kernel that reads past its input: wrong where a partial block reads the NaN there.
        wrong = StageResult(stage.id, Status.INCORRECT, "wrong")
        result = analyse_stage(run, stage, source, wrong, analyse_on_cpu(run, stage, source))
    strays = [finding for finding in result.findings if finding.kind == "out_of_bounds"]
    assert strays and all(finding.reads_only == (note is None) for finding in strays)
    assert result.status is status
    if note is None:
        assert result.message == "wrong" and result.hint is None
    else:
        assert result.message.startswith(note) and result.message.endswith("(on the GPU: wrong)")
        assert "an integer division by zero" in result.hint


# The first pass also writes past its output; each later pass writes NaN (the poison of its own output's tail)
# over the slot its input's tail, the first pass's output, was written at: a check that waited for the device
# only at the end of the run, and read the tails then, would see them unwritten.
WIPES_ITS_TRACKS = """
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n) {
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x, i = blockIdx.x * blockDim.x + tid;
    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid == 0) {
        g_out[blockIdx.x] = sdata[0];
        if (n > 1000) g_out[gridDim.x] = 1.0f;
    }
    if (i == 0 && n <= 1000) ((float *)g_in)[n] = g_out[gridDim.x + 5];
}
"""


def test_a_pass_that_wipes_the_last_pass_s_write_past_its_output_does_not_hide_it(cache_dir: Path) -> None:
    cpu = CpuBackend(cache_dir=cache_dir)
    kernel = cpu.compile(KernelSource(WIPES_ITS_TRACKS), get_stage("sequential"))
    data = np.ones(65537, np.float32)
    plan = Plan.create(cpu, kernel, (65537,), 256)
    try:
        plan.load(data)
        findings = plan.run(check_each_pass=True)
        assert plan.result() == data.sum()
    finally:
        plan.release()
        cpu.close()
    assert [(finding.kind, finding.message.split(",")[0]) for finding in findings] == [
        ("output_guard", "pass 1 wrote g_out[257]")
    ]


def test_a_kernel_that_deadlocks_only_in_the_analysis_is_a_timeout_there_as_on_the_cpu_backend() -> None:
    # The known half-warp deadlock, kept to one analysis case: the GPU's correctness run never meets it.
    known = Path(__file__).parents[1] / "known" / "half_warp_barrier_deadlock.cu"
    text = known.read_text().replace("if (tid >= 16) {", "if (tid >= 16 && n == 65535) {")
    assert "n == 65535" in text
    options = GradeOptions(backend="cpu", seed=20261125, case_seconds=5.0)
    stage = get_stage("shuffle")
    with _student_run(options, None, share=False) as run:
        source = KernelSource(text)
        correct = StageResult(stage.id, Status.CORRECT, "correct")
        result = analyse_stage(run, stage, source, correct, analyse_on_cpu(run, stage, source))
    assert result.status is Status.TIMEOUT and "deadlock" in {finding.kind for finding in result.findings}
    assert result.message.startswith("deadlocked in the CPU race analysis on n=65535 ")
