"""Phase 3: what a run's output cannot show. On the GPU, each kernel also runs on the CPU backend over a few
small inputs (verify.analysis_cases), whose instrumented build reports races, out-of-bounds accesses and
deadlocks and measures bank conflicts and divergence; a kernel that build cannot compile is the stage's compile
error, as on the CPU backend. That run needs nothing of the GPU's, so it goes beside the stage's correctness
run (`analyse_on_cpu`), and its findings are joined to the stage's result after it. Then, on every backend,
the stage's technique is measured (autograder.technique)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from autograder import technique
from autograder.errors import CompileError, GraderError, KernelFault
from autograder.pipeline.check import METRICS_SECONDS
from autograder.pipeline.run import StudentRun
from autograder.pipeline.work import joined
from autograder.records import Finding, KernelMetrics, KernelSource, StageResult, Status
from autograder.stages import Stage
from autograder.verify import analysis_cases, hint, kernel_metrics, run_case


@dataclass(frozen=True)
class CpuAnalysis:
    """What the CPU backend saw of a GPU stage's kernel: the findings of each analysis case it ran, its
    measurements, and why it stopped or did not run, where it did not finish."""

    seen: tuple[tuple[Finding, ...], ...]
    metrics: KernelMetrics | None
    note: str | None


def analyse_on_cpu(run: StudentRun, stage: Stage, source: KernelSource) -> CpuAnalysis:
    """Run the kernel on the CPU backend over a few small inputs, in the student's CPU-backend worker: races,
    bounds and deadlocks, and the bank-conflict and divergence measurements. It needs nothing of the GPU's
    correctness run, so the pipeline runs it beside that run (autograder.pipeline.student)."""
    seen: list[tuple[Finding, ...]] = []
    metrics = None
    note = None
    finished = False
    try:
        checker = run.workers.checker()
        build = run.checker_builder().build(stage, source)
        calls = [(build, case, run.rubric.block_size) for case in analysis_cases(stage, run.options.seed)]
        for _, found, _ in checker.call_each(run_case, calls, [run.options.case_seconds] * len(calls)):
            seen.append(found)
        finished = True
        metrics = checker.call(kernel_metrics, build, timeout=METRICS_SECONDS)
    except KernelFault as error:
        seen.append(error.findings)  # a deadlock's own findings say what stopped it; a crash has none
        if not error.findings:
            note = f"the CPU race analysis stopped: {_first_line(error)}"
    except CompileError:
        # A kernel the CPU backend cannot compile gets that compile error there: the same verdict here, or the
        # analysis could be switched off at will (one hand-in, one verdict: README, "the CPU backend").
        raise
    except GraderError as error:
        # No CPU backend here, or a hang there: the GPU verdict stands alone, and says so.
        note = f"the CPU race analysis did not run: {_first_line(error)}"
    if not finished:  # a case it did not see to the end may have written astray: its stray reads are not all
        seen = [tuple(replace(f, reads_only=False) for f in found) for found in seen]
    return CpuAnalysis(tuple(seen), metrics, note)


def analyse_stage(
    run: StudentRun, stage: Stage, source: KernelSource, result: StageResult, cpu: CpuAnalysis | None
) -> StageResult:
    """The stage's result with what the CPU analysis saw (`cpu`, on a GPU), then its technique measured."""
    if cpu is not None:
        findings = joined(result.findings, *cpu.seen)
        advice = hint(stage, result.cases, run.rubric.block_size, findings) if result.hint else None
        message = f"{result.message} ({cpu.note})" if cpu.note else result.message
        result = replace(result, message=message, findings=findings, metrics=cpu.metrics, hint=advice)
    if result.status in (Status.CORRECT, Status.INCORRECT):
        checks = technique.check(stage, source, result.metrics, run.worker.sandbox, run.rubric.block_size)
        result = replace(result, technique=checks)
    return result


def _first_line(error: GraderError) -> str:
    return str(error).splitlines()[0][:200] if str(error) else type(error).__name__
