"""Phase 3: what a run's output cannot show. On the GPU, each kernel also runs on the CPU backend over a few
small inputs (verify.analysis_cases), whose instrumented build reports races, out-of-bounds accesses and
deadlocks and measures bank conflicts and divergence; a kernel that build cannot compile is the stage's compile
error, as on the CPU backend. Then, on every backend, the stage's technique is measured (autograder.technique)."""

from __future__ import annotations

from dataclasses import replace

from autograder import technique
from autograder.errors import CompileError, GraderError, KernelFault
from autograder.pipeline.check import METRICS_SECONDS
from autograder.pipeline.run import StudentRun
from autograder.pipeline.work import joined
from autograder.records import KernelSource, StageResult, Status
from autograder.stages import Stage
from autograder.verify import analysis_cases, hint, kernel_metrics, run_case


def analyse_stage(run: StudentRun, stage: Stage, source: KernelSource, result: StageResult) -> StageResult:
    if run.on_gpu and run.options.race_checks:
        result = _on_cpu(run, stage, source, result)
    if result.status in (Status.CORRECT, Status.INCORRECT):
        checks = technique.check(stage, source, result.metrics, run.worker.sandbox, run.rubric.block_size)
        result = replace(result, technique=checks)
    return result


def _on_cpu(run: StudentRun, stage: Stage, source: KernelSource, result: StageResult) -> StageResult:
    """Add what the CPU backend sees on a few small inputs to a GPU result: races, bounds and deadlocks, and the
    bank-conflict and divergence measurements."""
    seen = []
    metrics = None
    message = result.message
    finished = False
    try:
        checker = run.workers.checker()
        build = run.checker_builder().build(stage, source)
        for case in analysis_cases(stage, run.options.seed):
            _, found = checker.call(run_case, build, case, run.rubric.block_size, timeout=run.options.case_seconds)
            seen.append(found)
        finished = True
        metrics = checker.call(kernel_metrics, build, timeout=METRICS_SECONDS)
    except KernelFault as error:
        seen.append(error.findings)  # a deadlock's own findings say what stopped it; a crash has none
        if not error.findings:
            message = f"{message} (the CPU race analysis stopped: {_first_line(error)})"
    except CompileError:
        # A kernel the CPU backend cannot compile gets that compile error there: the same verdict here, or the
        # analysis could be switched off at will (one hand-in, one verdict: README, "the CPU backend").
        raise
    except GraderError as error:
        # No CPU backend here, or a hang there: the GPU verdict stands alone, and says so.
        message = f"{message} (the CPU race analysis did not run: {_first_line(error)})"
    if not finished:  # a case it did not see to the end may have written astray: its stray reads are not all
        seen = [tuple(replace(f, reads_only=False) for f in found) for found in seen]
    findings = joined(result.findings, *seen)
    advice = hint(stage, result.cases, run.rubric.block_size, findings) if result.hint else None
    return replace(result, message=message, findings=findings, metrics=metrics, hint=advice)


def _first_line(error: GraderError) -> str:
    return str(error).splitlines()[0][:200] if str(error) else type(error).__name__
