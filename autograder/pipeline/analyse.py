"""Phase 3: what a run's output cannot show. On the GPU, each kernel also runs on the CPU backend over a few
small inputs (verify.analysis_cases), whose instrumented build reports races, out-of-bounds accesses and
deadlocks and measures bank conflicts and divergence; a kernel that build cannot compile is the stage's compile
error, as on the CPU backend. That run needs nothing of the GPU's, so it goes beside the stage's correctness
run (`analyse_on_cpu`), and its findings are joined to the stage's result after it. Then, on every backend,
the stage's technique is measured (autograder.technique)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from autograder import technique
from autograder.errors import CompileError, GraderError, KernelFault, KernelTimeout
from autograder.pipeline.check import METRICS_SECONDS
from autograder.pipeline.run import StudentRun
from autograder.pipeline.work import joined
from autograder.records import Finding, KernelMetrics, KernelSource, StageResult, Status
from autograder.stages import Stage
from autograder.verify import analysis_cases, hint, kernel_metrics, run_case


@dataclass(frozen=True)
class CpuAnalysis:
    """What the CPU backend saw of a GPU stage's kernel: the findings of each analysis case it ran, its
    measurements, why it stopped or did not run, where it did not finish, and how the kernel ended there where it
    crashed or hung (as the CPU backend grades it: the GPU's verdict cannot stand over it)."""

    seen: tuple[tuple[Finding, ...], ...]
    metrics: KernelMetrics | None
    note: str | None
    ended: Status | None = None


def analyse_on_cpu(run: StudentRun, stage: Stage, source: KernelSource) -> CpuAnalysis:
    """Run the kernel on the CPU backend over a few small inputs, in the student's CPU-backend worker: races,
    bounds and deadlocks, and the bank-conflict and divergence measurements. It needs nothing of the GPU's
    correctness run, so the pipeline runs it beside that run (autograder.pipeline.student).

    Where the kernel crashes or never ends there, that is the stage's verdict, as on the CPU backend: a kernel
    that could end the analysis at will (an integer division by zero traps on a CPU and not on a GPU) would
    otherwise keep its races and its technique from being checked. Where the analysis cannot run (no g++, its
    worker does not start), the GPU's verdict stands alone and says so."""
    seen: list[tuple[Finding, ...]] = []
    try:
        checker = run.workers.checker()
        checker.start()
        build = run.checker_builder().build(stage, source)
    except CompileError:
        # A kernel the CPU backend cannot compile gets that compile error there: the same verdict here, or the
        # analysis could be switched off at will (one hand-in, one verdict: README, "the CPU backend").
        raise
    except GraderError as error:
        return CpuAnalysis((), None, f"the CPU race analysis did not run: {_first_line(error)}")
    cases = analysis_cases(stage, run.options.seed)
    calls = [(build, case, run.rubric.block_size) for case in cases]
    try:
        for _, found, _ in checker.call_each(run_case, calls, [run.options.case_seconds] * len(calls)):
            seen.append(found)
    except CompileError:
        raise  # a kernel the worker's backend cannot load: as above
    except KernelFault as error:
        where = cases[len(seen)].label
        if error.findings:  # a deadlock's own findings say what stopped it, and the rubric judges them
            seen.append(error.findings)
            if error.deadlocked:  # a kernel that never ends: a timeout there
                return CpuAnalysis(_unsure(seen), None, f"deadlocked in the CPU race analysis on {where}",
                                   Status.TIMEOUT)
            return CpuAnalysis(_unsure(seen), None, None)
        # Killed by the machine (its memory ran out, say), not by anything the kernel can do. Only the first line is
        # the grader's: what the kernel printed follows it, and could say anything.
        if _first_line(error).endswith(_KILLED):
            return CpuAnalysis(_unsure(seen), None, f"the CPU race analysis stopped: {_first_line(error)}")
        note = f"crashed in the CPU race analysis on {where}: {_first_line(error)}"
        return CpuAnalysis(_unsure(seen), None, note, Status.CRASHED)
    except KernelTimeout as error:
        note = f"hung in the CPU race analysis on {cases[len(seen)].label}: {_first_line(error)}"
        return CpuAnalysis(_unsure(seen), None, note, Status.TIMEOUT)
    except GraderError as error:
        return CpuAnalysis(_unsure(seen), None, f"the CPU race analysis stopped: {_first_line(error)}")
    try:  # counts the runs left in the worker: no kernel code runs, and a failure here is the grader's
        metrics = checker.call(kernel_metrics, build, timeout=METRICS_SECONDS)
    except GraderError:
        metrics = None
    return CpuAnalysis(tuple(seen), metrics, None)


def _unsure(seen: list[tuple[Finding, ...]]) -> tuple[tuple[Finding, ...], ...]:
    """The findings of an analysis that did not see its cases to the end: a case it did not finish may have
    written astray, so its stray reads are not all it did."""
    return tuple(tuple(replace(f, reads_only=False) for f in found) for found in seen)


def analyse_stage(
    run: StudentRun, stage: Stage, source: KernelSource, result: StageResult, cpu: CpuAnalysis | None
) -> StageResult:
    """The stage's result with what the CPU analysis saw (`cpu`, on a GPU), then its technique measured."""
    if cpu is not None:
        findings = joined(result.findings, *cpu.seen)
        advice = hint(stage, result.cases, run.rubric.block_size, findings) if result.hint else None
        message = f"{result.message} ({cpu.note})" if cpu.note else result.message
        if cpu.ended is not None and result.status in (Status.CORRECT, Status.INCORRECT):
            # As the CPU backend grades it: the GPU ran it, but a crash or a hang there is the kernel's own.
            result = replace(result, status=cpu.ended, message=f"{cpu.note} (on the GPU: {result.message})")
            message, advice = result.message, ENDED_HINT
        result = replace(result, message=message, findings=findings, metrics=cpu.metrics, hint=advice)
    if result.status in (Status.CORRECT, Status.INCORRECT):
        checks = technique.check(stage, source, result.metrics, run.worker.sandbox, run.rubric.block_size)
        result = replace(result, technique=checks)
    return result


_KILLED = "killed by signal 9 (SIGKILL)"  # how a worker killed from outside is told (autograder.isolation)
ENDED_HINT = (
    "a kernel that crashes or never ends on the CPU backend does something CUDA does not define or leaves a thread "
    "waiting for ever (an integer division by zero, an access far out of bounds, a spin-wait on another block), "
    "even where a GPU runs it to the end: grade it with --backend cpu to see where"
)


def _first_line(error: GraderError) -> str:
    return str(error).splitlines()[0][:200] if str(error) else type(error).__name__
