"""Phase 3: what a run's output cannot show. On the GPU, each kernel also runs on the CPU backend over a few
small inputs (verify.analysis_cases), whose instrumented build reports races, out-of-bounds accesses and
deadlocks and measures bank conflicts and divergence; a kernel that build cannot compile is the stage's compile
error, as on the CPU backend. That run needs nothing of the GPU's, so it goes beside the stage's correctness
run (`analyse_on_cpu`), and its findings are joined to the stage's result after it. Then, on every backend,
the stage's technique is measured (autograder.technique)."""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass, replace

from autograder import technique
from autograder.at_scale import AT_SCALE_HINT
from autograder.errors import CompileError, GraderError, KernelFault, KernelTimeout
from autograder.isolation import Worker
from autograder.pipeline.check import METRICS_SECONDS, with_case
from autograder.pipeline.run import StudentRun
from autograder.pipeline.work import joined
from autograder.records import Build, CaseResult, Finding, KernelMetrics, KernelSource, StageResult, Status
from autograder.stages import Stage
from autograder.verify import Case, analysis_cases, hint, judge, kernel_metrics, run_case, timing_case


@dataclass(frozen=True)
class CpuAnalysis:
    """What the CPU backend saw of a GPU stage's kernel: the findings of each analysis case it ran, its
    measurements, why it stopped or did not run, where it did not finish, and how the kernel ended there where it
    crashed or hung (as the CPU backend grades it: the GPU's verdict cannot stand over it). Then the same of the
    timing size on sampled blocks (`at_scale`, with its case judged), which counts only for a stage the GPU found
    correct: as on the CPU backend, which runs it only after every other case was right."""

    seen: tuple[tuple[Finding, ...], ...]
    metrics: KernelMetrics | None
    note: str | None
    ended: Status | None = None
    finished: bool = True  # every case ran to its end
    cases: tuple[CaseResult, ...] = ()  # judged: the timing size's only
    at_scale: CpuAnalysis | None = None


def analyse_on_cpu(run: StudentRun, stage: Stage, source: KernelSource) -> CpuAnalysis:
    """Run the kernel on the CPU backend over a few small inputs, in the student's CPU-backend worker: races,
    bounds and deadlocks, and the bank-conflict and divergence measurements. Then at the timing size, on sampled
    blocks (autograder.at_scale). It needs nothing of the GPU's correctness run, so the pipeline runs it beside
    that run (autograder.pipeline.student).

    Where the kernel crashes or never ends there, that is the stage's verdict, as on the CPU backend: a kernel
    that could end the analysis at will (an integer division by zero traps on a CPU and not on a GPU) would
    otherwise keep its races and its technique from being checked. Where the analysis cannot run (no g++, its
    worker does not start), the GPU's verdict stands alone and says so."""
    try:
        checker = run.workers.checker()
        checker.start()
        build = run.checker_builder().build(stage, source)
    except CompileError:
        # A kernel the CPU backend cannot compile gets that compile error there: the same verdict here, or the
        # analysis could be switched off at will (one hand-in, one verdict: README, "the CPU backend").
        raise
    except GraderError as error:
        return CpuAnalysis((), None, f"the CPU race analysis did not run: {_first_line(error)}", finished=False)
    seed = run.options.seed
    analysis = _cases(run, stage, checker, build, analysis_cases(stage, seed))
    if not analysis.finished:
        return analysis
    at_scale = _cases(run, stage, checker, build, timing_case(stage, seed, run.rubric.timing.size_of(stage.shape)))
    metrics = None
    with suppress(GraderError):  # counts the runs left in the worker: no kernel code runs; a failure is the grader's
        metrics = checker.call(kernel_metrics, build, timeout=METRICS_SECONDS)
    return replace(analysis, metrics=metrics, at_scale=at_scale if at_scale.seen or not at_scale.finished else None)


def _cases(run: StudentRun, stage: Stage, checker: Worker, build: Build, cases: list[Case]) -> CpuAnalysis:
    """Run `cases` in the checker: what they saw, and how they ended where they did not finish."""
    seen: list[tuple[Finding, ...]] = []
    judged: list[CaseResult] = []
    block_size = run.rubric.block_size
    calls = [(build, case, block_size) for case in cases]
    try:
        replies = checker.call_each(run_case, calls, [run.options.case_seconds] * len(calls), confirm=True)
        for case, (value, found, wrong) in zip(cases, replies, strict=True):
            seen.append(found)
            if case.sampled:  # the CPU backend's own case, which a GPU cannot run
                judged.append(judge(stage, case, value, block_size, wrong=wrong))
    except CompileError:
        raise  # a kernel the worker's backend cannot load: as above
    except KernelFault as error:
        where = cases[len(seen)].label
        if error.findings:  # a deadlock's own findings say what stopped it, and the rubric judges them
            seen.append(error.findings)
            if error.deadlocked:  # a kernel that never ends: a timeout there
                return _stopped(seen, f"deadlocked in the CPU race analysis on {where}", Status.TIMEOUT)
            return _stopped(seen, None)
        # Killed by the machine (its memory ran out, say), not by anything the kernel can do. Only the first line is
        # the grader's: what the kernel printed follows it, and could say anything.
        if _first_line(error).endswith(_KILLED):
            return _stopped(seen, f"the CPU race analysis stopped: {_first_line(error)}")
        return _stopped(seen, f"crashed in the CPU race analysis on {where}: {_first_line(error)}", Status.CRASHED)
    except KernelTimeout as error:
        note = f"hung in the CPU race analysis on {cases[len(seen)].label}: {_first_line(error)}"
        return _stopped(seen, note, Status.TIMEOUT)
    except GraderError as error:
        return _stopped(seen, f"the CPU race analysis stopped: {_first_line(error)}")
    return CpuAnalysis(tuple(seen), None, None, cases=tuple(judged))


def _stopped(seen: list[tuple[Finding, ...]], note: str | None, ended: Status | None = None) -> CpuAnalysis:
    """An analysis that did not see its cases to the end: a case it did not finish may have written astray, so
    its stray reads are not all it did."""
    unsure = tuple(tuple(replace(f, reads_only=False) for f in found) for found in seen)
    return CpuAnalysis(unsure, None, note, ended, finished=False)


def analyse_stage(
    run: StudentRun, stage: Stage, source: KernelSource, result: StageResult, cpu: CpuAnalysis | None
) -> StageResult:
    """The stage's result with what the CPU analysis saw (`cpu`, on a GPU), then its technique measured."""
    if cpu is not None:
        at_scale = cpu.at_scale if result.status is Status.CORRECT else None
        metrics = cpu.metrics if at_scale is not None or cpu.metrics is None else replace(cpu.metrics, at_scale=None)
        result = _joined(run, stage, _joined(run, stage, result, cpu, ENDED_HINT), at_scale, AT_SCALE_HINT)
        result = replace(result, metrics=metrics)
    if result.status in (Status.CORRECT, Status.INCORRECT):
        checks = technique.check(stage, source, result.metrics, run.worker.sandbox, run.rubric.block_size)
        result = replace(result, technique=checks)
    return result


def _joined(
    run: StudentRun, stage: Stage, result: StageResult, cpu: CpuAnalysis | None, ended_hint: str
) -> StageResult:
    """`result` with what one part of the CPU analysis saw: its findings and cases, and its end (`ended_hint` the
    stage's hint where that is a crash or a hang)."""
    if cpu is None:
        return result
    findings = joined(result.findings, *cpu.seen)
    for case in cpu.cases:  # the CPU backend's own cases, which a GPU cannot run: the stage's too
        result = with_case(stage, replace(result, findings=findings), case, run.rubric.block_size)
    advice = hint(stage, result.cases, run.rubric.block_size, findings) if result.hint else None
    message = f"{result.message} ({cpu.note})" if cpu.note else result.message
    if cpu.ended is not None and result.status in (Status.CORRECT, Status.INCORRECT):
        # As the CPU backend grades it: the GPU ran it, but a crash or a hang there is the kernel's own.
        result = replace(result, status=cpu.ended, message=f"{cpu.note} (on the GPU: {result.message})")
        message, advice = result.message, ended_hint
    return replace(result, message=message, findings=findings, hint=advice)


_KILLED = "killed by signal 9 (SIGKILL)"  # how a worker killed from outside is told (autograder.isolation)
ENDED_HINT = (
    "a kernel that crashes or never ends on the CPU backend does something CUDA does not define or leaves a thread "
    "waiting for ever (an integer division by zero, an access far out of bounds, a spin-wait on another block), "
    "even where a GPU runs it to the end: grade it with --backend cpu to see where"
)


def _first_line(error: GraderError) -> str:
    return str(error).splitlines()[0][:200] if str(error) else type(error).__name__
