"""Kernels that try to slip a race past the CPU backend's checker by confusing its rewrite of shared memory."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from autograder.backends.cpu import CpuBackend
from autograder.launch import Plan
from autograder.records import KernelSource
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
