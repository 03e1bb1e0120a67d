"""The GPU grading path on a real GPU: calibration, CUB in the same worker, and `autograder check`."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner
from expectations import EXAMPLES, unsampled_blocks

from autograder.calibration import cub_bandwidth, load_calibration, measure
from autograder.cli import cli
from autograder.grade import GradeOptions, grade_stages
from autograder.isolation import Worker
from autograder.launch import Plan
from autograder.records import KernelSource, PerfVerdict, Status
from autograder.references import reference_source
from autograder.rubric import load_rubric
from autograder.sandbox import Sandbox
from autograder.stages import get_stage

pytestmark = pytest.mark.gpu


def cub_then_reduce(backend) -> tuple[float | None, float, float]:
    """CUB through cupy first, then one of our reductions, in one process."""
    cub = cub_bandwidth(backend, 1 << 20)
    kernel = backend.compile(reference_source("shuffle"), get_stage("shuffle"))
    data = np.arange(100_003, dtype=np.float32) % 7
    plan = Plan.create(backend, kernel, (data.size,), 256)
    plan.load(data)
    plan.run(check_each_pass=True)
    return cub, plan.result(), float(data.astype(np.float64).sum())


def test_cupy_in_the_worker_leaves_our_kernels_working() -> None:
    pytest.importorskip("cupy")
    # The reference kernels only, compiled in the worker: a trusted worker, as in a calibration.
    with Worker("gpu", sandbox=Sandbox(False)) as worker:
        cub, got, expected = worker.call(cub_then_reduce, timeout=120)
    assert cub and cub > 100
    assert got == expected


def test_a_fresh_calibration_agrees_with_the_shipped_one() -> None:
    settings = load_rubric().timing
    with Worker("gpu", sandbox=Sandbox(False)) as worker:  # as `autograder calibrate` runs it
        shipped = load_calibration(worker.device.name, settings)
        if shipped is None:
            pytest.skip(f"no calibration shipped for {worker.device.name}")
        fresh = worker.call(measure, settings, 1, timeout=900)
    for stage_id, stage in shipped.stages.items():
        if stage.step_speedup:
            assert fresh.stages[stage_id].step_speedup == pytest.approx(stage.step_speedup, rel=0.04), stage_id


def test_check_gives_the_complete_hand_in_full_marks() -> None:
    result = CliRunner().invoke(cli, ["check", str(EXAMPLES / "alice.ipynb"), "--backend", "gpu"])
    assert result.exit_code == 0, result.output
    assert "alice: 100 / 100 points" in result.output


def test_a_stage_wrong_only_when_timed_loses_alone_and_the_others_are_still_timed() -> None:
    # One timing group holds all of a student's 1-D stages. first_add is right on every correctness size (at
    # most about 2^22) and wrong on the 2^26-value timing input, in one block that the timing size's sampled
    # blocks (autograder.at_scale) leave out: it alone becomes incorrect, the group is timed again without it,
    # and unrolled_warp's speedup is then taken over the reference first_add.
    options = GradeOptions(backend="gpu", seed=20261127)
    stages = ("naive", "anti_divergence", "sequential", "first_add", "unrolled_warp")
    sources = {stage: reference_source(stage) for stage in stages}
    first, last = unsampled_blocks(options, "first_add")  # about 2000 blocks: far more than the tolerance
    text = sources["first_add"].text
    store = "        g_out[blockIdx.x] = sdata[0];"
    assert store in text
    sources["first_add"] = replace(sources["first_add"], text=text.replace(store, store.replace(
        "= sdata[0]", f"= n > (1u << 24) && blockIdx.x >= {first} && blockIdx.x <= {last} ? 0.0f : sdata[0]")))
    results = {r.stage: r for r in grade_stages(sources, only=stages, options=options)}
    assert results["first_add"].status is Status.INCORRECT
    assert results["first_add"].message.startswith("your first_add: a warm-up call"), results["first_add"].message
    for stage in ("naive", "anti_divergence", "sequential", "unrolled_warp"):
        assert results[stage].status is Status.CORRECT, results[stage].message
        assert results[stage].performance.verdict is not PerfVerdict.NOT_MEASURED, results[stage].performance.reason
    assert results["sequential"].performance.baseline == "your anti_divergence"
    assert results["unrolled_warp"].performance.baseline == "reference first_add"


def _rewritten(stage_id: str, old: str, new: str) -> str:
    text = reference_source(stage_id).text
    assert old in text, f"{old!r} is not in the {stage_id} reference"
    return text.replace(old, new, 1)


# Correct CUDA that nvcc compiles: spellings the CPU backend's rewriting of shared memory once found hard, and an
# intrinsic its prelude does not have (a compile error there: __isGlobal).
UNUSUAL_SPELLINGS = {
    "attribute_on_shared": ("sequential", "extern __shared__ float sdata[];",
                            "[[maybe_unused]] extern __shared__ float sdata[];"),
    "digraph_brace": ("sequential", "unsigned int n)\n{", "unsigned int n)\n<%"),
    "address_space_query": ("naive", "    __syncthreads();\n", "    __syncthreads();\n    (void)__isGlobal(g_in);\n"),
}


@pytest.mark.parametrize("name", UNUSUAL_SPELLINGS)
def test_a_kernel_gets_the_cpu_backend_s_verdict_on_the_gpu_whatever_it_compiles(name: str) -> None:
    """The GPU path's race analysis builds every kernel with the CPU backend: a kernel that build refuses is
    that compile error on the GPU too, never a GPU verdict without the analysis (which a student could choose)."""
    stage_id, old, new = UNUSUAL_SPELLINGS[name]
    text = _rewritten(stage_id, old, new)
    if name == "digraph_brace":
        text = text.rstrip().removesuffix("}") + "%>\n"
    options = GradeOptions(quick=True, measure_speed=False)
    statuses = {}
    for backend in ("cpu", "gpu"):
        (result,) = grade_stages({stage_id: KernelSource(text)}, only=[stage_id],
                                 options=replace(options, backend=backend))
        statuses[backend] = (result.status, result.message if result.status is Status.COMPILE_ERROR else "")
    assert statuses["gpu"] == statuses["cpu"]
