"""Phase 6: a stage's verdict and its points. A finding that leaves the kernel's result undefined by CUDA
decides before its output does (the rubric's [undefined_behaviour]); then the rubric's arithmetic
(autograder.rubric.score) gives the points."""

from __future__ import annotations

from dataclasses import replace

from autograder.pipeline.run import StudentRun
from autograder.records import StageResult, Status
from autograder.rubric import Rubric, score
from autograder.stages import Stage
from autograder.verify import UNDEFINED_KINDS, undefined_hint


def undefined_behaviour(rubric: Rubric, result: StageResult) -> StageResult:
    """A correct stage with a finding of undefined behaviour made incorrect, as the rubric says by default.

    Such a kernel's output proves nothing: a data race sums right on one GPU and wrong on another, or on the CPU
    backend's schedule, and a shuffle that reads a lane outside its mask gives that lane's value on an H200 and
    garbage elsewhere. Judged by its findings, which both backends report alike, a hand-in gets one verdict.
    """
    if rubric.undefined != "incorrect" or result.status is not Status.CORRECT:
        return result
    count = len(result.cases)
    return _incorrect(result, f"computes, so its right results here ({count} of {count} cases) do not count")


def undefined_end(rubric: Rubric, result: StageResult) -> StageResult:
    """A stage whose kernel crashed or hung in its correctness run, with a finding of undefined behaviour from the
    checks both backends run (the CPU analysis, the output guards), made incorrect as the rubric says by default.

    Crashing or hanging is one of the things such a kernel may do, on one GPU and not on another, or on the CPU
    backend, where the same kernel runs to its end and is incorrect: judged by its findings, a hand-in gets one
    verdict. The pipeline keeps treating the kernel as one that crashed or hung (pipeline.work.StageWork.ended).
    """
    if rubric.undefined != "incorrect" or result.status not in (Status.CRASHED, Status.TIMEOUT):
        return result
    did = "crashed" if result.status is Status.CRASHED else "hung"
    return _incorrect(result, f"does, and here it {did} ({result.message})")


def _incorrect(result: StageResult, what: str) -> StageResult:
    """`result` made incorrect by its findings of undefined behaviour, if it has any: the message names their kinds
    and lines, then says what CUDA does not define (`what`), and the hint says what to fix first."""
    undefined = [f for f in result.findings if f.kind in UNDEFINED_KINDS]
    if not undefined:
        return result
    kinds = ", ".join(dict.fromkeys(f.kind.replace("_", " ") for f in undefined))
    lines = sorted({f.line for f in undefined if f.line})
    where = f" at line {', '.join(map(str, lines))}" if lines else ""
    message = (
        f"incorrect: the kernel's result is undefined ({kinds}{where}); CUDA does not define what such a kernel {what}"
    )
    if all(f.kind == "kept_state" for f in undefined):  # defined, but by the calls before it
        message = (
            f"incorrect: the kernel keeps state between launches ({kinds}{where}), so its result depends on the "
            "calls before it (a timed call follows many); a kernel keeps nothing between launches"
        )
    advice = undefined_hint(tuple(undefined)) or "fix what the findings report: a kernel may do only what CUDA defines"
    return replace(result, status=Status.INCORRECT, message=message, hint=advice)


def finish(run: StudentRun, stage: Stage, result: StageResult) -> StageResult:
    """The stage's result with its points."""
    points = score(
        run.rubric,
        stage.id,
        result.status,
        sum(case.passed for case in result.cases),
        len(result.cases),
        result.findings,
        result.performance,
        performance_measured=run.unmeasured_reason() is None,
        technique=result.technique,
    )
    return replace(result, points=points)
