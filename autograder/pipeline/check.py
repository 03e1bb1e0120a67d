"""Phase 2: correctness. The stage's kernel runs every case in the student's main worker (the GPU shared with
other correctness runs, never during a timing); each case gets its verdict, and the pattern of failures a hint.

A hang or a crash ends the cases there. Whatever else a worker raises (a kernel it cannot load, say) goes up to
the student's pipeline, which makes it the stage's verdict (autograder.pipeline.student)."""

from __future__ import annotations

from contextlib import closing
from dataclasses import replace
from functools import partial

from autograder.errors import KernelFault, KernelTimeout
from autograder.pipeline.run import StudentRun
from autograder.pipeline.work import collect, distinct
from autograder.records import Build, CaseResult, Finding, StageResult, Status
from autograder.stages import Stage
from autograder.verify import Case, correctness_cases, hint, judge, kernel_metrics, run_case, timing_case

METRICS_SECONDS = 120.0
TOO_SLOW = (
    "the kernel ran past its time: look for a loop that never ends or waits for another block, a barrier that "
    "not every thread of the block reaches, or far more work than a reduction needs"
)


def check_stage(run: StudentRun, stage: Stage, build: Build) -> StageResult:
    options, block_size = run.options, run.rubric.block_size
    cases: list[CaseResult] = []
    findings: dict[tuple, Finding] = {}
    run.worker.start()  # a worker starts outside the GPU's gate, so a timing never waits for its start
    todo = correctness_cases(stage, options.seed, quick=options.quick, block_size=block_size)
    status = _run_cases(run, stage, build, todo, cases, findings)
    if status is Status.CORRECT and all(case.passed for case in cases) and not run.on_gpu:
        # The kernel the GPU times, at its size (a GPU run's CPU analysis runs it: pipeline.analyse).
        at_scale = timing_case(stage, options.seed, run.rubric.timing.size_of(stage.shape))
        status = _run_cases(run, stage, build, at_scale, cases, findings)
    if status is Status.CORRECT and not all(case.passed for case in cases):
        status = Status.INCORRECT
    metrics = None
    if status in (Status.CORRECT, Status.INCORRECT):
        try:
            metrics = run.worker.call(kernel_metrics, build, timeout=METRICS_SECONDS)
        except (KernelTimeout, KernelFault):
            metrics = None
    case_tuple = tuple(cases)
    joined = distinct(findings)
    return StageResult(
        stage=stage.id,
        status=status,
        message=_message(status, case_tuple),
        hint=_advice(stage, status, case_tuple, block_size, joined),
        compiler=build.warnings,
        cases=case_tuple,
        findings=joined,
        metrics=metrics,
    )


def _run_cases(
    run: StudentRun, stage: Stage, build: Build, todo: list[Case], cases: list[CaseResult], findings: dict
) -> Status:
    """Run `todo` in the student's worker, each judged into `cases` and its findings into `findings`: each case in
    a hold of the GPU's gate of its own (shared with other correctness runs), so that a timing waits for one case
    to end, not for a whole stage's; each answered (and timed out) on its own. Ends at a hang or a crash, which is
    the status; else CORRECT, whatever the cases' values. A hang is a case past its limit twice, the second time
    in a fresh worker with twice the time (Worker.call_each): a stall of the machine is no student's timeout. On
    the CPU backend a case that kept its worker busy past its limit is a hang at once."""
    options, block_size = run.options, run.rubric.block_size
    limits = [options.case_seconds + options.per_element_seconds * case.count * (not case.sampled) for case in todo]
    calls = [(build, case, block_size) for case in todo]
    hold = partial(run.gate, exclusive=False)
    replies = run.worker.call_each(run_case, calls, limits, budget=options.stage_seconds, confirm=True, hold=hold)
    with closing(replies):  # its hold of the GPU's gate let go, whatever ends the cases
        for case in todo:
            try:
                value, seen, wrong = next(replies)
            except KernelTimeout as error:
                cases.append(judge(stage, case, None, block_size, error=str(error)))
                return Status.TIMEOUT
            except KernelFault as error:
                cases.append(judge(stage, case, None, block_size, error=str(error)))
                collect(findings, error.findings)
                # A deadlock the CPU backend sees at once is a kernel that never ends: a GPU waits at its limit.
                return Status.TIMEOUT if error.deadlocked else Status.CRASHED
            changed = next((f.message for f in seen if f.kind == "input_changed"), None)
            cases.append(judge(stage, case, value, block_size, error=changed, wrong=wrong))
            collect(findings, seen)
    return Status.CORRECT


def with_case(stage: Stage, result: StageResult, case: CaseResult, block_size: int) -> StageResult:
    """`result` with one more case, run elsewhere (the timing size's, in a GPU run's CPU analysis), as though
    its own cases had ended with it."""
    if result.status not in (Status.CORRECT, Status.INCORRECT):
        return result
    cases = (*result.cases, case)
    status = Status.CORRECT if all(c.passed for c in cases) else Status.INCORRECT
    advice = _advice(stage, status, cases, block_size, result.findings)
    return replace(result, status=status, message=_message(status, cases), hint=advice, cases=cases)


def _advice(
    stage: Stage, status: Status, cases: tuple[CaseResult, ...], block_size: int, findings: tuple[Finding, ...]
) -> str | None:
    """The stage's hint: none where it is correct, what to look for where it ran out of time with nothing found,
    else the pattern of its failed cases and its findings."""
    if status is Status.CORRECT:
        return None
    if status is Status.TIMEOUT and not findings:
        return TOO_SLOW
    return hint(stage, cases, block_size, findings)


def _message(status: Status, cases: tuple[CaseResult, ...]) -> str:
    passed = sum(case.passed for case in cases)
    if status is Status.CORRECT:
        return f"correct: all {len(cases)} cases right"
    if status in (Status.TIMEOUT, Status.CRASHED):
        last = cases[-1]
        return f"{status.value.replace('_', ' ')} on {last.label}: {last.error}"
    wrong = [case for case in cases if not case.passed]
    first = wrong[0]
    what = first.error or f"gave {first.got}, expected {first.expected}"
    return f"wrong on {len(wrong)} of {len(cases)} cases ({passed} right); first: {first.label}: {what}"
