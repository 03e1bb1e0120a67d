"""Phase 5, on the GPU: speed. Every correct stage is timed with its baseline (the student's own previous stage
when correct, else the reference previous stage) and the reference kernel of the same stage, all interleaved in
one group per input shape, with the GPU alone (autograder.timing), then judged against the calibrated step
(autograder.rubric.judge_speed)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from autograder.build import reference_build
from autograder.errors import KernelFault, KernelTimeout
from autograder.pipeline.run import StudentRun
from autograder.pipeline.sanitize import writes_astray
from autograder.pipeline.work import StageWork
from autograder.records import KernelSource, Performance, PerfVerdict, StageResult, Status, Timing
from autograder.rubric import judge_speed
from autograder.stages import Shape, Stage, get_stage
from autograder.timing import (
    TimedKernel,
    WrongTimedResult,
    prepare_timing,
    publish_input,
    ready_timing,
    time_interleaved,
)


def time_stages(
    run: StudentRun, works: list[StageWork], sources: Mapping[str, KernelSource | None], results: dict[str, StageResult]
) -> None:
    """Time every correct stage: one group per input shape, every kernel interleaved with the others, all the
    groups in one hold of the GPU alone."""
    correct = [item for item in works if item.result.status is Status.CORRECT]
    unmeasured = run.unmeasured_reason()
    if unmeasured:
        for item in correct:
            item.result = replace(item.result, performance=Performance(PerfVerdict.NOT_MEASURED, unmeasured))
        return
    by_shape = [[item for item in correct if item.stage.shape is shape] for shape in (Shape.SUM_1D, Shape.MAX_2D)]
    first = run.worker.restarts
    _time_groups(run, [group for group in by_shape if group], sources, results)
    # Each kernel timed ran in the processes that timed: every one, counted for every stage timed. What no
    # stage's findings tell makes them serve no later student: a kernel found wrong (or crashing) only when
    # timed, or a stage of the class memo's, timed as a baseline, that wrote astray (correct by a penalty rubric).
    processes = range(first, run.worker.restarts + 1)
    for item in correct:
        item.ran_in.update(processes)
    ours = {item.stage.id for item in works}
    kept = [result for stage_id, result in results.items() if stage_id not in ours]
    if any(item.result.status is not Status.CORRECT for item in correct) or any(
        result.status is Status.CORRECT and writes_astray(result) for result in kept
    ):
        run.failed_in.update(processes)


def own_baseline(
    stage: Stage, sources: Mapping[str, KernelSource | None], earlier: Mapping[str, StageResult]
) -> KernelSource | None:
    """The student's own previous stage, when it is correct: the kernel a stage's speedup is measured over."""
    own, own_result = sources.get(stage.previous or ""), earlier.get(stage.previous or "")
    return own if own is not None and own_result is not None and own_result.status is Status.CORRECT else None


@dataclass
class _Group:
    """Stages of one input shape timed together: each its kernel, its baseline's and its reference's."""

    items: list[StageWork]
    kernels: dict[str, TimedKernel]  # by label, each kernel once
    compared: dict[str, tuple[str, str | None, str]]  # stage id: (yours, its baseline, its reference)


def _time_groups(
    run: StudentRun,
    items_by_group: list[list[StageWork]],
    sources: Mapping[str, KernelSource | None],
    results: dict[str, StageResult],
) -> None:
    """Time each group of stages and judge its speeds, all the groups in one hold of the GPU alone.

    A kernel wrong in a timed call makes its stage incorrect, and the others are timed again without it;
    a hang or a crash sends each stage to be timed on its own, so that only the culprit's stage loses.
    """
    groups = [_group(run, items, sources, results) for items in items_by_group]
    everything = [item for items in items_by_group for item in items]
    timing, seed = run.rubric.timing, run.options.seed
    limit = timing.budget_seconds * 2 + 120

    def call(function: Callable[..., Any]) -> Callable[[_Group], Any]:
        return lambda group: run.worker.call(function, tuple(group.kernels.values()), timing, seed, timeout=limit)

    with run.shared_phase("timing input", everything):
        # Host work first, which need not hold the GPU: the inputs drawn (or read) and the worker started.
        for group in groups:
            published = publish_input(seed, timing.size_of(group.items[0].stage.shape))
            run.worker.call(prepare_timing, tuple(group.compared), timing, seed, published, timeout=limit)
        # Then, with the GPU shared, the kernels loaded and the inputs copied to it: a timing waits for neither.
        with run.gate(exclusive=False):
            outcomes = _each(groups, call(ready_timing))
    if not any(outcomes):
        with run.shared_phase("timing", everything), run.gate(exclusive=True):
            outcomes = _each(groups, call(time_interleaved))
    for group, outcome in zip(groups, outcomes, strict=True):
        _settle(run, group, outcome, sources, results)


def _each(groups: list[_Group], call: Callable[[_Group], Any]) -> list[Any]:
    """`call` on each group in turn: its result, or the error that is the group's verdict. After a hang or a
    crash (its worker has ended) the groups left get None: each is timed again, away from this hold."""
    outcomes: list[Any] = [None] * len(groups)
    for index, group in enumerate(groups):
        try:
            outcomes[index] = call(group)
        except WrongTimedResult as error:
            outcomes[index] = error
        except (KernelTimeout, KernelFault) as error:
            outcomes[index] = error
            break
    return outcomes


def _group(
    run: StudentRun, items: list[StageWork], sources: Mapping[str, KernelSource | None], results: dict[str, StageResult]
) -> _Group:
    """The kernels that time `items`, their baselines and references built (the grader's own come cached)."""
    group = _Group(items, {}, {})
    built = {item.stage.id: item.build for item in items}
    for item in items:
        stage = item.stage
        yours = f"your {stage.id}"
        group.kernels[yours] = TimedKernel(yours, stage.id, item.build)
        baseline = None
        if stage.previous:
            previous = get_stage(stage.previous)
            own = own_baseline(stage, sources, results)
            baseline = f"your {previous.id}" if own is not None else f"reference {previous.id}"
            if baseline not in group.kernels:
                if own is not None:
                    build = built.get(previous.id) or run.builder.build(previous, own)
                else:
                    build = reference_build(run.builder.device, run.builder.sandbox, previous.id)
                group.kernels[baseline] = TimedKernel(baseline, previous.id, build)
        reference = f"reference {stage.id}"
        if reference not in group.kernels:
            build = reference_build(run.builder.device, run.builder.sandbox, stage.id)
            group.kernels[reference] = TimedKernel(reference, stage.id, build)
        group.compared[stage.id] = (yours, baseline, reference)
    return group


def _settle(
    run: StudentRun,
    group: _Group,
    outcome: tuple[Timing, ...] | Exception | None,
    sources: Mapping[str, KernelSource | None],
    results: dict[str, StageResult],
) -> None:
    """Judge a group's speeds from its timings, or act on why it has none."""
    items = group.items
    if outcome is None:  # not timed: an earlier group's worker ended
        _time_groups(run, [items], sources, results)
    elif isinstance(outcome, WrongTimedResult):
        culprit = next((item for item in items if str(outcome).startswith(f"your {item.stage.id}:")), None)
        if culprit is None and len(items) > 1:  # a baseline kept from the memo: each stage on its own
            _one_by_one(run, items, sources, results)
            return
        culprit = culprit or items[0]
        hint_text = "results must not depend on the call"
        wrong = replace(culprit.result, status=Status.INCORRECT, message=str(outcome), hint=hint_text)
        culprit.result = results[culprit.stage.id] = wrong
        rest = [item for item in items if item is not culprit]
        if rest:
            _time_groups(run, [rest], sources, results)
    elif isinstance(outcome, (KernelTimeout, KernelFault)):
        if len(items) > 1:
            _one_by_one(run, items, sources, results)
            return
        (item,) = items
        if isinstance(outcome, KernelTimeout):
            item.result = replace(item.result, status=Status.TIMEOUT, message=f"timing stopped: {outcome}")
        else:
            item.result = replace(item.result, status=Status.CRASHED, message=f"crashed while timed: {outcome}")
        results[item.stage.id] = item.result
    else:
        by_label = {timing.label: timing for timing in outcome}
        for item in items:
            yours, baseline, reference = group.compared[item.stage.id]
            baselines = [by_label[baseline]] if baseline else []
            timings = (replace(by_label[yours], label="yours"), *baselines, by_label[reference])
            step = run.calibration().step(item.stage.id) if baseline else None
            item.result = replace(item.result, performance=judge_speed(run.rubric, timings, baseline, step))


def _one_by_one(
    run: StudentRun, items: list[StageWork], sources: Mapping[str, KernelSource | None], results: dict[str, StageResult]
) -> None:
    """Each stage timed on its own, in order, each after the one before is settled: a stage found wrong on the
    way is no later stage's baseline."""
    for item in items:
        _time_groups(run, [[item]], sources, results)
