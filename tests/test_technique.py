"""Each stage's technique, measured (autograder.technique): thresholds decided from the reference kernels, and
kernels of our own with and without the technique.

The reference measurements run the reference kernels on the CPU backend over the cases a GPU grading run analyses
on the CPU, at every block size the rubric allows; every threshold must pass the stage's reference kernel and
fail the previous stage's.
"""

from __future__ import annotations

import json
import math
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from autograder import technique
from autograder.backends.cpu import CpuBackend
from autograder.grade import GradeOptions, grade_stages
from autograder.launch import Plan
from autograder.publish import feedback
from autograder.records import (
    KernelMetrics,
    KernelSource,
    Performance,
    PerfVerdict,
    StageResult,
    Status,
    TechniqueCheck,
    from_dict,
    to_dict,
)
from autograder.references import reference_source
from autograder.rubric import BLOCK_SIZES, load_rubric, score
from autograder.sandbox import Sandbox
from autograder.selfcheck import StageReport
from autograder.stages import MAX2D_BASELINE, get_stage
from autograder.verify import analysis_cases, make_input

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CPU backend needs g++")
requires_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")

KERNELS = Path(__file__).parent / "technique_kernels"
SANDBOX = Sandbox()
MEASURED = [stage_id for stage_id, measures in technique.MEASURES.items() if any(m.source == "cpu" for m in measures)]


@pytest.fixture(scope="module")
def cpu(cache_dir: Path) -> CpuBackend:
    return CpuBackend(cache_dir=cache_dir)


def metrics_of(cpu: CpuBackend, stage_id: str, text: str, block_size: int = 256) -> KernelMetrics:
    """The CPU backend's measurements of a kernel over the analysis cases of a GPU grading run."""
    stage = MAX2D_BASELINE if stage_id == "max2d_baseline" else get_stage(stage_id)
    kernel = cpu.compile(KernelSource(text), stage)
    for case in analysis_cases(stage, seed=1):
        plan = Plan.create(cpu, kernel, case.size, block_size)
        try:
            plan.load(make_input(case))
            plan.run(check_each_pass=True)
        finally:
            plan.release()
    cpu.findings()
    metrics = cpu.metrics(kernel)
    assert metrics is not None
    return metrics


def checks_of(cpu: CpuBackend, stage_id: str, text: str, block_size: int = 256) -> dict[str, TechniqueCheck]:
    metrics = metrics_of(cpu, stage_id, text, block_size)
    checks = technique.check(get_stage(stage_id), KernelSource(text), metrics, SANDBOX, block_size)
    return {check.name: check for check in checks}


def renamed(stage_id: str, as_stage: str) -> str:
    """The reference kernel of one stage handed in as another."""
    text = reference_source(stage_id).text
    return text.replace(get_stage(stage_id).kernel_name if stage_id != "max2d_baseline" else "max2d_baseline",
                        get_stage(as_stage).kernel_name)


def in_double(text: str) -> str:
    """A reference kernel that sums in a double shared array, whose requests a GPU serves in two phases."""
    return text.replace("extern __shared__ float sdata[];", "__shared__ double sdata[1024];")


def close(measured: float, stated: float) -> bool:
    return math.isclose(measured, stated, rel_tol=0.1, abs_tol=0.3)


# --- the thresholds, from the reference kernels -----------------------------------------------------------


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("stage_id", MEASURED)
def test_each_threshold_passes_the_reference_and_fails_the_previous_stage_reference(
    cpu: CpuBackend, stage_id: str, block_size: int
) -> None:
    stage = get_stage(stage_id)
    for measure in technique.MEASURES[stage_id]:
        if measure.source != "cpu":
            continue
        ours = measure.value(metrics_of(cpu, stage_id, reference_source(stage_id).text, block_size))
        assert close(ours, measure.reference(block_size)), (measure.name, ours)
        assert measure.passes(ours, block_size), (measure.name, ours, measure.required(block_size))
        if measure.previous is None:
            continue
        before = measure.value(metrics_of(cpu, stage.previous, reference_source(stage.previous).text, block_size))
        assert close(before, measure.previous(block_size)), (measure.name, before)
        assert not measure.passes(before, block_size), (measure.name, before, measure.required(block_size))


@requires_nvcc
def test_the_ptx_of_the_shuffle_reference_shuffles_and_the_unrolled_warp_reference_does_not() -> None:
    shuffles = technique.ptx_shuffles(technique.ptx_of(reference_source("shuffle"), SANDBOX))
    assert shuffles == technique.MEASURES["shuffle"][0].reference(256) == 5
    assert technique.ptx_shuffles(technique.ptx_of(reference_source("unrolled_warp"), SANDBOX)) == 0


@requires_nvcc
def test_the_ptx_started_with_a_students_builds_is_compiled_once_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    # Started beside the student's other builds (autograder.pipeline.compile), the PTX compile is not on the
    # student's path at the shuffle stage's check; a check that comes while it runs waits for it, not compiles.
    compiles: list[str] = []
    real = technique._compile_ptx

    def counted(text: str, nvcc: str, sandbox: Sandbox) -> tuple[str | None, str]:
        compiles.append(text)
        return real(text, nvcc, sandbox)

    monkeypatch.setattr(technique, "_compile_ptx", counted)
    monkeypatch.setattr(technique, "_PTX", {})
    source = KernelSource(reference_source("shuffle").text + "// started ahead\n")
    with ThreadPoolExecutor(2) as pool:
        technique.start_ptx(source, SANDBOX, pool)
        checks = technique.check(get_stage("shuffle"), source, None, SANDBOX, 256)
    (shuffles,) = [check for check in checks if check.how.startswith("PTX")]
    assert shuffles.passed and shuffles.value == 5 and compiles == [source.text]


def test_first_add_is_checked_by_its_launch_contract() -> None:
    check, *_ = technique.check(get_stage("first_add"), reference_source("first_add"), None, SANDBOX, 256)
    assert check.passed and check.value == 2 and check.previous == 1
    assert "incorrect" in check.what


def test_two_trees_a_block_are_not_the_first_add(cpu: CpuBackend) -> None:
    checks = checks_of(cpu, "first_add", (KERNELS / "first_add_two_trees.cu").read_text())
    assert checks["elements per thread"].passed  # the launch's two elements a thread, taken one tree apart
    barriers = checks["block barriers"]
    assert barriers.value == 20 and technique.describe(barriers) == (
        "block barriers: 20.0 (reference kernel: 9.0; at most 11 required): the technique is absent"
    )


# --- kernels of our own ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stage_id", "text", "absent"),
    [
        ("anti_divergence", renamed("naive", "anti_divergence"), "divergence"),
        ("sequential", (KERNELS / "sequential_transposed_layout.cu").read_text(), "bank conflicts"),
        ("sequential", renamed("anti_divergence", "sequential"), "bank conflicts"),
        ("sequential", in_double(renamed("anti_divergence", "sequential")), "bank conflicts"),
        ("first_add", (KERNELS / "first_add_two_trees.cu").read_text(), "block barriers"),
        ("first_add", (KERNELS / "first_add_two_trees.cu").read_text(), "busiest thread"),
        ("first_add", (KERNELS / "first_add_two_trees_in_step.cu").read_text(), "busiest thread"),
        ("sequential", (KERNELS / "sequential_thread_zero_alone.cu").read_text(), "busiest thread"),
        ("unrolled_warp", (KERNELS / "unrolled_warp_atomics_into_one_word.cu").read_text(), "shared atomics"),
        ("unrolled_warp", renamed("first_add", "unrolled_warp"), "block barriers"),
        ("shuffle", renamed("unrolled_warp", "shuffle"), "shuffles executed"),
        ("shuffle", renamed("unrolled_warp", "shuffle"), "shared memory in the last warp"),
        ("shuffle", (KERNELS / "shuffle_after_shared_steps.cu").read_text(), "shared memory in the last warp"),
        ("shuffle", (KERNELS / "shuffle_dodged_with_a_last_barrier.cu").read_text(), "shared memory in the last warp"),
        ("shuffle", (KERNELS / "shuffle_dodged_with_barriers_between_steps.cu").read_text(),
         "shared memory in the last warp"),
        ("max2d", renamed("max2d_baseline", "max2d"), "coalescing"),
    ],
    ids=lambda value: value if isinstance(value, str) and len(value) < 40 else "",
)
def test_a_kernel_without_its_stage_technique_fails_the_measurement(
    cpu: CpuBackend, stage_id: str, text: str, absent: str
) -> None:
    checks = checks_of(cpu, stage_id, text)
    assert checks[absent].passed is False, technique.describe(checks[absent])


@pytest.mark.parametrize(
    ("stage_id", "name"),
    [
        ("unrolled_warp", "unrolled_warp_loop"),
        ("shuffle", "shuffle_every_warp"),
        ("shuffle", "shuffle_after_one_more_tree_step"),
        ("sequential", "sequential_in_double"),
        ("first_add", "first_add_pairs_and_a_barrier_more"),
        ("sequential", "sequential_four_way_tree"),
    ],
)
def test_another_way_to_the_same_technique_passes(cpu: CpuBackend, stage_id: str, name: str) -> None:
    checks = checks_of(cpu, stage_id, (KERNELS / f"{name}.cu").read_text())
    assert all(check.passed is not False for check in checks.values()), [technique.describe(c) for c in checks.values()]


@pytest.mark.parametrize(
    ("stage_id", "name", "fooled", "catches"),
    [
        ("sequential", "sequential_thread_zero_alone", "bank conflicts", "busiest thread"),
        ("unrolled_warp", "unrolled_warp_atomics_into_one_word", "block barriers", "shared atomics"),
    ],
)
def test_a_block_without_a_tree_passes_the_stage_measure_and_fails_the_tree_measures(
    cpu: CpuBackend, stage_id: str, name: str, fooled: str, catches: str
) -> None:
    # A thread that adds its block alone has no bank conflicts; atomics into one word pass no extra barrier.
    checks = checks_of(cpu, stage_id, (KERNELS / f"{name}.cu").read_text())
    assert checks[fooled].passed, technique.describe(checks[fooled])
    assert checks[catches].passed is False
    assert technique.describe(checks[catches]).endswith(": the technique is absent")


def test_a_half_done_shuffle_stage_shuffles_but_keeps_the_shared_memory_steps(cpu: CpuBackend) -> None:
    checks = checks_of(cpu, "shuffle", (KERNELS / "shuffle_after_shared_steps.cu").read_text())
    assert checks["shuffles executed"].passed
    assert not checks["shared memory in the last warp"].passed


def test_the_unrolled_warp_renamed_as_shuffle_loses_the_technique_share_of_its_points() -> None:
    # The example of issue 11: stage 5's kernel handed in as stage 6 got every point on the H200.
    options = GradeOptions(backend="cpu", seed=11, quick=True, measure_speed=False)
    (renamed_result,) = grade_stages({"shuffle": KernelSource(renamed("unrolled_warp", "shuffle"))}, options=options,
                                     only=["shuffle"])
    (reference_result,) = grade_stages({"shuffle": reference_source("shuffle")}, options=options, only=["shuffle"])
    assert renamed_result.status is reference_result.status is Status.CORRECT
    rubric = load_rubric()
    assert reference_result.points.total == reference_result.points.max_points == 10
    assert renamed_result.points.total == 10 * (1 - rubric.technique_absent)
    assert any(line.startswith("technique -") for line in renamed_result.points.lines)
    absent = {check.name for check in technique.absent(renamed_result.technique)}
    assert {"shuffles executed", "shared memory in the last warp"} <= absent


@pytest.mark.gpu
def test_on_a_gpu_the_same_kernels_get_the_same_technique_verdicts_as_on_the_cpu() -> None:
    # On a GPU the measurements come from the CPU analysis of the same kernel and from nvcc's PTX.
    verdicts = {}
    for backend in ("cpu", "gpu"):
        options = GradeOptions(backend=backend, seed=11, quick=True, measure_speed=False)
        sources = {
            "shuffle": KernelSource(renamed("unrolled_warp", "shuffle")),
            "max2d": KernelSource(renamed("max2d_baseline", "max2d")),
            "sequential": reference_source("sequential"),
        }
        results = grade_stages(sources, only=list(sources), options=options)
        verdicts[backend] = {r.stage: (r.status, r.points.total, [c.passed for c in r.technique]) for r in results}
    assert verdicts["gpu"] == verdicts["cpu"]
    assert verdicts["gpu"]["shuffle"][1] == verdicts["gpu"]["max2d"][1] == 5
    assert verdicts["gpu"]["sequential"] == (Status.CORRECT, 10, [True] * len(technique.MEASURES["sequential"]))


# --- where a measurement cannot be made ---------------------------------------------------------------------


def test_without_nvcc_the_ptx_check_is_not_checked_here_and_costs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import autograder.backends.gpu as gpu

    monkeypatch.setattr(gpu, "find_nvcc", lambda: None)
    checks = technique.check(get_stage("shuffle"), KernelSource(renamed("unrolled_warp", "shuffle")), None, SANDBOX,
                             256)
    assert [check.passed for check in checks] == [None, None, None]
    assert "nvcc" in checks[0].how and "not checked here" in checks[0].how
    assert "not checked here" in checks[1].how
    points = score(load_rubric(), "shuffle", Status.CORRECT, 1, 1, (), Performance(PerfVerdict.NOT_MEASURED, ""),
                   performance_measured=False, technique=checks)
    assert points.total == 10


def test_the_rubric_prices_an_absent_technique_as_a_share_of_the_points_earned(tmp_path: Path) -> None:
    failed = TechniqueCheck("shuffles executed", "", "at least 1", 0.0, 5.0, 0.0, False, "CPU backend")
    fast = Performance(PerfVerdict.FAST_ENOUGH, "fast")
    points = score(load_rubric(), "shuffle", Status.CORRECT, 1, 1, (), fast, performance_measured=True,
                   technique=(failed,))
    assert (points.total, points.max_points) == (7.5, 15)
    text = Path(load_rubric().path).read_text().replace("absent = 0.5", "absent = 1.0")
    (tmp_path / "all.toml").write_text(text)
    assert score(load_rubric(tmp_path / "all.toml"), "shuffle", Status.CORRECT, 1, 1, (), fast, True,
                 technique=(failed,)).total == 0


# --- the records and what students see ---------------------------------------------------------------------

SHUFFLE_CHECK = TechniqueCheck("shuffles executed", "warp shuffles run per block", "at least 1", 0.0, 5.0, 0.0, False,
                               "CPU backend: counted over the first blocks of every launch")


def test_a_result_written_before_techniques_were_measured_still_loads() -> None:
    result = StageResult("shuffle", Status.CORRECT, "correct", technique=(SHUFFLE_CHECK,))
    data = json.loads(json.dumps(to_dict(result)))
    assert from_dict(StageResult, data) == result
    del data["technique"]
    assert from_dict(StageResult, data).technique == ()


def test_feedback_and_self_check_show_the_measurement_and_why_it_shows_the_lesson() -> None:
    from autograder.records import DeviceInfo, StudentResult

    performance = Performance(PerfVerdict.FAST_ENOUGH, "1.00x over your unrolled_warp", reference_step=1.01)
    stage = StageResult("shuffle", Status.CORRECT, "correct", performance=performance, technique=(SHUFFLE_CHECK,))
    student = StudentResult("ada", "ada.ipynb", 1, "now", DeviceInfo("gpu", "NVIDIA H200"), "rubric.toml", (stage,))
    section = next(s for s in feedback.build_page(student).sections if s.heading.startswith("6."))
    assert section.technique == [technique.describe(SHUFFLE_CHECK)]
    assert "0.0" in section.technique[0] and "5.0" in section.technique[0] and "absent" in section.technique[0]
    assert "within the timing noise" in section.technique_note
    rows = dict(StageReport(stage).rows())
    assert rows["Technique"].startswith("the speed step of this stage is within the timing noise")
    assert any(label == "Technique" and "shuffles executed" in text for label, text in StageReport(stage).rows())
    quiet = replace(stage, performance=replace(performance, reference_step=1.29))
    assert "within the timing noise" not in feedback.technique_note(quiet)


@requires_nvcc
def test_a_ptx_compile_that_failed_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # A failure of the grader's machine (a full /tmp, say) is not the source's: the check that comes later, or
    # the next student with the same kernel, compiles it again, not the failure remembered.
    calls: list[int] = []
    real = technique._compile_ptx

    def full_once(text: str, nvcc: str, sandbox: Sandbox) -> tuple[str | None, str]:
        calls.append(1)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        return real(text, nvcc, sandbox)

    monkeypatch.setattr(technique, "_compile_ptx", full_once)
    monkeypatch.setattr(technique, "_PTX", {})
    source = KernelSource(reference_source("shuffle").text + "// tried again\n")
    with ThreadPoolExecutor(1) as pool:
        technique.start_ptx(source, SANDBOX, pool)  # ahead, with the student's builds: it fails
    assert technique.ptx_shuffles(technique.ptx_of(source, SANDBOX)) == 5 and len(calls) == 2
    assert technique.ptx_shuffles(technique.ptx_of(source, SANDBOX)) == 5 and len(calls) == 2  # kept once right
