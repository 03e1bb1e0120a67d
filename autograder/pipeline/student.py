"""The pipeline of one student: its stages through the phases, in order.

Each stage is read, compiled (pipeline.compile), checked for correctness (pipeline.check) and analysed
(pipeline.analyse) in turn, unless the class memo already holds its result; then all of the student's stages go
through compute-sanitizer together (pipeline.sanitize), get their verdict (pipeline.verdict), are timed
together (pipeline.speed) and are scored. This module decides only the order, what the memo saves, and that
nothing a hand-in holds ends as anything but a verdict: an exception from any phase becomes its stage's status
(`_contained`), and a failure of the grader itself is recorded for the staff, with the rest of the student
graded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from autograder.errors import BackendUnavailable, CompileError, ConfigError, GraderError, KernelFault, KernelTimeout
from autograder.memo import StageMemo, grader_version
from autograder.pipeline.analyse import analyse_on_cpu, analyse_stage
from autograder.pipeline.check import check_stage
from autograder.pipeline.compile import building_ahead, compile_failure, compile_stage
from autograder.pipeline.run import StudentRun
from autograder.pipeline.sanitize import sanitize_stages, unsafe
from autograder.pipeline.speed import own_baseline, time_stages
from autograder.pipeline.verdict import finish, undefined_behaviour, undefined_end
from autograder.pipeline.work import Phases, StageWork
from autograder.records import Build, KernelSource, Performance, PerfVerdict, StageResult, Status
from autograder.sandbox import SandboxUnavailable
from autograder.stages import Stage, get_stage

Progress = Callable[[str], None]
NOT_ATTEMPTED = "not attempted: the kernel cell is missing, empty, or still the released stub"
# Failures of the grader's machine or set-up, never of a hand-in.
_GRADERS_OWN = (BackendUnavailable, ConfigError, SandboxUnavailable)


def grade_student(
    run: StudentRun,
    wanted: Sequence[str],
    sources: Mapping[str, KernelSource | None],
    problems: Mapping[str, str],
    results: dict[str, StageResult],
    progress: Progress | None = None,
) -> bool:
    """Grade the `wanted` stages into `results`. Returns whether every kernel that ran in the main worker's
    current process kept to its buffers and ended (no crash, hang or out-of-bounds finding): only then may that
    worker serve another student. A kernel that crashed or hung ended the process it ran in; one started after
    it, which ran only the student's other kernels, may serve the next student when they were clean."""
    works: list[StageWork] = []
    with building_ahead(run, _unchecked(run, wanted, sources, problems)):
        for stage_id in wanted:
            if progress:
                progress(stage_id)
            stage, problem = get_stage(stage_id), problems.get(stage_id)
            outcome = _contained(run, stage, lambda: _prepare(run, stage, sources, problem, results))  # noqa: B023
            if isinstance(outcome, StageWork):
                works.append(outcome)
                outcome = outcome.result
            results[stage_id] = outcome
    try:
        sanitize_stages(run, works)
    except Exception as error:  # a failure of the grader: the stages keep the other checkers' verdicts
        why = run.grader_failed("compute-sanitizer", error)
        for item in works:
            item.result = replace(item.result, message=f"{item.result.message} (the GPU's own checks failed: {why})")
    for item in works:
        item.result = results[item.stage.id] = undefined_behaviour(run.rubric, item.result)
    try:
        time_stages(run, works, sources, results)
    except Exception as error:
        run.failed_in.add(run.worker.restarts)  # what the kernels timed did before this is unknown
        why = run.grader_failed("timing", error)
        for item in works:
            if item.result.status is Status.CORRECT and not item.result.performance.timings:
                reason = f"not measured: the grader failed while timing ({why})"
                item.result = replace(item.result, performance=Performance(PerfVerdict.NOT_MEASURED, reason))
    for item in works:
        results[item.stage.id] = final = finish(run, item.stage, replace(item.result, phases=item.phases.seconds))
        own = own_baseline(item.stage, sources, results)
        if run.memo is not None and item.memo_key is not None and (own.text if own else None) == item.baseline:
            run.memo.put(item.memo_key, final)
    process = run.worker.restarts
    return process not in run.failed_in and not any(unsafe(item) and process in item.ran_in for item in works)


def _prepare(
    run: StudentRun,
    stage: Stage,
    sources: Mapping[str, KernelSource | None],
    problem: str | None,
    earlier: Mapping[str, StageResult],
) -> StageResult | StageWork:
    """A finished result (nothing to run, a compile error, or the class memo's), or a stage compiled and checked,
    for the phases that take all of a student's stages together."""
    source = sources.get(stage.id)
    if problem:
        return finish(run, stage, StageResult(stage.id, Status.INVALID_CELL, problem))
    if source is None:
        return finish(run, stage, StageResult(stage.id, Status.NOT_ATTEMPTED, NOT_ATTEMPTED))
    own = own_baseline(stage, sources, earlier)
    memo = run.memo
    key = checked_key = None
    if memo is not None:
        key = StageMemo.key(stage.id, source.text, source.placement(), own.text if own else "reference", *_run(run))
        kept = memo.get(key)
        if kept is not None:
            return replace(kept, phases=())  # graded before: this student's stage cost no compile, check or timing
        checked_key = _checked_key(run, stage, source)
    phases = Phases(lambda: run.waited)
    build = compile_stage(run, stage, source, phases)
    if isinstance(build, StageResult):
        return finish(run, stage, replace(build, phases=phases.seconds))
    ran_in: set[int] = set()

    def checked() -> StageResult:
        result = _checks(run, stage, source, build, phases)
        ran_in.add(run.worker.restarts)  # the process its cases ran in, even where they ended it
        return result

    if memo is None or checked_key is None:
        result = checked()
    else:
        with memo.claim([checked_key]):
            result = memo.get(checked_key)  # checked before, over another baseline: only its timing is left
            if result is None:
                result = checked()
                memo.put(checked_key, result)
    result = undefined_behaviour(run.rubric, result)
    ended = result.status if result.status in (Status.CRASHED, Status.TIMEOUT) else None
    result = undefined_end(run.rubric, result)
    return StageWork(stage, source, build, result, phases, key, own.text if own else None, ended, ran_in)


def _run(run: StudentRun) -> tuple:
    """Everything a stage's result depends on besides its source and baseline: the options (the seed and the
    rubric's hash among them), the device and the grader."""
    return replace(run.options, memo_dir=None, backend_options={}), run.worker.device, grader_version()


def _checked_key(run: StudentRun, stage: Stage, source: KernelSource) -> str:
    """Where the class memo keeps what a stage's checks found, which does not depend on its baseline."""
    return StageMemo.key("checked", stage.id, source.text, source.placement(), *_run(run))


def _unchecked(
    run: StudentRun, wanted: Sequence[str], sources: Mapping[str, KernelSource | None], problems: Mapping[str, str]
) -> list[tuple[Stage, KernelSource]]:
    """The stages that will surely compile: handed in, and never checked in this class before."""
    todo = []
    for stage_id in wanted:
        source = sources.get(stage_id)
        if source is not None and stage_id not in problems:
            stage = get_stage(stage_id)
            if run.memo is None or run.memo.get(_checked_key(run, stage, source)) is None:
                todo.append((stage, source))
    return todo


def _checks(run: StudentRun, stage: Stage, source: KernelSource, build: Build, phases: Phases) -> StageResult:
    """Correctness, and on a GPU the CPU race analysis beside it (in the student's CPU-backend worker, while the
    GPU worker runs the cases); then what the analysis saw joined to the result, and the technique checks. The
    analysis phase is the time the stage waited for them after its correctness run."""
    on_cpu = run.on_gpu and run.options.race_checks
    with ThreadPoolExecutor(max_workers=1) as beside:
        cpu = beside.submit(analyse_on_cpu, run, stage, source) if on_cpu else None
        with phases("correctness"):
            result = check_stage(run, stage, build)
        with phases("analysis"):
            return analyse_stage(run, stage, source, result, cpu.result() if cpu is not None else None)


def _contained(
    run: StudentRun, stage: Stage, action: Callable[[], StageResult | StageWork]
) -> StageResult | StageWork:
    """`action`'s outcome, or whatever it raised as the stage's verdict: what a kernel did is its verdict, and a
    failure of the grader itself is the stage's `grader_error`, recorded for the staff."""
    try:
        return action()
    except Exception as error:
        # What the stage's kernel did before this (its cases may have run: the CPU analysis's compile error comes
        # after them) is unknown: the process it may have run in serves no later student.
        run.failed_in.add(run.worker.restarts)
        return finish(run, stage, _failure(run, stage, error))


def _failure(run: StudentRun, stage: Stage, error: Exception) -> StageResult:
    """The verdict of a stage whose grading raised `error`."""
    if isinstance(error, CompileError):  # a kernel the worker cannot use (its name or signature, say)
        return compile_failure(stage, error)
    if isinstance(error, _GRADERS_OWN):
        return _grader_error(run, stage, error)
    if isinstance(error, KernelTimeout):
        return StageResult(stage.id, Status.TIMEOUT, f"timed out: {error}")
    if isinstance(error, KernelFault):
        return StageResult(stage.id, Status.CRASHED, f"crashed: {error}")
    if isinstance(error, GraderError):  # a worker failed while it ran the student's kernel
        first = str(error).splitlines()[0][:300] if str(error) else type(error).__name__
        return StageResult(stage.id, Status.CRASHED, f"crashed: the worker failed while running the kernel: {first}")
    return _grader_error(run, stage, error)  # a bug in the grader: the rest of the student is still graded


def _grader_error(run: StudentRun, stage: Stage, error: BaseException) -> StageResult:
    why = run.grader_failed(stage.id, error)
    message = (
        f"not graded: the grader failed on this stage ({why}); this is not your kernel's fault, and the course "
        "staff are told (a later run grades it again)"
    )
    return StageResult(stage.id, Status.GRADER_ERROR, message)
