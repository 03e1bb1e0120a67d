"""The GPU backend (PyCUDA): compiling, buffers, whole reductions through launch.Plan, faults and timing.

Tests marked `gpu` skip where PyCUDA or a device is missing (tests/conftest.py). The parsing of nvcc's
output needs neither and runs everywhere. On the GPU machine: scripts/gpu-setup.sh, then `pytest -m gpu`.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from autograder import errors
from autograder.backends.base import Backend, Kernel
from autograder.backends.gpu import NVCC_OPTIONS, find_nvcc, parse_nvcc_output
from autograder.launch import Plan
from autograder.records import KernelSource, SourceLocation
from autograder.stages import MAX2D_BASELINE, STAGES, Shape, Stage, get_stage

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_KERNELS = ROOT / "solutions" / "reduction" / "kernels"
BLOCK_SIZE = 256
SUM_TEST_SIZES = (1, 2, 31, 32, 33, 255, 256, 257, 1000, 65535, 65537, 1_000_003)
MAX2D_TEST_SHAPES = ((1, 1), (2, 1), (1, 1000), (1000, 1), (3, 3), (31, 33), (257, 255), (4097, 3))

SEQUENTIAL = get_stage("sequential")

# A sequential-addressing kernel of our own, so the tests do not depend on the reference kernels.
SEQUENTIAL_SOURCE = """\
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }
    if (tid == 0) {
        g_out[blockIdx.x] = sdata[0];
    }
}
"""


def cell_source(text: str, stage: Stage, first_line: int = 1) -> KernelSource:
    return KernelSource(text, SourceLocation("test.ipynb", stage.id, 0, first_line))


def integer_data(count: int, seed: int) -> np.ndarray:
    """Small integer-valued floats: every partial sum stays exact in float32."""
    return np.random.default_rng(seed).integers(0, 4, count).astype(np.float32)


def reduce_with(backend: Backend, kernel: Kernel, data: np.ndarray, size: tuple[int, ...], *, checked: bool) -> float:
    plan = Plan.create(backend, kernel, size, BLOCK_SIZE)
    try:
        plan.load(data)
        plan.poison()
        findings = plan.run(check_each_pass=checked)
        assert findings == ()
        return plan.result()
    finally:
        plan.release()


def reference_source(stage: Stage) -> KernelSource:
    path = REFERENCE_KERNELS / f"{stage.id}.cu"
    if not path.exists():
        pytest.skip(f"no reference kernel {path.relative_to(ROOT)} yet")
    return cell_source(path.read_text(), stage)


@pytest.fixture(scope="module")
def backend() -> Iterator[Backend]:
    from autograder.backends.gpu import GpuBackend

    try:
        gpu = GpuBackend()
    except errors.BackendUnavailable as error:
        pytest.skip(str(error))
    yield gpu
    gpu.close()


@pytest.fixture(scope="module")
def sequential(backend: Backend) -> Kernel:
    return backend.compile(cell_source(SEQUENTIAL_SOURCE, SEQUENTIAL), SEQUENTIAL)


# --- nvcc's output, parsed (no GPU needed) ----------------------------------------------------------------


def test_nvcc_errors_name_the_cell_line() -> None:
    output = textwrap.dedent("""\
        kernel.cu(4): error: expected a ";"
              undefined_thing = 2;
              ^

        kernel.cu(7): error: identifier "sdta" is undefined

        2 errors detected in the compilation of "kernel.cu".
        """)
    messages = parse_nvcc_output(output, cell_source("", SEQUENTIAL, first_line=10))
    assert [(m.severity, m.line, m.text) for m in messages] == [
        ("error", 13, 'expected a ";"'),
        ("error", 16, 'identifier "sdta" is undefined'),
    ]


def test_the_grader_s_nvcc_options_round_a_product_before_adding_it(tmp_path: Path) -> None:
    # A fused multiply-add rounds once on a GPU and twice on the CPU analysis: a kernel could tell them apart by it.
    nvcc = find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    (tmp_path / "kernel.cu").write_text("__global__ void k(const float *a, float *o) { o[0] = a[0] * a[1] + a[2]; }\n")
    argv = [nvcc, "-ptx", "-arch=sm_90", *NVCC_OPTIONS, "-o", "kernel.ptx", "kernel.cu"]
    subprocess.run(argv, cwd=tmp_path, check=True, capture_output=True)
    ptx = (tmp_path / "kernel.ptx").read_text()
    assert "fma" not in ptx and "mul.rn.f32" in ptx and "add.rn.f32" in ptx


def test_nvcc_warnings_and_tool_messages() -> None:
    output = textwrap.dedent("""\
        kernel.cu(4): warning #177-D: variable "unused" was declared but never referenced
              int unused = 3;
                  ^

        Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"

        ptxas warning : Registers are spilled to local memory in function '_Z12reduce_naivePKfPfj'
        """)
    messages = parse_nvcc_output(output, KernelSource(""))
    assert [(m.severity, m.line) for m in messages] == [("warning", 4), ("warning", None)]
    assert messages[0].text == 'variable "unused" was declared but never referenced'
    assert "Registers are spilled" in messages[1].text


# --- compiling ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_device_info(backend: Backend) -> None:
    info = backend.device()
    versions = dict(info.versions)
    assert info.backend == "gpu" and info.name
    assert info.compute_capability and info.l2_bytes and info.l2_bytes > 0
    assert {"cuda_driver", "cuda_runtime", "pycuda", "nvcc"} <= versions.keys()
    assert backend.findings() == ()


@pytest.mark.gpu
def test_compile_error_names_the_cell_line(backend: Backend, capfd: pytest.CaptureFixture[str]) -> None:
    broken = SEQUENTIAL_SOURCE.replace("__syncthreads();\n    for", "__syncthreads();\n    sdta[0] = 1;\n    for", 1)
    broken_line = broken.splitlines().index("    sdta[0] = 1;") + 1
    with pytest.raises(errors.CompileError) as caught:
        backend.compile(cell_source(broken, SEQUENTIAL, first_line=5), SEQUENTIAL)
    error_lines = [m.line for m in caught.value.messages if m.severity == "error"]
    assert error_lines == [broken_line + 4]
    assert f"line {broken_line + 4}" in str(caught.value)
    assert "sdta" in caught.value.log
    assert capfd.readouterr() == ("", "")


@pytest.mark.gpu
def test_warnings_are_data_not_stderr(backend: Backend, capfd: pytest.CaptureFixture[str]) -> None:
    noisy = SEQUENTIAL_SOURCE.replace("    extern __shared__", "    int unused = 7;\n    extern __shared__", 1)
    source = cell_source(noisy, SEQUENTIAL, first_line=3)
    first = backend.compile(source, SEQUENTIAL)
    again = backend.compile(source, SEQUENTIAL)  # from the cache: the same warnings
    for kernel in (first, again):
        assert [(m.severity, m.line) for m in kernel.warnings] == [("warning", 3 + 3 - 1)]
        assert "unused" in kernel.warnings[0].text
    assert capfd.readouterr() == ("", "")


@pytest.mark.gpu
def test_extern_c_kernels_and_template_helpers_are_found(backend: Backend) -> None:
    templated = "template <typename T> __device__ T twice(T x) { return x + x; }\n" + SEQUENTIAL_SOURCE.replace(
        "sdata[0];", "twice(sdata[0]) * 0.5f;"
    )
    plain = 'extern "C" ' + SEQUENTIAL_SOURCE
    data = integer_data(5000, seed=1)
    for text in (templated, plain):
        kernel = backend.compile(cell_source(text, SEQUENTIAL), SEQUENTIAL)
        assert reduce_with(backend, kernel, data, (data.size,), checked=True) == data.sum()


@pytest.mark.gpu
def test_wrong_signature_or_name_is_a_compile_error(backend: Backend) -> None:
    signed = SEQUENTIAL_SOURCE.replace("unsigned int n", "int n")
    with pytest.raises(errors.CompileError, match="not with the contract's parameters"):
        backend.compile(cell_source(signed, SEQUENTIAL), SEQUENTIAL)
    renamed = SEQUENTIAL_SOURCE.replace("reduce_sequential", "reduce_seq")
    with pytest.raises(errors.CompileError, match="no kernel named reduce_sequential"):
        backend.compile(cell_source(renamed, SEQUENTIAL), SEQUENTIAL)


# --- buffers -----------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_write_fill_download_address_the_guard_tail(backend: Backend) -> None:
    buffer = backend.alloc(10, guard=6)
    try:
        backend.fill(buffer, float("nan"))
        backend.write(buffer, np.arange(4, dtype=np.float32), offset=3)
        backend.fill(buffer, -0.0, start=12, count=2)
        values = backend.download(buffer)
        assert values.shape == (16,)
        assert np.isnan(values[[0, 1, 2, 7, 8, 9, 10, 11, 14, 15]]).all()
        assert values[3:7].tolist() == [0, 1, 2, 3]
        assert np.signbit(values[12:14]).all() and (values[12:14] == 0).all()
        assert backend.download(buffer, 5)[3:].tolist() == [0, 1]
        with pytest.raises(ValueError):
            backend.write(buffer, np.zeros(4, dtype=np.float32), offset=13)
    finally:
        backend.free(buffer)


@pytest.mark.gpu
def test_a_freed_buffer_serves_the_next_allocation_of_its_size(backend: Backend, sequential: Kernel) -> None:
    # cuMemAlloc and cuMemFree take the driver's locks, which every process on the machine shares: a freed buffer
    # is kept for the next allocation of the same size, never of another (all are freed when the student ends).
    first = backend.alloc(1000, guard=24)
    backend.fill(first, 7.0)  # what a kernel of the last case left there
    handle = int(first.handle)
    backend.free(first)
    assert int(backend.alloc(1001, guard=24).handle) != handle
    again = backend.alloc(1000, guard=24)
    assert int(again.handle) == handle
    backend.free(again)
    # A whole reduction in the kept buffers is right: every buffer is filled before a kernel reads it.
    data = integer_data(1000, 5)
    assert reduce_with(backend, sequential, data, (1000,), checked=True) == data.sum()


# --- whole reductions through launch.Plan ------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("checked", [True, False], ids=["pass-by-pass", "queued"])
def test_whole_sum_over_sizes(backend: Backend, sequential: Kernel, checked: bool) -> None:
    for n in SUM_TEST_SIZES:
        data = integer_data(n, seed=n)
        assert reduce_with(backend, sequential, data, (n,), checked=checked) == data.sum(), f"n={n}"


@pytest.mark.gpu
def test_random_floats_match_a_float64_sum(backend: Backend, sequential: Kernel) -> None:
    data = np.random.default_rng(7).random(1_000_003, dtype=np.float32)
    got = reduce_with(backend, sequential, data, (data.size,), checked=False)
    assert math.isclose(got, float(data.astype(np.float64).sum()), rel_tol=1e-5)


@pytest.mark.gpu
def test_a_missing_bounds_check_reads_the_guard_tail(backend: Backend) -> None:
    unchecked = SEQUENTIAL_SOURCE.replace("(i < n) ? g_in[i] : 0.0f", "g_in[i]")
    kernel = backend.compile(cell_source(unchecked, SEQUENTIAL), SEQUENTIAL)
    data = integer_data(257, seed=3)
    assert reduce_with(backend, kernel, data[:256], (256,), checked=True) == data[:256].sum()
    assert math.isnan(reduce_with(backend, kernel, data, (257,), checked=True))


@pytest.mark.gpu
@pytest.mark.parametrize("stage", [s for s in STAGES if s.shape is Shape.SUM_1D], ids=lambda s: s.id)
def test_reference_sum_kernels(backend: Backend, stage: Stage) -> None:
    kernel = backend.compile(reference_source(stage), stage)
    for n in (*SUM_TEST_SIZES, 4_194_304 + 77):
        data = integer_data(n, seed=n)
        for checked in (True, False):
            assert reduce_with(backend, kernel, data, (n,), checked=checked) == data.sum(), f"n={n}"


@pytest.mark.gpu
@pytest.mark.parametrize("stage", [get_stage("max2d"), MAX2D_BASELINE], ids=lambda s: s.id)
def test_reference_max2d_kernels(backend: Backend, stage: Stage) -> None:
    kernel = backend.compile(reference_source(stage), stage)
    rng = np.random.default_rng(11)
    for width, height in MAX2D_TEST_SHAPES:
        data = rng.standard_normal((height, width)).astype(np.float32) - 100
        assert reduce_with(backend, kernel, data, (width, height), checked=True) == data.max(), (width, height)


# --- faults ------------------------------------------------------------------------------------------------

_FAULT_SCRIPT = """
import json
from autograder import errors
from autograder.backends.gpu import GpuBackend
from autograder.records import KernelSource
from autograder.stages import get_stage

stage = get_stage("naive")
source = KernelSource(
    "__global__ void reduce_naive(const float *g_in, float *g_out, unsigned int n)"
    "{ g_out[((size_t)1 << 38) + threadIdx.x] = g_in[0]; }"
)
backend = GpuBackend()
kernel = backend.compile(source, stage)
buffer = backend.alloc(256)
report = {}
try:
    backend.launch(kernel, (1, 1), (32, 1), 128, (buffer, buffer, 256))
    backend.synchronize()
except errors.KernelFault as fault:
    report["first"] = str(fault)
try:
    backend.download(buffer)
except errors.KernelFault as fault:
    report["after"] = str(fault)
backend.free(buffer)
backend.close()
print(json.dumps(report))
"""


@pytest.mark.gpu
def test_an_illegal_address_is_a_kernel_fault(backend: Backend) -> None:
    # In a child process: after the fault its CUDA context is unusable, as a grading worker's would be.
    child = subprocess.run([sys.executable, "-c", _FAULT_SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert "outside its buffers" in report["first"] and "illegal memory access" in report["first"]
    assert "restarted" in report["first"]
    assert report["after"] == report["first"]
    assert child.stderr == ""  # closing a faulted backend prints no PyCUDA clean-up warnings


@pytest.mark.gpu
def test_a_bad_launch_configuration_is_a_kernel_fault(backend: Backend, sequential: Kernel) -> None:
    buffer = backend.alloc(4096)
    try:
        with pytest.raises(errors.KernelFault, match="launching reduce_sequential"):
            backend.launch(sequential, (1, 1), (2048, 1), 2048 * 4, (buffer, buffer, 4096))
        backend.synchronize()  # the context is still usable
    finally:
        backend.free(buffer)


# --- timing ------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_elapsed_ms_of_a_whole_reduction(backend: Backend, sequential: Kernel) -> None:
    n = 1 << 24
    plan = Plan.create(backend, sequential, (n,), BLOCK_SIZE)
    try:
        plan.load(integer_data(n, seed=5))
        times = []
        for _ in range(5):
            plan.poison()
            backend.flush_l2()
            times.append(backend.elapsed_ms(plan.run))
            assert plan.result() == float(integer_data(n, seed=5).sum())
    finally:
        plan.release()
    median = float(np.median(times))
    # 64 MiB read at between 0.05 and 10 TB/s.
    assert 0.0067 < median < 1.4, times


@pytest.mark.gpu
def test_flush_l2_overwrites_twice_the_cache(backend: Backend) -> None:
    l2_bytes = backend.device().l2_bytes
    assert l2_bytes
    backend.flush_l2()  # allocates its buffer
    flush_ms = float(np.median([backend.elapsed_ms(backend.flush_l2) for _ in range(5)]))
    assert flush_ms > 0
    # Writing 2 x L2 faster than 20 TB/s would mean it did not write it all.
    assert 2 * l2_bytes / (flush_ms * 1e-3) < 20e12


@pytest.mark.gpu
def test_elapsed_ms_has_no_host_gaps(backend: Backend, sequential: Kernel) -> None:
    # The stream is held until the host has queued every pass, so a tiny reduction times the GPU alone:
    # two passes of a few microseconds each, not the tens of microseconds Python needs to launch them.
    assert backend.elapsed_ms(lambda: None) < 0.01
    plan = Plan.create(backend, sequential, (1000,), BLOCK_SIZE)
    try:
        plan.load(integer_data(1000, seed=9))
        times = []
        for _ in range(9):
            plan.poison()
            times.append(backend.elapsed_ms(plan.run))
        assert plan.result() == float(integer_data(1000, seed=9).sum())
    finally:
        plan.release()
    assert float(np.median(times)) < 0.03, times


@pytest.mark.gpu
def test_elapsed_each_times_only_the_timed_part_of_each_call(backend: Backend, sequential: Kernel) -> None:
    # A round: before each call the L2 is flushed (untimed, tens of microseconds), then a tiny reduction is
    # timed; each time is its call's alone, in order, with the flushes and the other calls outside it.
    plans = [Plan.create(backend, sequential, (size,), BLOCK_SIZE) for size in (1000, 1 << 24, 1000)]
    try:
        for index, plan in enumerate(plans):
            plan.load(integer_data(plan.count, seed=index))
        times = backend.elapsed_each([(backend.flush_l2, plan.run) for plan in plans] * 3)
        for index, plan in enumerate(plans):
            assert plan.result() == float(integer_data(plan.count, seed=index).sum())
    finally:
        for plan in plans:
            plan.release()
    small, large = times[0::3] + times[2::3], times[1::3]
    assert max(small) < 0.03 and min(large) > max(small), times


@pytest.mark.gpu
def test_elapsed_ms_gives_up_holding_when_the_work_waits(backend: Backend) -> None:
    from autograder.backends.gpu import HOLD_LIMIT_NS

    # No deadlock: the wait ends when the hold gives up, and the stall itself is not counted as GPU time.
    started = time.perf_counter()
    assert backend.elapsed_ms(backend.synchronize) < 1.0
    assert 0.9 * HOLD_LIMIT_NS / 1e9 < time.perf_counter() - started < 10
