"""Phase 5, on the GPU: speed. Every correct stage is timed with its baseline (the student's own previous stage
when correct, else the reference previous stage) and the reference kernel of the same stage, all interleaved in
one group per input shape, with the GPU alone (autograder.timing), then judged against the calibrated step
(autograder.rubric.judge_speed)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from autograder.errors import KernelFault, KernelTimeout
from autograder.pipeline.run import StudentRun
from autograder.pipeline.work import StageWork
from autograder.records import KernelSource, Performance, PerfVerdict, StageResult, Status
from autograder.references import reference_source
from autograder.rubric import judge_speed
from autograder.stages import Shape, Stage, get_stage
from autograder.timing import TimedKernel, WrongTimedResult, prepare_timing, publish_input, time_interleaved


def time_stages(
    run: StudentRun, works: list[StageWork], sources: Mapping[str, KernelSource | None], results: dict[str, StageResult]
) -> None:
    """Time every correct stage: one group per input shape, every kernel interleaved with the others."""
    correct = [item for item in works if item.result.status is Status.CORRECT]
    unmeasured = run.unmeasured_reason()
    if unmeasured:
        for item in correct:
            item.result = replace(item.result, performance=Performance(PerfVerdict.NOT_MEASURED, unmeasured))
        return
    for shape in (Shape.SUM_1D, Shape.MAX_2D):
        group = [item for item in correct if item.stage.shape is shape]
        if group:
            _time_group(run, group, sources, results)


def own_baseline(
    stage: Stage, sources: Mapping[str, KernelSource | None], earlier: Mapping[str, StageResult]
) -> KernelSource | None:
    """The student's own previous stage, when it is correct: the kernel a stage's speedup is measured over."""
    own, own_result = sources.get(stage.previous or ""), earlier.get(stage.previous or "")
    return own if own is not None and own_result is not None and own_result.status is Status.CORRECT else None


def _time_group(
    run: StudentRun, group: list[StageWork], sources: Mapping[str, KernelSource | None], results: dict[str, StageResult]
) -> None:
    """Time the stages of `group` and their baselines and references, all interleaved, with the GPU alone.

    A kernel wrong in a timed call makes its stage incorrect, and the others are timed again without it;
    a hang or a crash sends each stage to be timed on its own, so that only the culprit's stage loses.
    """
    kernels: dict[str, TimedKernel] = {}
    compared: dict[str, tuple[str, str | None, str]] = {}  # stage id: (yours, its baseline, its reference)
    built = {item.stage.id: item.build for item in group}
    for item in group:
        stage = item.stage
        yours = f"your {stage.id}"
        kernels[yours] = TimedKernel(yours, stage.id, item.build)
        baseline = None
        if stage.previous:
            previous = get_stage(stage.previous)
            own = own_baseline(stage, sources, results)
            baseline = f"your {previous.id}" if own is not None else f"reference {previous.id}"
            if baseline not in kernels:
                build = built.get(previous.id) if own is not None else None
                build = build or run.builder.build(previous, own or reference_source(previous.id))
                kernels[baseline] = TimedKernel(baseline, previous.id, build)
        reference = f"reference {stage.id}"
        if reference not in kernels:
            build = run.builder.build(stage, reference_source(stage.id))
            kernels[reference] = TimedKernel(reference, stage.id, build)
        compared[stage.id] = (yours, baseline, reference)
    timing, seed = run.rubric.timing, run.options.seed
    limit = timing.budget_seconds * 2 + 120
    try:
        # The inputs are drawn first, and the worker started: host work that need not hold the GPU.
        with run.shared_phase("timing input", group):
            published = publish_input(seed, timing.size_of(group[0].stage.shape))
            run.worker.call(prepare_timing, tuple(compared), timing, seed, published, timeout=limit)
        with run.shared_phase("timing", group), run.gate(exclusive=True):
            measured = run.worker.call(time_interleaved, tuple(kernels.values()), timing, seed, timeout=limit)
    except WrongTimedResult as error:
        culprit = next((item for item in group if str(error).startswith(f"your {item.stage.id}:")), None)
        if culprit is None and len(group) > 1:  # a baseline kept from the memo: each stage on its own
            for item in group:
                _time_group(run, [item], sources, results)
            return
        culprit = culprit or group[0]
        hint_text = "results must not depend on the call"
        wrong = replace(culprit.result, status=Status.INCORRECT, message=str(error), hint=hint_text)
        culprit.result = results[culprit.stage.id] = wrong
        rest = [item for item in group if item is not culprit]
        if rest:
            _time_group(run, rest, sources, results)
        return
    except (KernelTimeout, KernelFault) as error:
        if len(group) > 1:
            for item in group:
                _time_group(run, [item], sources, results)
            return
        (item,) = group
        if isinstance(error, KernelTimeout):
            item.result = replace(item.result, status=Status.TIMEOUT, message=f"timing stopped: {error}")
        else:
            item.result = replace(item.result, status=Status.CRASHED, message=f"crashed while timed: {error}")
        results[item.stage.id] = item.result
        return
    by_label = {timing.label: timing for timing in measured}
    for item in group:
        yours, baseline, reference = compared[item.stage.id]
        baselines = [by_label[baseline]] if baseline else []
        timings = (replace(by_label[yours], label="yours"), *baselines, by_label[reference])
        step = run.calibration().step(item.stage.id) if baseline else None
        item.result = replace(item.result, performance=judge_speed(run.rubric, timings, baseline, step))
