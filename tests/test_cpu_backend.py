"""The CPU backend on real kernels: correct sums, the defects it must find, metrics, compile errors, fibers.

Every kernel is a .cu file: the official reference kernels in solutions/reduction/kernels, and known-wrong
variants and feature kernels in tests/cpu_kernels.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from autograder.backends.base import Backend, Kernel
from autograder.backends.cpu import CpuBackend, compiler
from autograder.backends.cpu.compiler import (
    CHECK_FLAGS,
    COMMON_FLAGS,
    RUNTIME_DIR,
    compile_kernel,
    parse_diagnostics,
    precompiled_preludes,
    prepare_toolchain,
)
from autograder.backends.cpu.rewrite import rewrite_shared
from autograder.build import Builder
from autograder.errors import BackendUnavailable, CompileError, KernelFault, KernelTimeout
from autograder.isolation import Worker
from autograder.launch import Plan
from autograder.records import Build, DeviceInfo, Finding, KernelSource, SourceLocation
from autograder.references import reference_source
from autograder.sandbox import Sandbox
from autograder.stages import STAGES, Shape, get_stage

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CPU backend needs g++")

KERNELS = Path(__file__).parent / "cpu_kernels"
SOLUTIONS = Path(__file__).parent.parent / "solutions" / "reduction" / "kernels"
# Kernel-source line k sits on notebook cell line k + 2, so every line number below is checked as a cell line.
LOCATION = SourceLocation(notebook="reduction.ipynb", grade_id="test", cell_index=4, first_line=3)
SUM_CASES = (1, 2, 31, 32, 33, 255, 256, 257, 513, 1000, 65537)
MAX2D_CASES = ((1, 1), (2, 1), (1, 2), (1, 1000), (1000, 1), (3, 3), (31, 33), (257, 255))


@pytest.fixture(scope="session")
def cpu(cache_dir: Path) -> CpuBackend:
    return CpuBackend(cache_dir=cache_dir)


@pytest.fixture(scope="session")
def lockstep(cache_dir: Path) -> CpuBackend:
    return CpuBackend(schedule="lockstep", cache_dir=cache_dir)


def kernel_path(name: str) -> Path:
    """A stage's official reference kernel, or one of this test's own kernels."""
    official = SOLUTIONS / f"{name}.cu"
    return official if official.exists() else KERNELS / f"{name}.cu"


def source(name: str) -> KernelSource:
    return KernelSource(kernel_path(name).read_text(), LOCATION)


def cell_line(kernel_file: str, text: str) -> int:
    """The cell line where `text` (which may span lines) first occurs in a kernel's source."""
    code = kernel_path(kernel_file).read_text()
    return code[: code.index(text)].count("\n") + LOCATION.first_line


def reduce(backend: Backend, kernel: Kernel, data: np.ndarray, size: tuple[int, ...]) -> float:
    """One whole reduction the way the grader runs it: poisoned outputs, guard tails, pass after pass."""
    plan = Plan.create(backend, kernel, size, 256)
    try:
        plan.load(data)
        guard_findings = plan.run(check_each_pass=True)
        assert guard_findings == ()
        return plan.result()
    finally:
        plan.release()


def reduce_unchecked(backend: Backend, kernel: Kernel, data: np.ndarray, size: tuple[int, ...]) -> None:
    """One whole reduction, whatever the kernel leaves in its outputs and their guards."""
    plan = Plan.create(backend, kernel, size, 256)
    try:
        plan.load(data)
        plan.run(check_each_pass=True)
    finally:
        plan.release()


def kinds(findings: tuple[Finding, ...]) -> set[str]:
    return {f.kind for f in findings}


# -- correct kernels -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("stage_id", sorted(path.stem for path in SOLUTIONS.glob("*.cu")))
def test_reference_kernels_are_correct_with_no_findings(cpu: CpuBackend, stage_id: str) -> None:
    stage = get_stage(stage_id)
    kernel = cpu.compile(source(stage_id), stage)
    rng = np.random.default_rng(7)
    cases = [(n,) for n in SUM_CASES] if stage.shape is Shape.SUM_1D else list(MAX2D_CASES)
    for size in cases:
        count = math.prod(size)
        integers = rng.integers(-8, 9, count).astype(np.float32)
        floats = rng.standard_normal(count).astype(np.float32)
        for data in (integers, floats):
            got = reduce(cpu, kernel, data, size)
            if stage.shape is Shape.SUM_1D:
                expected = float(data.astype(np.float64).sum())
                tolerance = 1e-5 * float(np.abs(data).sum()) + 1e-6
            else:
                expected, tolerance = float(data.max()), 0.0
            assert abs(got - expected) <= tolerance, f"{stage_id} size {size}: got {got}, expected {expected}"
    assert cpu.findings() == ()


def test_open_stage_features_templates_static_shared_votes_atomics(cpu: CpuBackend) -> None:
    kernel = cpu.compile(source("open_features"), get_stage("open"))
    for n in (1, 4096, 4097, 100_003):
        assert reduce(cpu, kernel, np.ones(n, np.float32), (n,)) == n
    assert cpu.findings() == ()


def test_namespace_scope_shared_and_explicitly_instantiated_templates(cpu: CpuBackend) -> None:
    kernel = cpu.compile(source("namespace_shared"), get_stage("sequential"))
    for n in (1, 300, 70_001):
        assert reduce(cpu, kernel, np.ones(n, np.float32), (n,)) == n
    assert cpu.findings() == ()


def test_device_variables_keep_one_copy_in_large_sampled_launches(cpu: CpuBackend) -> None:
    # Above 2^20 threads most blocks would run the plain build, which has its own copy of the counter.
    kernel = cpu.compile(source("device_counter"), get_stage("shuffle"))
    blocks = (1 << 20) // 32 + 5
    data, out = cpu.upload(np.ones(1, np.float32)), cpu.alloc(1)
    cpu.fill(out, 0.0)
    cpu.launch(kernel, (blocks, 1), (64, 1), 0, (data, out, 1))
    assert cpu.download(out, 1)[0] == blocks
    assert cpu.findings() == ()


def test_a_device_variable_is_checked_as_the_graders_buffers_are(cpu: CpuBackend) -> None:
    # Block 0 copies its 256 values into a __device__ array of 255 (tests/known): the write past its end lands in
    # the padding before the next symbol, outside the variable, and the message names the variable.
    text = (Path(__file__).parent / "known" / "device_array_overrun.cu").read_text()
    kernel = cpu.compile(KernelSource(text, LOCATION), get_stage("naive"))
    assert reduce(cpu, kernel, np.ones(1000, np.float32), (1000,)) == 1000
    [finding] = cpu.findings()
    assert finding.kind == "out_of_bounds" and not finding.reads_only
    assert "first_block[255]" in finding.message and "255 4-byte words of the __device__ variable" in finding.message
    assert finding.thread == "block (0,0,0) thread (255,0,0)"
    assert finding.line == LOCATION.first_line + text[: text.index("keep::first_block[tid] =")].count("\n")


@pytest.mark.parametrize("spec", ["__align__(sizeof(float4))", "alignas(sizeof(float4))"])
def test_a_static_shared_array_aligned_by_a_sizeof_is_checked(cpu: CpuBackend, spec: str) -> None:
    # Declared with the CUDA samples' alignment idiom, the read past the array and the race are found as they are
    # for a plain declaration (the rewrite used to fall back to an unchecked static, graded correct).
    text = (Path(__file__).parent / "known" / "shared_read_past_the_end.cu").read_text()
    seen = []
    for declaration in ("__shared__ float sdata[256];", f"__shared__ {spec} float sdata[256];"):
        declared = text.replace("extern __shared__ float sdata[];", declaration)
        kernel = cpu.compile(KernelSource(declared, LOCATION), get_stage("sequential"))
        reduce_unchecked(cpu, kernel, np.ones(1000, np.float32), (1000,))
        seen.append(kinds(cpu.findings()))
    assert seen[0] == seen[1] and {"out_of_bounds", "race_syncthreads"} <= seen[1]


def test_a_functions_static_is_checked_as_a_device_variable_is(cpu: CpuBackend) -> None:
    # A static in a template device function lives in global memory, one per instantiation for every block: the
    # write past its end is found and named, and the static of another function of the same name is not taken for
    # it. The kernel's own __shared__ array, which the rewrite makes a function's static too, is not one.
    text = """
template <unsigned int WIDTH>
__device__ float keep(float value, unsigned int tid) {
    static float last[WIDTH];
    last[tid] = value;
    return last[tid];
}
__global__ void reduce_naive(const float *g_in, float *g_out, unsigned int n) {
    __shared__ float sdata[256];
    unsigned int tid = threadIdx.x, i = blockIdx.x * blockDim.x + tid;
    sdata[tid] = i < n ? g_in[i] : 0.0f;
    if (blockIdx.x == 0) sdata[tid] = keep<255>(sdata[tid], tid);
    __syncthreads();
    for (unsigned int s = 1; s < blockDim.x; s *= 2) {
        if (tid % (2 * s) == 0) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid == 0) g_out[blockIdx.x] = sdata[0];
}
"""
    kernel = cpu.compile(KernelSource(text, LOCATION), get_stage("naive"))
    assert reduce(cpu, kernel, np.ones(1000, np.float32), (1000,)) == 1000
    [finding] = cpu.findings()
    assert finding.kind == "out_of_bounds" and not finding.reads_only
    assert "last[255]" in finding.message and "the static variable last of keep" in finding.message


def test_device_variables_used_without_a_race_give_no_finding(cpu: CpuBackend) -> None:
    # A constant every thread reads, counters only atomics touch, a slot per block only its own thread uses:
    # checking the accesses to __device__ variables must not make such a kernel wrong, in any pass of any size.
    kernel = cpu.compile(source("device_variables_used_safely"), get_stage("first_add"))
    for n in (1, 1000, 70_001):
        assert reduce(cpu, kernel, np.ones(n, np.float32), (n,)) == n
    assert cpu.findings() == ()


def test_a_counter_that_carries_over_from_launch_to_launch_is_kept_state(cpu: CpuBackend) -> None:
    # Read only by an atomic whose result is dropped, but an atomic may as well return it: a flag read as
    # atomicAdd(&armed, 0) would tell a timed call from the check before it (README: the timing size). The second
    # pass reads what the first wrote.
    text = source("device_variables_used_safely").text.replace(
        "        unsigned int slot", "        if (blockIdx.x == 0) atomicAdd(&launches, 1u);\n        unsigned int slot"
    )
    kernel = cpu.compile(KernelSource(f"__device__ unsigned int launches;\n{text}", LOCATION), get_stage("first_add"))
    assert reduce(cpu, kernel, np.ones(1000, np.float32), (1000,)) == 1000
    [finding] = cpu.findings()
    assert finding.kind == "kept_state" and "launches[0]" in finding.message and finding.line


KEPT_FLAG = """
DECLARATION
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n) {
    __shared__ float sdata[256];
    unsigned int tid = threadIdx.x, i = blockIdx.x * blockDim.x + tid;
    sdata[tid] = i < n ? g_in[i] : 0.0f;
    if (armed == 12345u) sdata[tid] = -1.0f;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid == 0) { g_out[blockIdx.x] = sdata[0]; if (gridDim.x == 1) armed = 1; }
}
"""


def twice(cpu: CpuBackend, text: str) -> set[str]:
    """The kinds of finding two whole reductions of a sequential-stage kernel give, the second reading what the
    first left."""
    kernel = cpu.compile(KernelSource(text, LOCATION), get_stage("sequential"))
    for _ in range(2):
        reduce(cpu, kernel, np.ones(1000, np.float32), (1000,))
    return kinds(cpu.findings())


@pytest.mark.parametrize("declaration", [
    "__device__ unsigned int armed;",
    "#define KEPT __device__\nKEPT unsigned int armed;",
    "__device__ __align__(4) unsigned int armed;",
    "__device__ alignas(8) unsigned int armed;",
    "__device__ unsigned int (armed);",
    "__device__ __attribute__((aligned(16))) unsigned int armed;",
    "typedef unsigned int word;\n__device__ word armed, *unused_pointer;",
    "namespace hidden { __device__ unsigned int armed; }\nusing hidden::armed;",
    "template <class T> __device__ T flag;\n#define armed flag<unsigned int>",
    "__device__ unsigned int armed_twin[2];\n#define armed armed_twin[1]",
    # A second red team: names the demangler prints with brackets of operators, and storage without a plain name.
    "struct A {};\n__device__ inline bool operator<(A, A) { return false; }\n"
    "template <bool (*F)(A, A)> __device__ unsigned int cell;\n#define armed cell<&operator< >",
    "struct A { __device__ int *operator->(); };\ntemplate <int *(A::*F)()> __device__ unsigned int cell;\n"
    "#define armed cell<&A::operator-> >",
    "static unsigned int *const kept = (unsigned int[]){0u};\n#define armed (*kept)",
    "struct P { unsigned a, b; };\nauto [armed, spare] = P{0, 0};",
])
def test_a_device_variable_keeps_state_however_it_is_declared(cpu: CpuBackend, declaration: str) -> None:
    """The variables checked are those the compiler built, not those a reading of the source finds: a flag set by
    one reduction's last pass and read by the next is kept state whatever the declaration's spelling (red team:
    a macro, `__align__`, a declarator in parentheses hid it)."""
    assert "kept_state" in twice(cpu, KEPT_FLAG.replace("DECLARATION", declaration))


@pytest.mark.parametrize("declaration", [
    "__device__ unsigned int armed_cells[0];\n#define armed armed_cells[0]",
    "struct Cells { unsigned int d[0]; };\n__device__ Cells cells;\n#define armed cells.d[0]",
])
def test_a_variable_of_size_zero_is_a_compile_error(cpu: CpuBackend, declaration: str) -> None:
    """It has no bounds to check, so what it holds passed from launch to launch unseen (red team); nvcc refuses a
    zero-sized variable in device code, and so does the CPU backend, with the same verdict."""
    with pytest.raises(CompileError, match="has size zero"):
        cpu.compile(KernelSource(KEPT_FLAG.replace("DECLARATION", declaration), LOCATION), get_stage("sequential"))


@pytest.mark.parametrize("array", [
    "{ __shared__ float armed[4]; armed[0] = 0; }",
    "if (n == 0) { extern __shared__ float armed[]; armed[0] = 0.0f; }",  # a pointer of its own, no marker
    "if (false) { __shared__ float armed[4]; armed[0] = 0.0f; }",  # the array's variable left out, and its marker
])
def test_a_variable_named_as_a_shared_array_in_its_function_is_still_checked(cpu: CpuBackend, array: str) -> None:
    """The rewrite's own variables for `__shared__` arrays are told by their markers; a function that holds a
    static of an array's name besides the array cannot hide it: all of that name are checked (red team)."""
    text = KEPT_FLAG.replace("DECLARATION", "").replace(
        "    __shared__ float sdata[256];",
        f"    static __device__ unsigned int armed;\n    {array}\n    __shared__ float sdata[256];",
    )
    assert "kept_state" in twice(cpu, text)


@pytest.mark.parametrize("declaration", [
    "__shared__ float (sdata)[256];",
    "__shared__ __attribute__((aligned(sizeof(float4)))) float sdata[256];",
    "__shared__ decltype(0.0f) sdata[256];",
    "#define SM __shared__\n    SM float (sdata)[256];",
])
def test_a_shared_array_declared_unusually_is_no_device_variable(cpu: CpuBackend, declaration: str) -> None:
    """Declarations the rewrite once left to the prelude's fallback, a function's plain static: every block then
    shared one array, a race between blocks (red team, once the variables came from the symbol table)."""
    text = KEPT_FLAG.replace("DECLARATION", "").replace("    __shared__ float sdata[256];", f"    {declaration}")
    text = text.replace("if (armed == 12345u) sdata[tid] = -1.0f;", "").replace("if (gridDim.x == 1) armed = 1;", "")
    kernel = cpu.compile(KernelSource(text, LOCATION), get_stage("sequential"))
    for _ in range(2):
        assert reduce(cpu, kernel, np.ones(5000, np.float32), (5000,)) == 5000
    assert cpu.findings() == ()


@pytest.mark.parametrize("name", ["textbook_file_scope_shared", "namespace_shared", "macro_shared", "samples_style"])
def test_the_rewrites_shared_arrays_are_no_device_variables(cpu: CpuBackend, name: str) -> None:
    """Shared arrays at namespace scope, in namespaces, in templates and through macros: none is checked as a
    __device__ variable (they live per block), so a clean kernel run twice has no finding."""
    text = source(name).text
    stage = next(stage for stage in STAGES if f" {stage.kernel_name}(" in text)
    kernel = cpu.compile(KernelSource(text, LOCATION), stage)
    for _ in range(2):
        reduce(cpu, kernel, np.ones(5000, np.float32), (5000,) if stage.shape is Shape.SUM_1D else (50, 100))
    assert "kept_state" not in kinds(cpu.findings())


def test_last_block_pattern_with_threadfence_is_not_a_race_and_without_it_is(cpu: CpuBackend) -> None:
    n = 256 * 40
    for name, races in (("last_block", set()), ("bug_last_block_no_fence", {"race_interblock"})):
        kernel = cpu.compile(source(name), get_stage("shuffle"))
        data, out = cpu.upload(np.ones(n, np.float32)), cpu.alloc(40)
        cpu.launch(kernel, (40, 1), (256, 1), 0, (data, out, n))
        assert cpu.download(out, 1)[0] == n
        assert kinds(cpu.findings()) == races, name


@pytest.mark.parametrize("schedule", ["reversed", "random"])
def test_other_schedules_run_correct_kernels_correctly(cache_dir: Path, schedule: str) -> None:
    backend = CpuBackend(schedule=schedule, seed=3, cache_dir=cache_dir)
    for stage_id in ("sequential", "unrolled_warp", "shuffle"):
        kernel = backend.compile(source(stage_id), get_stage(stage_id))
        assert reduce(backend, kernel, np.ones(5000, np.float32), (5000,)) == 5000
    assert backend.findings() == ()


def test_atomics_in_global_and_shared_memory_are_not_races(cpu: CpuBackend) -> None:
    kernel = cpu.compile(source("atomic_global"), get_stage("shuffle"))
    n = 2000
    data, out = cpu.upload(np.arange(n, dtype=np.float32)), cpu.alloc(8)
    cpu.fill(out, 0.0)
    cpu.launch(kernel, (math.ceil(n / 256), 1), (256, 1), 0, (data, out, n))
    assert cpu.download(out, 1)[0] == n * (n - 1) / 2
    assert cpu.findings() == ()


def test_warp_collectives_and_shared_atomics_give_what_cuda_gives(cpu: CpuBackend) -> None:
    kernel = cpu.compile(source("warp_ops"), get_stage("shuffle"))
    data, out = cpu.upload(np.arange(64, dtype=np.float32)), cpu.alloc(64 * 9)
    cpu.launch(kernel, (1, 1), (64, 1), 0, (data, out, 64))
    got = cpu.download(out, 64 * 9).reshape(64, 9)
    for t in range(64):
        lane, base = t % 32, t - t % 32
        segment_lane = lane % 16
        expected = [
            base + 3,
            t - 1 if lane >= 1 else t,
            t + 2 if segment_lane + 2 < 16 else t,
            base + (lane ^ 1),
            11,  # lanes 0, 3, ..., 30
            1,  # any(lane == 7) and not all(lane < 31)
            64,
            31,
            32,
        ]
        assert got[t].tolist() == expected, f"thread {t}"
    assert cpu.findings() == ()


def test_printf_reaches_stdout(cpu: CpuBackend, capfd: pytest.CaptureFixture[str]) -> None:
    kernel = cpu.compile(source("printf_kernel"), get_stage("naive"))
    data, out = cpu.upload(np.ones(4, np.float32)), cpu.alloc(2)
    cpu.launch(kernel, (2, 1), (32, 1), 0, (data, out, 4))
    assert capfd.readouterr().out.splitlines() == ["block 0 sees n=4", "block 1 sees n=4"]


# -- the defects the checker must find -----------------------------------------------------------------------


def test_volatile_last_warp_without_syncwarp_is_a_syncwarp_race(cpu: CpuBackend, lockstep: CpuBackend) -> None:
    n = 5000
    # By default the lanes run one after another, so the racy code gives a wrong sum, as on an unlucky GPU.
    kernel = cpu.compile(source("bug_volatile_no_syncwarp"), get_stage("unrolled_warp"))
    assert reduce(cpu, kernel, np.ones(n, np.float32), (n,)) != n
    assert "race_syncwarp" in kinds(cpu.findings())
    # In lockstep the sum comes out right, and the race is still reported, on the lines of the warp steps.
    kernel = lockstep.compile(source("bug_volatile_no_syncwarp"), get_stage("unrolled_warp"))
    assert reduce(lockstep, kernel, np.ones(n, np.float32), (n,)) == n
    races = [f for f in lockstep.findings() if f.kind == "race_syncwarp"]
    assert {f.line for f in races} >= {cell_line("bug_volatile_no_syncwarp", "sdata[tid + 1]")}
    assert all(f.kernel == "reduce_unrolled_warp" and f.thread.startswith("block (0,0,0)") for f in races)
    assert "__syncwarp()" in races[0].message


def test_missing_syncthreads_in_the_tree_loop_is_a_syncthreads_race(cpu: CpuBackend) -> None:
    kernel = cpu.compile(source("bug_missing_syncthreads"), get_stage("sequential"))
    assert reduce(cpu, kernel, np.ones(1000, np.float32), (1000,)) != 1000
    races = [f for f in cpu.findings() if f.kind == "race_syncthreads"]
    assert [f.line for f in races] == [cell_line("bug_missing_syncthreads", "sdata[tid] += sdata[tid + s]")]
    assert "__syncthreads()" in races[0].message


def test_every_block_writing_out0_is_an_interblock_race_though_the_sum_is_right(cpu: CpuBackend) -> None:
    kernel = cpu.compile(source("bug_every_block_out0"), get_stage("sequential"))
    n = 256 * 16
    data, out = cpu.upload(np.ones(n, np.float32)), cpu.alloc(16)
    cpu.launch(kernel, (16, 1), (256, 1), 1024, (data, out, n))
    assert cpu.download(out, 1)[0] == n  # blocks run one at a time, so the output check alone passes
    races = [f for f in cpu.findings() if f.kind == "race_interblock"]
    assert [f.line for f in races] == [cell_line("bug_every_block_out0", "else g_out[0] += sdata[0]")]
    assert "g_out[0]" in races[0].message and "another block" in races[0].message


def test_missing_bounds_check_is_out_of_bounds_with_buffer_offset_and_thread(cpu: CpuBackend) -> None:
    kernel = cpu.compile(source("bug_missing_bounds"), get_stage("sequential"))
    reduce(cpu, kernel, np.ones(1000, np.float32), (1000,))
    [finding] = [f for f in cpu.findings() if f.kind == "out_of_bounds"]
    assert finding.line == cell_line("bug_missing_bounds", "sdata[tid] = g_in[i]")
    assert "g_in[1000]" in finding.message and "1000 values of g_in" in finding.message
    assert finding.thread == "block (3,0,0) thread (232,0,0)"


def test_a_stray_read_is_told_from_a_stray_write(cpu: CpuBackend) -> None:
    # A read out of bounds changes no memory, so the GPU worker of its student may serve the next one.
    kernel = cpu.compile(source("bug_missing_bounds"), get_stage("sequential"))
    reduce(cpu, kernel, np.ones(1000, np.float32), (1000,))
    [finding] = [f for f in cpu.findings() if f.kind == "out_of_bounds"]
    assert finding.reads_only
    # A write out of bounds on a line of its own, and on a line that also reads out of bounds.
    text = source("bug_missing_bounds").text.replace("g_in[i]", "(i < n) ? g_in[i] : 0.0f")
    for stray in ("if (tid == 0) g_out[gridDim.x + 1] = 1.0f;", "if (tid == 0) g_out[gridDim.x + 1] = g_in[n + 1];"):
        written = text.replace("    __syncthreads();\n", f"    {stray}\n    __syncthreads();\n", 1)
        kernel = cpu.compile(KernelSource(written, LOCATION), get_stage("sequential"))
        reduce_unchecked(cpu, kernel, np.ones(1000, np.float32), (1000,))
        [finding] = [f for f in cpu.findings() if f.kind == "out_of_bounds"]
        assert not finding.reads_only and "writes g_out[" in finding.message, stray


def test_more_stray_reads_than_a_launch_reports_cannot_hide_a_stray_write(cpu: CpuBackend) -> None:
    reads = "".join(f"        total += g_in[n + {k}];\n" for k in range(300))  # 300 places: past the 256 told
    hiding = f"    if (i == 0) {{\n        float total = 0.0f;\n{reads}        g_out[gridDim.x + 1] = total;\n    }}\n"
    text = source("bug_missing_bounds").text.replace("g_in[i]", "(i < n) ? g_in[i] : 0.0f")
    text = text.replace("    __syncthreads();\n", hiding + "    __syncthreads();\n", 1)
    kernel = cpu.compile(KernelSource(text, LOCATION), get_stage("sequential"))
    reduce_unchecked(cpu, kernel, np.ones(1000, np.float32), (1000,))
    strays = [f for f in cpu.findings() if f.kind == "out_of_bounds"]
    assert len(strays) > 200 and sum(f.reads_only for f in strays) == len(strays) - 1
    [write] = [f for f in strays if not f.reads_only]
    assert write.line == text[: text.index("g_out[gridDim.x + 1]")].count("\n") + LOCATION.first_line


def test_a_shared_variable_of_a_struct_defined_in_its_declaration_is_race_checked(cpu: CpuBackend) -> None:
    text = source("shared_struct_types").text
    barrier = "        slots[1].owner = 0;\n    }\n    __syncthreads();\n"
    racy = text.replace(barrier, barrier.replace("    __syncthreads();\n", ""))
    racy = racy.replace("(tid == 0) g_out", "(tid == 64) g_out")  # another warp reads what thread 0 wrote
    assert racy.count("__syncthreads") == text.count("__syncthreads") - 1
    kernel = cpu.compile(KernelSource(racy, LOCATION), get_stage("sequential"))
    reduce_unchecked(cpu, kernel, np.ones(1000, np.float32), (1000,))
    assert "race_syncthreads" in kinds(cpu.findings())


def test_loads_and_stores_with_cache_hints_are_checked_as_plain_ones(cpu: CpuBackend) -> None:
    text = source("cache_hints_and_index_intrinsics").text
    unguarded = text.replace("(i < n) ? __ldcg(&g_in[signed_index]) : 0.0f", "__ldcg(&g_in[signed_index])")
    unguarded = unguarded.replace("if (tid == 0) __stcg(&g_out[blockIdx.x], sdata[0]);", "__stcg(&g_out[i], sdata[0]);")
    kernel = cpu.compile(KernelSource(unguarded, LOCATION), get_stage("first_add"))
    reduce_unchecked(cpu, kernel, np.ones(1000, np.float32), (1000,))
    lines = {(f.kind, f.line) for f in cpu.findings()}
    load = unguarded[: unguarded.index("__ldcg(&g_in")].count("\n") + LOCATION.first_line
    store = unguarded[: unguarded.index("__stcg(&g_out[i]")].count("\n") + LOCATION.first_line
    assert {("out_of_bounds", load), ("out_of_bounds", store)} <= lines


def test_bounds_are_checked_in_the_last_blocks_of_large_launches(cpu: CpuBackend) -> None:
    # Above 2^20 threads only the first and last blocks run instrumented: the overrun is in the last one.
    n = (1 << 20) + 77
    kernel = cpu.compile(source("bug_missing_bounds"), get_stage("sequential"))
    data, out = cpu.upload(np.ones(n, np.float32)), cpu.alloc(math.ceil(n / 256))
    cpu.launch(kernel, (math.ceil(n / 256), 1), (256, 1), 1024, (data, out, n))
    assert "out_of_bounds" in kinds(cpu.findings())


def test_a_race_kept_to_the_blocks_between_the_sampled_ones_is_found(cpu: CpuBackend) -> None:
    # Above 2^20 threads the blocks between the first and last 64 run uninstrumented, but for as many drawn from
    # the run's secret seed: a kernel that races in all of them (or in those a launch's size picks) is caught.
    stage = get_stage("unrolled_warp")
    kernel = cpu.compile(source("bug_race_between_the_sampled_blocks"), stage)
    n = 3 << 20
    reduce_unchecked(cpu, kernel, np.ones(n, np.float32), (n,))
    found = cpu.findings()
    assert "race_syncwarp" in kinds(found), found
    middle = [f for f in found if f.kind == "race_syncwarp"]
    assert all(64 <= int(f.thread.split("(")[1].split(",")[0]) < n // 512 - 64 for f in middle)


def test_static_shared_array_overrun_is_out_of_bounds(cpu: CpuBackend) -> None:
    kernel = cpu.compile(source("bug_static_shared_overrun"), get_stage("sequential"))
    reduce(cpu, kernel, np.ones(256, np.float32), (256,))
    [finding] = [f for f in cpu.findings() if f.kind == "out_of_bounds"]
    assert finding.line == cell_line("bug_static_shared_overrun", "sdata[tid] = i < n")
    assert finding.thread == "block (0,0,0) thread (255,0,0)"
    assert "sdata[255]" in finding.message


def test_uninitialised_shared_memory_read(cpu: CpuBackend) -> None:
    kernel = cpu.compile(source("bug_uninitialised"), get_stage("sequential"))
    reduce(cpu, kernel, np.ones(1000, np.float32), (1000,))
    [finding] = [f for f in cpu.findings() if f.kind == "uninitialised_read"]
    assert finding.line == cell_line("bug_uninitialised", "sdata[tid] += sdata[tid + s]")
    assert "sdata[" in finding.message


def test_half_warp_at_barrier_while_half_shuffles_is_a_deadlock(cpu: CpuBackend) -> None:
    kernel = cpu.compile(source("bug_deadlock"), get_stage("shuffle"))
    data, out = cpu.upload(np.ones(32, np.float32)), cpu.alloc(1)
    with pytest.raises(KernelFault) as fault:
        cpu.launch(kernel, (1, 1), (32, 1), 0, (data, out, 32))
    barrier = cell_line("bug_deadlock", "__syncthreads()")
    shuffle = cell_line("bug_deadlock", "__shfl_down_sync")
    assert {f.kind for f in fault.value.findings} == {"deadlock"}
    assert {f.line for f in fault.value.findings} == {barrier, shuffle}
    message = fault.value.findings[0].message
    assert f"threads 0-15 wait at __syncthreads() on line {barrier}" in message
    assert f"threads 16-31 wait at __shfl_down_sync on line {shuffle}" in message
    assert cpu.findings() == ()  # the fault carries them


def test_full_mask_shuffle_after_half_the_warp_exited_reads_inactive_lanes(cpu: CpuBackend) -> None:
    kernel = cpu.compile(source("bug_inactive_lane"), get_stage("shuffle"))
    data, out = cpu.upload(np.ones(32, np.float32)), cpu.alloc(1)
    cpu.launch(kernel, (1, 1), (32, 1), 0, (data, out, 32))
    [finding] = [f for f in cpu.findings() if f.kind == "inactive_lane"]
    assert finding.line == cell_line("bug_inactive_lane", "__shfl_down_sync")
    assert "lane 0 reads lane 16" in finding.message


def test_findings_are_deduplicated_per_kind_and_line(cpu: CpuBackend) -> None:
    kernel = cpu.compile(source("bug_missing_bounds"), get_stage("sequential"))
    for _ in range(3):
        reduce(cpu, kernel, np.ones(1000, np.float32), (1000,))
    assert len([f for f in cpu.findings() if f.kind == "out_of_bounds"]) == 1
    assert cpu.findings() == ()  # reading them clears them


# -- metrics ---------------------------------------------------------------------------------------------------


def test_strided_index_needs_more_shared_transactions_than_sequential_addressing(cache_dir: Path) -> None:
    backend = CpuBackend(cache_dir=cache_dir)  # a fresh backend: metrics accumulate per kernel
    metrics = {}
    for stage_id in ("naive", "anti_divergence", "sequential"):
        kernel = backend.compile(source(stage_id), get_stage(stage_id))
        reduce(backend, kernel, np.ones(1 << 14, np.float32), (1 << 14,))
        metrics[stage_id] = backend.metrics(kernel)
    strided = next(m for m in metrics["anti_divergence"].lines if "sdata[index + s]" in m.text)
    sequential = next(m for m in metrics["sequential"].lines if "sdata[tid + s]" in m.text)
    assert strided.line == cell_line("anti_divergence", "sdata[index] += sdata[index + s]")
    assert strided.shared_transactions / strided.shared_requests > 3.0
    assert sequential.shared_transactions == sequential.shared_requests
    assert metrics["anti_divergence"].transactions_per_request > metrics["sequential"].transactions_per_request
    # The modulo test of stage 1 splits warps at every step; the strided index keeps them together.
    assert metrics["naive"].divergence > 2 * metrics["anti_divergence"].divergence


# -- compiling -------------------------------------------------------------------------------------------------


def test_compile_errors_carry_notebook_cell_lines(cpu: CpuBackend) -> None:
    with pytest.raises(CompileError) as error:
        cpu.compile(source("bug_compile_error"), get_stage("naive"))
    errors = [m for m in error.value.messages if m.severity == "error"]
    undeclared = cell_line("bug_compile_error", "undeclared_value")
    assert errors[0].line == undeclared and "undeclared_value" in errors[0].text
    assert f"line {undeclared}" in str(error.value)
    # The bad shuffle fails inside the prelude, yet the message points at the student's line.
    shuffle = cell_line("bug_compile_error", "__shfl_down_sync")
    assert any(m.line == shuffle and "__ag_" not in m.text for m in errors)


@pytest.mark.parametrize(
    ("declared", "defined"),
    [
        ("float helper(float x);", ""),
        ("float helper(float x);", "__device__ float helper(double x) { return (float)x; }"),
    ],
    ids=["never defined", "defined with other parameter types"],
)
def test_a_function_declared_and_not_defined_is_named_on_the_line_that_calls_it(
    cpu: CpuBackend, declared: str, defined: str
) -> None:
    text = source("naive").text.replace("__global__", f"__device__ {declared}\n{defined}\n__global__", 1)
    text = text.replace("sdata[tid] = (i < n) ? g_in[i] : 0.0f;", "sdata[tid] = (i < n) ? helper(g_in[i]) : 0.0f;")
    assert "helper(g_in[i])" in text
    with pytest.raises(CompileError) as error:
        cpu.compile(KernelSource(text, LOCATION), get_stage("naive"))
    [message] = error.value.messages
    line = text[: text.index("helper(g_in[i])")].count("\n") + LOCATION.first_line
    assert message.line == line and message.text.startswith("undefined reference to `helper(")
    assert "never defined in the cell" in message.text and f"line {line}" in str(error.value)


@pytest.mark.parametrize(
    "log",
    [
        "g++: internal compiler error: File size limit exceeded signal terminated program as\n"
        "Please submit a full bug report, with preprocessed source (by using -freport-bug).\n",
        "collect2: fatal error: ld terminated with signal 25 [File size limit exceeded]\n"
        "collect2: error: ld returned 1 exit status\n",
    ],
    ids=["assembler", "linker"],
)
def test_a_kernel_too_large_to_compile_says_so(log: str) -> None:
    [message] = parse_diagnostics(log, KernelSource("__global__ void k() {}\n"))
    assert message.severity == "error" and message.line is None
    assert "File size limit exceeded" in message.text and "a __device__ or static array too large" in message.text


def test_warnings_come_back_with_the_kernel_on_cell_lines(cpu: CpuBackend) -> None:
    text = source("naive").text.replace("unsigned int tid = threadIdx.x;", "unsigned char tid = 300 + threadIdx.x * 0;")
    for _ in range(2):  # the second compile comes from the cache and must keep the warnings
        kernel = cpu.compile(KernelSource(text, LOCATION), get_stage("naive"))
        [warning] = kernel.warnings
        assert warning.severity == "warning" and warning.line == cell_line("naive", "unsigned int tid")


def test_a_missing_kernel_says_which_signature_the_stage_needs(cpu: CpuBackend) -> None:
    with pytest.raises(CompileError) as error:
        cpu.compile(source("naive"), get_stage("sequential"))
    assert "reduce_sequential" in str(error.value) and "unsigned int n" in str(error.value)


def test_builds_are_cached(cpu: CpuBackend, cache_dir: Path) -> None:
    cpu.compile(source("sequential"), get_stage("sequential"))
    before = sorted(cache_dir.glob("k-*.so"))
    cpu.compile(source("sequential"), get_stage("sequential"))
    assert sorted(cache_dir.glob("k-*.so")) == before


def test_thread_sanitizer_hook_names_are_pinned(cpu: CpuBackend, cache_dir: Path) -> None:
    """GCC's hook names are a de-facto ABI: an instrumented kernel must need exactly hooks the runtime has."""
    probe = cache_dir / "probe.cpp"
    probe.write_text(rewrite_shared(
        "__global__ void k(const float *a, float *b, unsigned int n) {\n"
        "  extern __shared__ float s[]; volatile float *v = s;\n"
        "  s[threadIdx.x] = a[threadIdx.x]; __syncthreads(); v[threadIdx.x] += v[threadIdx.x + 1];\n"
        "  double d = ((const double *)a)[1]; b[0] = (float)d + s[0]; ((char *)b)[5] = 1; ((short *)b)[3] = 2;\n"
        "}\n"
    ).text)
    subprocess.run(
        ["g++", *COMMON_FLAGS, *CHECK_FLAGS, "-include", str(RUNTIME_DIR / "ag_prelude.h"), "-I", str(RUNTIME_DIR),
         "-c", str(probe), "-o", str(cache_dir / "probe.o")],
        check=True,
    )
    needed = set(subprocess.run(["nm", "-u", str(cache_dir / "probe.o")], capture_output=True, text=True,
                                check=True).stdout.split())
    hooks = {name for name in needed if name.startswith(("__tsan_", "__sanitizer_"))}
    assert {"__tsan_read4", "__tsan_write4", "__tsan_volatile_read4", "__tsan_volatile_write4", "__tsan_read8",
            "__tsan_write1", "__tsan_write2", "__sanitizer_cov_trace_pc", "__tsan_init"} <= hooks
    exported = set(subprocess.run(["nm", "-D", "--defined-only", str(cpu.toolchain.runtime)], capture_output=True,
                                  text=True, check=True).stdout.split())
    assert hooks <= exported


# -- fibers, availability, isolation ----------------------------------------------------------------------------


def test_ucontext_fallback_runs_and_checks(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOGRADER_CPU_FIBERS", "ucontext")
    backend = CpuBackend(cache_dir=cache_dir)
    assert backend.fibers == "ucontext" and "ucontext" in backend.device().name
    kernel = backend.compile(source("shuffle"), get_stage("shuffle"))
    assert reduce(backend, kernel, np.ones(3001, np.float32), (3001,)) == 3001
    kernel = backend.compile(source("bug_missing_syncthreads"), get_stage("sequential"))
    reduce(backend, kernel, np.ones(1000, np.float32), (1000,))
    assert "race_syncthreads" in kinds(backend.findings())


def test_boost_context_fibers_are_used_where_installed(cpu: CpuBackend) -> None:
    if not Path("/usr/include/boost/context/detail/fcontext.hpp").exists():
        pytest.skip("Boost.Context is not installed here")
    assert cpu.fibers == "boost.context"


def test_no_compiler_means_backend_unavailable(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "no-such-compiler-g++")
    with pytest.raises(BackendUnavailable, match="g\\+\\+"):
        CpuBackend(cache_dir=cache_dir)


def test_unknown_schedule_is_refused(cache_dir: Path) -> None:
    with pytest.raises(ValueError, match="lockstep"):
        CpuBackend(schedule="sideways", cache_dir=cache_dir)


def test_a_backend_never_closed_leaves_no_folder_behind(cache_dir: Path, tmp_path: Path) -> None:
    """Its loaded kernels' folder goes when its process ends, closed or not (a test's or a script's backend)."""
    script = f"""
from autograder.backends.cpu import CpuBackend
from autograder.records import KernelSource
from autograder.stages import get_stage
backend = CpuBackend(cache_dir={str(cache_dir)!r})
backend.compile(KernelSource(open({str(kernel_path("shuffle"))!r}).read()), get_stage("shuffle"))
print(backend._folder)
"""
    environment = {**os.environ, "TMPDIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    folder = Path(run.stdout.split()[-1])
    assert folder.parent == tmp_path and not folder.exists()


def _launch_in_worker(backend: Backend, build: Build, blocks: int) -> float:
    kernel = backend.load(build)
    data, out = backend.upload(np.ones(4, np.float32)), backend.alloc(4)
    backend.fill(out, 0.0)
    backend.launch(kernel, (blocks, 1), (32, 1), 0, (data, out, 4))
    return float(backend.download(out, 1)[0])


def test_a_spin_wait_on_another_block_times_out_and_a_crash_is_a_fault(cache_dir: Path) -> None:
    with Worker("cpu", {"cache_dir": str(cache_dir)}, readable=(Path(__file__).parent,)) as worker:
        builder = Builder(worker.device, worker.sandbox, {"cache_dir": str(cache_dir)})

        def build(name: str) -> Build:
            return builder.build(get_stage("naive"), KernelSource((KERNELS / f"{name}.cu").read_text()))

        with pytest.raises(KernelTimeout):
            worker.call(_launch_in_worker, build("spin_wait"), 2, timeout=3)
        with pytest.raises(KernelFault):
            worker.call(_launch_in_worker, build("wild_pointer"), 1, timeout=120)
        assert worker.call(_launch_in_worker, build("printf_kernel"), 1, timeout=120) == 0.0


# -- legal CUDA that a course uses: every construct nvcc accepts gives the right sum -----------------------------

# (kernel file, stage): each kernel also compiles with nvcc (test_construct_kernels_compile_with_nvcc).
CONSTRUCTS = (
    ("textbook_file_scope_shared", "sequential"),  # extern __shared__ at file scope
    ("macro_shared", "sequential"),  # __shared__ declared through macros
    ("cg_tiles", "shuffle"),  # cooperative_groups.h, tiled_partition<32> and <16>, cg::reduce
    ("math_constants_max2d", "max2d"),  # math_constants.h: -CUDART_INF_F as the identity of a max
    ("toolkit_vector_loads", "open"),  # __restrict__, __ldg, float4, template<unsigned int blockSize>, ...
    ("toolkit_warp_intrinsics", "shuffle"),  # warpSize, __activemask, __reduce_add_sync, atomicMax on int, ...
    ("samples_style", "open"),  # the CUDA samples' SharedMemory<T>, template<class T, blockSize, nIsPow2>, cg
    ("half_precision_headers", "shuffle"),  # cuda_fp16.h and cuda_bf16.h: rounding as on a GPU
    ("unusual_spellings", "sequential"),  # <% %>, [[maybe_unused]] on extern __shared__, 1'024
    ("cache_hints_and_index_intrinsics", "first_add"),  # __umul24, __mul24, __ldcg, __stcg, __funnelshift_l, ...
    ("warp_match", "shuffle"),  # __match_any_sync on unsigned and float values, __match_all_sync
    ("shared_struct_types", "sequential"),  # __shared__ struct { ... } name; and __shared__ struct Slot { ... } a[2];
    ("vector_headers", "open"),  # vector_types.h and vector_functions.h: float4 and make_float4 named by their headers
)


@pytest.mark.parametrize("name, stage_id", CONSTRUCTS)
def test_legal_cuda_constructs_give_the_right_result_with_no_findings(
    cpu: CpuBackend, name: str, stage_id: str
) -> None:
    stage = get_stage(stage_id)
    kernel = cpu.compile(source(name), stage)
    rng = np.random.default_rng(11)
    cases = [(n,) for n in (1, 31, 256, 257, 1000, 70_001)] if stage.shape is Shape.SUM_1D else list(MAX2D_CASES)
    for size in cases:
        data = rng.integers(-8, 9, math.prod(size)).astype(np.float32)
        expected = float(data.sum()) if stage.shape is Shape.SUM_1D else float(data.max())
        assert reduce(cpu, kernel, data, size) == expected, f"{name} size {size}"
    assert cpu.findings() == ()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (it compiles without a GPU)")
@pytest.mark.parametrize("name", [name for name, _ in CONSTRUCTS])
def test_construct_kernels_compile_with_nvcc(tmp_path: Path, name: str) -> None:
    """The CPU backend accepts these because nvcc does: the same source compiles to PTX."""
    compiled = subprocess.run(
        ["nvcc", "-arch=sm_90", "-ptx", "-o", str(tmp_path / "k.ptx"), str(kernel_path(name))],
        capture_output=True, text=True,
    )
    assert compiled.returncode == 0, compiled.stderr


def test_shared_memory_declared_through_a_macro_is_checked_on_the_students_lines(cpu: CpuBackend) -> None:
    # Without the barrier after the load, thread 0 reads sdata[128] before thread 128 stores it: the race is
    # found, so the macro's array was rewritten into the checked arena, and its lines are the student's.
    text = source("macro_shared").text.replace(
        "sdata[tid] = (i < n) ? g_in[i] : 0.0f;\n    __syncthreads();", "sdata[tid] = (i < n) ? g_in[i] : 0.0f;\n"
    )
    kernel = cpu.compile(KernelSource(text, LOCATION), get_stage("sequential"))
    reduce(cpu, kernel, np.ones(1000, np.float32), (1000,))
    [race] = [f for f in cpu.findings() if f.kind == "race_syncthreads"]
    assert race.line == cell_line("macro_shared", "sdata[tid] = (i < n)")
    tree = cell_line("macro_shared", "if (tid < s) sdata[tid] += sdata[tid + s]")
    assert f"reads it at line {tree}" in race.message and "sdata[128]" in race.message
    with pytest.raises(CompileError) as error:
        cpu.compile(KernelSource(text.replace("DECL(copy);", "DECL(copy) oops;"), LOCATION), get_stage("sequential"))
    assert error.value.messages[0].line == cell_line("macro_shared", "DECL(copy);")


SIZES_IN_FRESH_PROCESS = (200, 1000, 70_001)


def _grade_in_fresh_process(cache_dir: Path, names: list[tuple[str, str]]) -> dict[str, str]:
    """Each kernel's sums and findings, graded one after another in a new process, as a fresh worker does."""
    script = f"""
import json, sys
import numpy as np
from pathlib import Path
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_cpu_backend import reduce, source
from autograder.backends.cpu import CpuBackend
from autograder.stages import get_stage
cpu = CpuBackend(cache_dir={str(cache_dir)!r})
results = {{}}
for name, stage_id in {names!r}:
    kernel = cpu.compile(source(name), get_stage(stage_id))
    sums = [reduce(cpu, kernel, np.arange(n, dtype=np.float32) % 7, (n,)) for n in {SIZES_IN_FRESH_PROCESS!r}]
    findings = sorted((f.kind, f.line or 0, f.message) for f in cpu.findings())
    results[name] = repr((sums, findings))
print(json.dumps(results))
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_every_kernel_runs_in_a_state_no_earlier_kernel_changed(cache_dir: Path) -> None:
    # File-scope extern __shared__ first in a fresh process crashed; leftovers of shared memory and of static
    # __shared__ allocations changed what later kernels saw. Both orders must give the same, right, results.
    names = [
        ("textbook_file_scope_shared", "sequential"),
        ("bug_uninitialised", "sequential"),
        ("namespace_shared", "sequential"),
        ("bug_static_shared_overrun", "sequential"),
        ("macro_shared", "sequential"),
    ]
    forward = _grade_in_fresh_process(cache_dir, names)
    backward = _grade_in_fresh_process(cache_dir, names[::-1])
    assert forward == backward
    sums = [float((np.arange(n) % 7).sum()) for n in SIZES_IN_FRESH_PROCESS]
    assert forward["textbook_file_scope_shared"] == repr((sums, []))


# -- what the checks must catch: barriers part of the block skips, plain accesses racing with atomics --------

# (kernel file, stage, the lines of the divergent barriers)
DIVERGENT_BARRIERS = (
    ("bug_barrier_in_branch", "sequential", ("__syncthreads();\n        }",)),
    ("bug_barrier_early_return", "sequential", ("__syncthreads();\n    for",)),
    ("bug_barrier_if_else", "sequential", ("__syncthreads();\n    } else", "__syncthreads();\n    }\n    for")),
    ("bug_barrier_uneven_loop", "first_add", ("__syncthreads();\n    }\n    sdata", "__syncthreads();\n    for")),
    ("bug_barrier_last_warp", "unrolled_warp", ("__syncthreads();\n        }\n    }",)),
)


@pytest.mark.parametrize("name, stage_id, barriers", DIVERGENT_BARRIERS)
def test_a_barrier_that_part_of_the_block_skips_is_barrier_divergence(
    cpu: CpuBackend, name: str, stage_id: str, barriers: tuple[str, ...]
) -> None:
    kernel = cpu.compile(source(name), get_stage(stage_id))
    # The sum is right, as on an H200: only the finding tells.
    assert reduce(cpu, kernel, np.ones(1000, np.float32), (1000,)) == 1000
    found = [f for f in cpu.findings() if f.kind == "barrier_divergence"]
    assert {f.line for f in found} == {cell_line(name, text) for text in barriers}
    assert "was reached by only" in found[0].message and "undefined in CUDA" in found[0].message


def test_barriers_in_branches_that_the_whole_block_takes_are_not_divergence(cpu: CpuBackend) -> None:
    kernel = cpu.compile(source("barrier_uniform_branch"), get_stage("sequential"))
    assert reduce(cpu, kernel, np.ones(1000, np.float32), (1000,)) == 1000
    assert cpu.findings() == ()


def test_a_deadlock_is_not_also_reported_as_barrier_divergence(cpu: CpuBackend) -> None:
    kernel = cpu.compile(source("bug_deadlock"), get_stage("shuffle"))
    data, out = cpu.upload(np.ones(32, np.float32)), cpu.alloc(1)
    with pytest.raises(KernelFault):
        cpu.launch(kernel, (1, 1), (32, 1), 0, (data, out, 32))
    assert cpu.findings() == ()


# (kernel file, stage, kind, the line of the access found racing, the line of the access it races with)
ATOMIC_RACES = (
    ("bug_atomic_after_plain_init", "sequential", "race_interblock", "atomicAdd(&g_out[0]", "g_out[0] = 0.0f"),
    ("bug_atomic_plain_read", "sequential", "race_interblock", "atomicAdd(&g_out[0]", "g_out[0] != g_out[0]"),
    ("bug_shared_counter_syncwarp", "shuffle", "race_syncthreads", "atomicAdd(&total", "total = 0.0f"),
)


@pytest.mark.parametrize("name, stage_id, kind, racing, earlier", ATOMIC_RACES)
def test_a_plain_access_racing_with_atomics_of_other_threads_is_found(
    cpu: CpuBackend, name: str, stage_id: str, kind: str, racing: str, earlier: str
) -> None:
    # In each, the plain access comes first and atomics of its own block follow it before the racing ones: a
    # shadow that kept only the last access saw two atomics and nothing else.
    kernel = cpu.compile(source(name), get_stage(stage_id))
    n = 256 * 12
    data, out = cpu.upload(np.ones(n, np.float32)), cpu.alloc(12)
    cpu.fill(out, 0.0)
    cpu.launch(kernel, (12, 1), (256, 1), 1024, (data, out, n))
    [race] = [f for f in cpu.findings() if f.kind == kind]
    assert race.line == cell_line(name, racing)
    assert f"at line {cell_line(name, earlier)}" in race.message and "atomically updates" in race.message


# -- the contract's exact signature: both backends accept exactly the same kernels -------------------------------

SEQUENTIAL_SIGNATURE = "__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)"
# (what replaces the reference's signature, whether it is the contract's). A backend looks the kernel up by its
# C++ symbol, which encodes the parameter types (Stage.mangled_name), then by the plain name of an extern "C"
# kernel, whose types the compiler checks (autograder.build); top-level qualifiers (__restrict__, const on the
# parameter itself) are not part of the type.
SIGNATURES = (
    ("__global__ void reduce_sequential(const float *g_in, float *g_out, int n)", False),
    ("__global__ void reduce_sequential(const float *g_in, float *g_out, size_t n)", False),
    ("__global__ void reduce_sequential(float *g_in, float *g_out, unsigned int n)", False),
    ("__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n, int extra)", False),
    ("template <int B> __global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)", False),
    ("__global__ void reduce_sequential(const float *__restrict__ g_in, float *__restrict__ g_out, "
     "const unsigned int n)", True),
    ('extern "C" __global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)', True),
    ('extern "C" __global__ void reduce_sequential(const float *__restrict__ g_in, float *__restrict__ g_out, '
     "const unsigned int n)", True),
    # C linkage: a symbol with no types, launched with the contract's, would read these differently on each backend.
    ('extern "C" __global__ void reduce_sequential(const float *g_in, float *g_out, int n)', False),
    ('extern "C" __global__ void reduce_sequential(const float *g_in, float *g_out, size_t n)', False),
    ('extern "C" __global__ void reduce_sequential(const double *g_in, float *g_out, unsigned int n)', False),
    ("typedef unsigned long long count_t;\n"
     'extern "C" __global__ void reduce_sequential(const float *g_in, float *g_out, count_t n)', False),
)


def _with_signature(signature: str) -> str:
    text = kernel_path("sequential").read_text()
    assert SEQUENTIAL_SIGNATURE in text
    text = text.replace(SEQUENTIAL_SIGNATURE, signature)
    if signature.startswith("template"):
        text += "template __global__ void reduce_sequential<1>(const float *, float *, unsigned int);\n"
    return text


def _builds(device: DeviceInfo, sandbox: Sandbox, options: dict, signature: str) -> bool:
    """Whether the grader's build (autograder.build.Builder) accepts the kernel; a refusal names the contract, on
    the kernel's line."""
    stage = get_stage("sequential")
    source = KernelSource(_with_signature(signature), LOCATION)
    try:
        Builder(device, sandbox, options).build(stage, source)
    except CompileError as error:
        assert str(error) == stage.wrong_parameters_message()
        line = next(number for number, text in enumerate(source.text.splitlines(), 1) if "reduce_sequential(" in text)
        assert [message.line for message in error.messages] == [source.cell_line(line)]
        return False
    return True


@pytest.mark.parametrize("signature, accepted", SIGNATURES)
def test_only_the_contracts_exact_parameter_types_are_accepted(
    cpu: CpuBackend, cache_dir: Path, signature: str, accepted: bool
) -> None:
    with Worker("cpu", {"cache_dir": str(cache_dir)}) as worker:
        assert _builds(worker.device, worker.sandbox, {"cache_dir": str(cache_dir)}, signature) == accepted
    if accepted:
        kernel = cpu.compile(KernelSource(_with_signature(signature), LOCATION), get_stage("sequential"))
        assert reduce(cpu, kernel, np.ones(1000, np.float32), (1000,)) == 1000


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (it compiles without a GPU)")
@pytest.mark.parametrize("signature, accepted", SIGNATURES)
def test_nvcc_builds_accept_exactly_the_kernels_the_cpu_accepts(signature: str, accepted: bool) -> None:
    device = DeviceInfo("gpu", "nvcc", compute_capability="9.0")
    assert _builds(device, Sandbox(), {}, signature) == accepted


def test_a_wrong_kernel_is_named_on_its_line_as_the_compiler_counts_lines(cache_dir: Path) -> None:
    """Characters Python takes for line ends (U+2028, U+2029, U+0085) in a comment are no line end to a compiler."""
    source = KernelSource("// notes\u2028with\u2029odd\u0085breaks\n" + _with_signature(SEQUENTIAL_SIGNATURE).replace(
        "reduce_sequential(", "reduce_sequentail(", 1), LOCATION)
    line = source.text.split("\n").index(next(text for text in source.text.split("\n") if "reduce_sequentail(" in text))
    with Worker("cpu", {"cache_dir": str(cache_dir)}) as worker, pytest.raises(CompileError) as error:
        Builder(worker.device, worker.sandbox, {"cache_dir": str(cache_dir)}).build(get_stage("sequential"), source)
    assert [message.line for message in error.value.messages] == [source.cell_line(line + 1)]


def test_the_precompiled_prelude_changes_no_instruction_and_a_changed_one_is_made_again(
    cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """g++ reads the prelude precompiled (most of a small kernel's compile time): the code is the same as from
    the header itself, and a .gch that is not as it was built is never used but made again."""
    toolchain = prepare_toolchain(cache=tmp_path)
    preludes = precompiled_preludes(toolchain)
    assert set(preludes) == {"fast", "checked"}
    stage = get_stage("shuffle")

    def code(cache: Path) -> list[str]:
        built = compile_kernel(replace(toolchain, cache=cache), source("shuffle"), stage, Sandbox())
        return [
            subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-j", ".text", str(path)], capture_output=True,
                           text=True, check=True).stdout.split("\n", 3)[3]
            for path in (built.checked, built.fast)
        ]

    with_prelude = code(tmp_path)
    monkeypatch.setattr(compiler, "precompiled_preludes", lambda _: {})
    other = tmp_path / "plain"
    other.mkdir()
    assert code(other) == with_prelude
    monkeypatch.undo()
    gch = preludes["checked"] / "ag_prelude.h.gch"
    changed = bytearray(gch.read_bytes())
    changed[len(changed) // 2] ^= 0xFF
    gch.write_bytes(changed)
    assert precompiled_preludes(toolchain)["checked"] == preludes["checked"]
    assert gch.read_bytes() != changed


def test_a_launch_whose_checks_the_machine_refuses_is_a_grader_failure_never_a_pass(cache_dir: Path) -> None:
    """A buffer's shadow (what its races and bounds are checked against) is mapped at its first checked access;
    where the machine refuses that address space (here RLIMIT_DATA, as a small machine's overcommit rule would),
    the launch is the grader's failure, not a launch that passed with its checks skipped."""
    script = f"""
import resource
import numpy as np
from autograder.backends.cpu import CpuBackend
from autograder.errors import BackendUnavailable
from autograder.records import KernelSource
from autograder.stages import get_stage
backend = CpuBackend(cache_dir={str(cache_dir)!r})
kernel = backend.compile(KernelSource(open({str(kernel_path("naive"))!r}).read()), get_stage("naive"))
resource.setrlimit(resource.RLIMIT_DATA, (2 << 30, 2 << 30))
for count in (1 << 16, 1 << 26):
    data, out = backend.alloc(count), backend.alloc(count // 256)
    backend.fill(data, 1.0)
    backend.run_only([0, count // 256 - 1])
    try:
        backend.launch(kernel, (count // 256, 1), (256, 1), 1024, (data, out, count))
        print(count, "ran", backend.download(out, 1)[0])
    except BackendUnavailable as error:
        print(count, "refused", error)
    backend.free(data)
    backend.free(out)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    small, large = run.stdout.splitlines()
    assert small == "65536 ran 256.0"
    assert large.startswith("67108864 refused the CPU backend could not check reduce_naive: could not map the shadow")
    assert "were not checked" in large


@pytest.fixture(scope="module", params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def either(request: pytest.FixtureRequest, cpu: CpuBackend) -> Iterator[Backend]:
    """The CPU backend, and on the GPU machine a real GPU too: the tests that say the CPU backend answers as a GPU
    does run the same kernel on both."""
    if request.param == "cpu":
        yield cpu
        return
    from autograder.backends.gpu import GpuBackend

    try:
        gpu = GpuBackend()
    except BackendUnavailable as error:
        pytest.skip(str(error))
    yield gpu
    gpu.close()


def test_the_exact_intrinsics_give_a_gpu_s_answers_for_nan_and_values_out_of_range(either: Backend) -> None:
    """x86 answers these otherwise (a conversion out of range gives 0x80000000), so a kernel could tell the CPU
    backend from a GPU by them and keep its cheats to the GPU (red team). The GPU's answers are PTX cvt's: .sat
    flushes NaN to +0; a conversion to an integer saturates, and NaN converts to 0. The gpu-marked case runs the
    kernel on a real GPU against the same expected bits."""
    code = r"""
__global__ void reduce_naive(const float *g_in, float *g_out, unsigned int n) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    float nan = g_in[0], big = g_in[1], small = g_in[2], half = g_in[3], huge = g_in[4], zero = g_in[5];
    g_out[0] = __saturatef(nan);
    g_out[1] = __saturatef(-half);
    g_out[2] = __saturatef(3.0f * half);
    g_out[3] = __int_as_float(__float2int_rz(nan));
    g_out[4] = __int_as_float(__float2int_rz(big));
    g_out[5] = __int_as_float(__float2int_rz(small));
    g_out[6] = __int_as_float(__float2int_rn(nan));
    g_out[7] = __int_as_float(__float2int_rn(big));
    g_out[8] = __int_as_float(__float2int_rn(small));
    g_out[9] = __int_as_float(__float2int_rn(5.0f * half));
    g_out[10] = __uint_as_float(__float2uint_rn(nan));
    g_out[11] = __uint_as_float(__float2uint_rn(huge));
    g_out[12] = __uint_as_float(__float2uint_rn(small));
    g_out[13] = __uint_as_float(__float2uint_rn(-half));
    g_out[14] = __int_as_float(__float2int_rz(-2.5f * half));
}
"""
    kernel = either.compile(KernelSource(code), get_stage("naive"))
    inputs = np.array([np.nan, 3e9, -3e9, 0.5, 5e9, 0.0], np.float32)
    data, out = either.upload(inputs), either.alloc(15)
    try:
        either.launch(kernel, (1, 1), (32, 1), 128, (data, out, inputs.size))
        got = either.download(out).view(np.uint32).tolist()
    finally:
        either.free(data)
        either.free(out)
    int_bits = [value & 0xFFFFFFFF for value in (0, 2**31 - 1, -(2**31), 0, 2**31 - 1, -(2**31), 2)]
    floats = np.array([0.0, 0.0, 1.0], np.float32).view(np.uint32).tolist()
    assert got == [*floats, *int_bits, 0, 0xFFFFFFFF, 0, 0, (-1) & 0xFFFFFFFF]


def test_a_copy_of_a_size_the_compiler_cannot_see_is_checked(cpu: CpuBackend) -> None:
    """g++ leaves memcpy and memmove of such a size to the C library; the instrumented build calls the runtime's
    checked copies instead, so a copy past the input's end is out of bounds like any read."""
    code = r"""
__global__ void reduce_naive(const float *g_in, float *g_out, unsigned int n) {
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x, i = blockIdx.x * blockDim.x + tid;
    float v[2] = {0.0f, 0.0f};
    if (i < n) memcpy(v, g_in + i, (blockDim.x >> 6) * (tid == 0 && blockIdx.x == gridDim.x - 1 ? 2u : 1u));
    sdata[tid] = v[0];
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid == 0) g_out[blockIdx.x] = sdata[0];
}
"""
    kernel = cpu.compile(KernelSource(code.replace("? 2u : 1u", "? 1u : 1u")), get_stage("naive"))
    cpu.findings()
    reduce_unchecked(cpu, kernel, np.ones(257, np.float32), (257,))
    assert cpu.findings() == ()
    kernel = cpu.compile(KernelSource(code), get_stage("naive"))
    reduce_unchecked(cpu, kernel, np.ones(257, np.float32), (257,))
    found = [finding for finding in cpu.findings() if finding.kind == "out_of_bounds"]
    assert found and found[0].line == 6, found


@pytest.mark.parametrize("value, expected", [
    (2147483648.0, 2**31 - 1), (-2147483648.0, -(2**31)), (-2147483904.0, -(2**31)), (float("inf"), 2**31 - 1),
    (float("-inf"), -(2**31)), (-0.4, 0), (0.5, 0), (1.5, 2), (-2.5, -2),
])
def test_a_float_converted_to_an_integer_rounds_and_saturates_as_on_a_gpu(either: Backend, value, expected) -> None:
    code = r"""
__global__ void reduce_naive(const float *g_in, float *g_out, unsigned int n) {
    if (blockIdx.x == 0 && threadIdx.x == 0) g_out[0] = __int_as_float(__float2int_rn(g_in[0]));
}
"""
    kernel = either.compile(KernelSource(code), get_stage("naive"))
    data, out = either.upload(np.array([value], np.float32)), either.alloc(1)
    try:
        either.launch(kernel, (1, 1), (32, 1), 128, (data, out, 1))
        assert int(either.download(out).view(np.int32)[0]) == expected
    finally:
        either.free(data)
        either.free(out)


def _counting_compiler(folder: Path) -> tuple[Path, Path]:
    """A g++ that writes a line to its log for each call, and the log."""
    log = folder / "calls.log"
    wrapper = folder / "g++"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {shutil.which("g++")} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, log


def _compiles(log: Path) -> list[str]:
    """The compiler's calls in its log, less those that only ask its version."""
    return [line for line in log.read_text().splitlines() if line != "-dumpfullversion"] if log.exists() else []


def _runtime_builds(log: Path) -> int:
    return sum("ag_runtime.cpp" in line for line in _compiles(log))


def test_graders_starting_together_on_a_fresh_machine_build_the_runtime_once(tmp_path: Path) -> None:
    # Sixteen grading processes of a class each started two workers at once, and each built the runtime for itself:
    # 32 compiles of 3 core-seconds at a class's start, before any kernel compiled.
    wrapper, log = _counting_compiler(tmp_path)
    cache = tmp_path / "cache"
    program = (
        "import sys; from pathlib import Path; from autograder.backends.cpu.compiler import prepare_toolchain; "
        "print(prepare_toolchain('ucontext', Path(sys.argv[1]), sys.argv[2]).runtime)"
    )
    graders = [
        subprocess.Popen([sys.executable, "-c", program, str(cache), str(wrapper)], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    runtimes = {grader.communicate(timeout=300)[0].strip() for grader in graders}
    assert all(grader.returncode == 0 for grader in graders)
    assert len(runtimes) == 1 and Path(runtimes.pop()).is_file()
    assert _runtime_builds(log) == 1


def test_a_runtime_this_machine_cannot_build_is_tried_once_not_at_every_workers_start(tmp_path: Path) -> None:
    # Without Boost's archive the first variant fails; each start of a worker, in each grading process, tried it
    # again (a compile of a second or more), one after another once the build is one grader's at a time.
    real = shutil.which("g++")
    log = tmp_path / "calls.log"
    wrapper = tmp_path / "g++"
    fails_boost = 'case "$*" in *AG_REQUIRE_BOOST*) exit 1;; esac'
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\n{fails_boost}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    for _ in range(3):
        toolchain = prepare_toolchain("auto", tmp_path / "cache", str(wrapper))
        assert toolchain.fibers == "ucontext"
    assert _runtime_builds(log) == 3  # the two Boost variants failed once each, and ucontext was built once


def test_a_class_builds_the_cpu_backend_before_its_processes_ask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The class's host builds the runtime and the precompiled preludes while its processes start
    # (autograder.batch): a grading process then finds them made, and compiles neither.
    from autograder import batch
    from autograder.grade import GradeOptions

    wrapper, log = _counting_compiler(tmp_path)
    monkeypatch.setenv("CXX", str(wrapper))
    monkeypatch.delenv("AUTOGRADER_CPU_FIBERS", raising=False)
    cache = tmp_path / "cache"
    options = GradeOptions(backend="cpu", backend_options={"cache_dir": str(cache), "fibers": "ucontext"})
    with batch._ahead(partial(batch._build_cpu_backend, options)):
        pass  # the class's grading
    made = _compiles(log)
    assert _runtime_builds(log) == 1 and len(made) == 3  # the runtime, and a prelude for each build
    toolchain = prepare_toolchain("ucontext", cache)  # a grading process
    assert set(precompiled_preludes(toolchain)) == {"fast", "checked"}
    assert _compiles(log) == made


def test_a_build_too_large_to_inspect_is_the_kernels_compile_error(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Names spelled out can grow without bound (templates nested deep), so what nm writes of a build is limited;
    # past the limit the build is the kernel's compile error, never the grader's failure. The limit is lowered
    # here to what a reference kernel's imports already pass.
    monkeypatch.setattr(compiler, "INSPECT_LIMITS", replace(compiler.INSPECT_LIMITS, file_bytes=64))
    text = f"// {os.getpid()} too large\n{reference_source('naive').text}"
    with pytest.raises(CompileError, match="too large to check: its symbols, listed, pass 64 bytes"):
        compile_kernel(prepare_toolchain(cache=cache_dir), KernelSource(text), get_stage("naive"), Sandbox())
