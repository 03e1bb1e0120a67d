"""Grading one notebook, or a few stages' sources: read, compile, verify, time, score.

Every kernel runs in a Worker process (autograder.isolation) with time limits; this module only decides.
The same functions serve `autograder grade`, `autograder check`, the notebook self-check and nbgrader's test
cells, so all of them give the same verdicts and points.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

from autograder import calibration as calibrations
from autograder import sanitizer, technique
from autograder.build import Builder
from autograder.errors import CompileError, GraderError, KernelFault, KernelTimeout, NotebookError
from autograder.isolation import Worker
from autograder.memo import StageMemo, grader_version
from autograder.notebook import stage_cells
from autograder.records import (
    Build,
    CaseResult,
    DeviceInfo,
    Finding,
    KernelSource,
    Performance,
    PerfVerdict,
    StageResult,
    Status,
    StudentResult,
)
from autograder.references import reference_source, references_available
from autograder.rubric import Rubric, judge_speed, load_rubric, score
from autograder.sandbox import Sandbox
from autograder.schedule import gpu_gate
from autograder.stages import STAGE_IDS, Shape, Stage, get_stage
from autograder.timing import TimedKernel, WrongTimedResult, prepare_timing, time_interleaved
from autograder.verify import (
    analysis_cases,
    correctness_cases,
    hint,
    judge,
    kernel_metrics,
    run_case,
)

COMPILE_SECONDS = 120.0
NOT_STARTED = "not started"  # the device of a result whose notebook could not be read: no worker ran
GPU_WAIT = "gpu wait"  # the phase of waiting for the GPU: for a timing to end, or for correctness runs to end


@dataclass(frozen=True)
class GradeOptions:
    """How to grade. The defaults are what `autograder grade` does."""

    backend: str = "auto"  # "auto", "gpu" or "cpu"
    rubric: Rubric = field(default_factory=load_rubric)
    seed: int | None = None  # None draws a fresh secret seed
    quick: bool = False  # drop the largest correctness cases (a quick self-check)
    measure_speed: bool = True  # time correct stages where the backend measures performance
    case_seconds: float = 30.0  # time limit of one correctness case, plus per_element_seconds * elements
    per_element_seconds: float = 5e-6
    calibration_dirs: tuple[Path, ...] = ()
    # On the GPU, also run each kernel on the CPU backend over a few small inputs: a GPU run cannot show a
    # race that happened to give the right sum, and the rubric prices races the same on both backends.
    race_checks: bool = True
    backend_options: Mapping[str, object] = field(default_factory=dict)
    sandbox: bool = True  # compile and run student code in the sandbox (autograder.sandbox); False: --no-sandbox
    memo_dir: Path | None = None  # where a class keeps its stage results, so identical kernels are graded once

    def with_seed(self) -> GradeOptions:
        return self if self.seed is not None else replace(self, seed=secrets.randbits(63))


Progress = Callable[[str], None]


def grade_notebook(
    path: Path, student: str, options: GradeOptions, worker: Worker | None = None, progress: Progress | None = None
) -> StudentResult:
    """Grade every stage of the notebook at `path`."""
    options = options.with_seed()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        cells = stage_cells(path)
    except NotebookError as error:
        stages = tuple(_unreadable(stage_id, str(error), options.rubric) for stage_id in STAGE_IDS)
        device = worker.device if worker else DeviceInfo(backend=options.backend, name=NOT_STARTED)
        return _student(student, path, options, started, device, stages, problems=(str(error),))
    sources = {stage_id: cell.source for stage_id, cell in cells.items()}
    problems = {stage_id: cell.problem for stage_id, cell in cells.items() if cell.problem and cell.attempted}
    with _worker_for(options, worker) as active:
        stages = grade_stages(sources, options=options, worker=active, problems=problems, progress=progress)
        device = active.device
    notebook_problems = tuple(f"{stage_id}: {problem}" for stage_id, problem in problems.items())
    return _student(student, path, options, started, device, stages, problems=notebook_problems)


def grade_stages(
    sources: Mapping[str, KernelSource | None],
    only: Sequence[str] | None = None,
    options: GradeOptions | None = None,
    worker: Worker | None = None,
    problems: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    earlier: Mapping[str, StageResult] | None = None,
) -> tuple[StageResult, ...]:
    """Grade the stages in `only` (all, when None), in catalogue order.

    A stage's speedup is measured over the student's own previous stage when that one is correct (its result
    in `earlier` or graded in this call, its source in `sources`), else over the reference previous stage.
    """
    options = (options or GradeOptions()).with_seed()
    wanted = [stage_id for stage_id in STAGE_IDS if only is None or stage_id in only]
    results: dict[str, StageResult] = dict(earlier or {})
    with _worker_for(options, worker) as active:
        grader = _StageGrader(options, active)
        try:
            grader.grade(wanted, sources, problems or {}, results, progress)
        finally:
            grader.close()
    return tuple(results[stage_id] for stage_id in wanted)


@contextmanager
def _worker_for(options: GradeOptions, worker: Worker | None) -> Iterator[Worker]:
    """The given worker, or a new one, closed on exit."""
    if worker is not None:
        yield worker
        return
    with new_worker(options) as owned:
        yield owned


def new_worker(options: GradeOptions, backend: str | None = None) -> Worker:
    """A fresh worker for one student, isolated as the options say."""
    return Worker(backend or options.backend, dict(options.backend_options), sandbox=Sandbox(options.sandbox))


class _StageGrader:
    def __init__(self, options: GradeOptions, worker: Worker) -> None:
        self.options = options
        self.rubric = options.rubric
        self.worker = worker
        self._calibration: calibrations.Calibration | None = None
        self._checker: Worker | None = None
        self._checker_builder: Builder | None = None
        self._references = references_available()
        self.builder = Builder(worker.device, worker.sandbox, dict(options.backend_options))
        # The GPU this student is timed on: its correctness runs share it, its timing has it alone.
        self.gpu = int(options.backend_options.get("device_index", 0)) if worker.device.backend == "gpu" else None
        self.waited = 0.0  # seconds this student waited at its GPU's gate: part of no phase but "gpu wait"
        self.memo = StageMemo(options.memo_dir) if options.memo_dir is not None else None  # the class memo

    def close(self) -> None:
        if self._checker is not None:
            self._checker.close()

    @contextmanager
    def _gate(self, exclusive: bool) -> Iterator[None]:
        """This student's GPU, shared or alone (autograder.schedule.gpu_gate), the wait counted."""
        started = time.perf_counter()
        with gpu_gate(self.gpu, exclusive):
            self.waited += time.perf_counter() - started
            yield

    @contextmanager
    def _shared_phase(self, phase: str, items: Sequence[_Checked]) -> Iterator[None]:
        """Time a phase that several stages go through together, each charged an equal part of it."""
        started, waited = time.perf_counter(), self.waited
        try:
            yield
        finally:
            gate = self.waited - waited
            for item in items:
                item.phases.add(phase, (time.perf_counter() - started - gate) / len(items))
                item.phases.add(GPU_WAIT, gate / len(items))

    def grade(
        self,
        wanted: Sequence[str],
        sources: Mapping[str, KernelSource | None],
        problems: Mapping[str, str],
        results: dict[str, StageResult],
        progress: Progress | None,
    ) -> None:
        """Grade the `wanted` stages into `results`, as a pipeline over the student's stages: each stage is
        compiled and checked in turn, then all of them go through compute-sanitizer together and are timed
        together (one group per input shape, the GPU alone), then scored."""
        checked: list[_Checked] = []
        for stage_id in wanted:
            if progress:
                progress(stage_id)
            outcome = self._check(get_stage(stage_id), sources.get(stage_id), problems.get(stage_id), sources, results)
            if isinstance(outcome, _Checked):
                checked.append(outcome)
                outcome = outcome.result
            results[stage_id] = outcome
        self._sanitize(checked)
        self._time(checked, sources, results)
        for item in checked:
            results[item.stage.id] = final = self._finish(item.stage, replace(item.result, phases=item.phases.seconds))
            own = _own_baseline(item.stage, sources, results)
            if self.memo is not None and item.memo_key is not None and (own.text if own else None) == item.baseline:
                self.memo.put(item.memo_key, final)

    def _check(
        self,
        stage: Stage,
        source: KernelSource | None,
        problem: str | None,
        sources: Mapping[str, KernelSource | None],
        earlier: Mapping[str, StageResult],
    ) -> StageResult | _Checked:
        """A finished result (nothing to run, a compile error, or the class memo's), or a stage compiled and
        checked, for the phases that take all of a student's stages together."""
        if problem:
            return self._finish(stage, StageResult(stage.id, Status.INVALID_CELL, problem))
        if source is None:
            message = "not attempted: the kernel cell is missing, empty, or still the released stub"
            return self._finish(stage, StageResult(stage.id, Status.NOT_ATTEMPTED, message))
        own = _own_baseline(stage, sources, earlier)
        memo = self.memo
        key = checked_key = None
        if memo is not None:
            # Everything the result depends on: the source and its first cell line, the options (the seed and
            # the rubric's hash among them), the device and the grader; and for its speed, the baseline.
            run = (replace(self.options, memo_dir=None, backend_options={}), self.worker.device, grader_version())
            key = StageMemo.key(stage.id, source.text, source.cell_line(1), own.text if own else "reference", *run)
            kept = memo.get(key)
            if kept is not None:
                return replace(kept, phases=())  # graded before: this student's stage cost no compile, check or timing
            checked_key = StageMemo.key("checked", stage.id, source.text, source.cell_line(1), *run)
        phases = _Phases(lambda: self.waited)
        try:
            with phases("compile"):
                build = self.builder.build(stage, source)
        except CompileError as error:
            return self._finish(stage, replace(_compile_failure(stage, error), phases=phases.seconds))
        except KernelTimeout as error:
            failure = StageResult(stage.id, Status.CRASHED, f"the compiler failed: {error}", phases=phases.seconds)
            return self._finish(stage, failure)
        baseline = own.text if own else None
        if memo is None or checked_key is None:
            return _Checked(stage, source, build, self._checks(stage, source, build, phases), phases, key, baseline)
        with memo.claim([checked_key]):
            result = memo.get(checked_key)  # checked before, over another baseline: only its timing is left
            if result is None:
                result = self._checks(stage, source, build, phases)
                memo.put(checked_key, result)
        return _Checked(stage, source, build, result, phases, key, baseline)

    def _checks(self, stage: Stage, source: KernelSource, build: Build, phases: _Phases) -> StageResult:
        """Correctness, then the race analysis and the technique checks."""
        with phases("correctness"):
            result = self._verify(stage, build)
        with phases("analysis"):
            if self.worker.device.backend == "gpu" and self.options.race_checks:
                result = self._check_on_cpu(stage, source, result)
            if result.status in (Status.CORRECT, Status.INCORRECT):
                checks = technique.check(stage, source, result.metrics, self.worker.sandbox, self.rubric.block_size)
                result = replace(result, technique=checks)
        return result

    def _verify(self, stage: Stage, build: Build) -> StageResult:
        block_size = self.rubric.block_size
        cases: list[CaseResult] = []
        findings: dict[tuple, Finding] = {}
        status = Status.CORRECT
        for case in correctness_cases(stage, self.options.seed, quick=self.options.quick, block_size=block_size):
            limit = self.options.case_seconds + self.options.per_element_seconds * case.count
            try:
                with self._gate(exclusive=False):
                    value, seen = self.worker.call(run_case, build, case, block_size, timeout=limit)
            except KernelTimeout as error:
                cases.append(judge(stage, case, None, block_size, error=str(error)))
                status = Status.TIMEOUT
                break
            except KernelFault as error:
                cases.append(judge(stage, case, None, block_size, error=str(error)))
                _collect(findings, error.findings)
                status = Status.CRASHED
                break
            changed = next((f.message for f in seen if f.kind == "input_changed"), None)
            cases.append(judge(stage, case, value, block_size, error=changed))
            _collect(findings, seen)
        if status is Status.CORRECT and not all(case.passed for case in cases):
            status = Status.INCORRECT
        metrics = None
        if status in (Status.CORRECT, Status.INCORRECT):
            try:
                metrics = self.worker.call(kernel_metrics, build, timeout=COMPILE_SECONDS)
            except (KernelTimeout, KernelFault):
                metrics = None
        case_tuple = tuple(cases)
        distinct = _distinct(findings)
        return StageResult(
            stage=stage.id,
            status=status,
            message=_verification_message(status, case_tuple),
            hint=hint(stage, case_tuple, block_size, distinct) if status is not Status.CORRECT else None,
            compiler=build.warnings,
            cases=case_tuple,
            findings=distinct,
            metrics=metrics,
        )

    def _check_on_cpu(self, stage: Stage, source: KernelSource, result: StageResult) -> StageResult:
        """Add what the CPU backend sees on a few small inputs to a GPU result: races, bounds and deadlocks,
        and the bank-conflict and divergence measurements."""
        findings: dict[tuple, Finding] = {}
        _collect(findings, result.findings)
        metrics = None
        message = result.message
        try:
            if self._checker is None or self._checker_builder is None:
                self._checker = new_worker(self.options, "cpu")
                self._checker_builder = Builder(self._checker.device, self._checker.sandbox)
            build = self._checker_builder.build(stage, source)
            for case in analysis_cases(stage, self.options.seed):
                limit = self.options.case_seconds
                _, seen = self._checker.call(run_case, build, case, self.rubric.block_size, timeout=limit)
                _collect(findings, seen)
            metrics = self._checker.call(kernel_metrics, build, timeout=COMPILE_SECONDS)
        except KernelFault as error:
            _collect(findings, error.findings)
        except GraderError as error:
            # No CPU backend here, a compile difference or a hang there: the GPU verdict stands alone, and says so.
            why = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
            message = f"{message} (the CPU race analysis did not run: {why})"
        distinct = _distinct(findings)
        advice = hint(stage, result.cases, self.rubric.block_size, distinct) if result.hint else None
        return replace(result, message=message, findings=distinct, metrics=metrics, hint=advice)

    def _sanitize(self, checked: list[_Checked]) -> None:
        """compute-sanitizer over every stage that ran (autograder.sanitizer), its findings joined with the
        CPU analysis's. On the GPU only; where it is not installed, each stage's message says so. In a class,
        a kernel source is sanitized once: what the tools see depends on the source alone."""
        ran = [item for item in checked if item.result.status in (Status.CORRECT, Status.INCORRECT, Status.CRASHED)]
        if not ran or self.worker.device.backend != "gpu":
            return
        tool = sanitizer.find_sanitizer()
        if tool is None:
            for item in ran:
                note = "compute-sanitizer is not installed here: the GPU's own checks did not run"
                item.result = replace(item.result, message=f"{item.result.message} ({note})")
            return
        keys = {
            item.stage.id: StageMemo.key(
                "sanitizer", item.stage.id, item.source.text, item.source.cell_line(1), self.rubric.block_size,
                self.worker.device, self.options.sandbox, grader_version(),
            )
            for item in ran
        }
        seen = self._sanitized(ran, tool, keys)
        for item in ran:
            findings: dict[tuple, Finding] = {}
            _collect(findings, item.result.findings)
            _collect(findings, seen[item.stage.id].findings)
            distinct = _distinct(findings)
            result = item.result
            advice = hint(item.stage, result.cases, self.rubric.block_size, distinct) if result.hint else None
            message = "; ".join((result.message, *seen[item.stage.id].notes))
            item.result = replace(result, findings=distinct, hint=advice, message=message)

    def _sanitized(self, ran: list[_Checked], tool: str, keys: Mapping[str, str]) -> dict[str, sanitizer.Sanitized]:
        """What the tools saw in each stage: from the memo where it was kept, else run now (and kept)."""
        memo = self.memo

        def kept() -> dict[str, sanitizer.Sanitized]:
            found = {item.stage.id: memo.get(keys[item.stage.id], sanitizer.Sanitized) for item in ran} if memo else {}
            return {stage_id: seen for stage_id, seen in found.items() if seen is not None}

        seen = kept()
        missing = [keys[item.stage.id] for item in ran if item.stage.id not in seen]
        with memo.claim(missing) if memo is not None and missing else nullcontext():
            seen = kept()  # a student graded at the same time may have run them while this one waited
            todo = [item for item in ran if item.stage.id not in seen]
            if not todo:
                return seen
            with self._shared_phase("sanitizer", todo):
                fresh = sanitizer.sanitize(
                    {item.stage.id: item.build for item in todo}, tool, self.worker.sandbox,
                    self.options.backend_options, self.rubric.block_size, lambda: self._gate(exclusive=False),
                )
            for stage_id, found in fresh.items():
                seen[stage_id] = found
                if memo is not None and not found.notes:  # a tool that could not finish is tried again
                    memo.put(keys[stage_id], found)
        return seen

    def _time(
        self, checked: list[_Checked], sources: Mapping[str, KernelSource | None], results: dict[str, StageResult]
    ) -> None:
        """Time every correct stage: one group per input shape, every kernel interleaved with the others."""
        correct = [item for item in checked if item.result.status is Status.CORRECT]
        unmeasured = self._unmeasured_reason()
        if unmeasured:
            for item in correct:
                item.result = replace(item.result, performance=Performance(PerfVerdict.NOT_MEASURED, unmeasured))
            return
        for shape in (Shape.SUM_1D, Shape.MAX_2D):
            group = [item for item in correct if item.stage.shape is shape]
            if group:
                with self._shared_phase("timing", group):
                    self._time_group(group, sources, results)

    def _time_group(
        self, group: list[_Checked], sources: Mapping[str, KernelSource | None], results: dict[str, StageResult]
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
                own = _own_baseline(stage, sources, results)
                baseline = f"your {previous.id}" if own is not None else f"reference {previous.id}"
                if baseline not in kernels:
                    build = built.get(previous.id) if own is not None else None
                    build = build or self.builder.build(previous, own or reference_source(previous.id))
                    kernels[baseline] = TimedKernel(baseline, previous.id, build)
            reference = f"reference {stage.id}"
            if reference not in kernels:
                build = self.builder.build(stage, reference_source(stage.id))
                kernels[reference] = TimedKernel(reference, stage.id, build)
            compared[stage.id] = (yours, baseline, reference)
        timing = self.rubric.timing
        limit = timing.budget_seconds * 2 + 120
        try:
            # The inputs are drawn first: host work that need not hold the GPU.
            self.worker.call(prepare_timing, tuple(compared), timing, self.options.seed, timeout=limit)
            with self._gate(exclusive=True):
                group_kernels = tuple(kernels.values())
                measured = self.worker.call(time_interleaved, group_kernels, timing, self.options.seed, timeout=limit)
        except WrongTimedResult as error:
            culprit = next((item for item in group if str(error).startswith(f"your {item.stage.id}:")), None)
            if culprit is None and len(group) > 1:  # a baseline kept from the memo: each stage on its own
                for item in group:
                    self._time_group([item], sources, results)
                return
            culprit = culprit or group[0]
            hint_text = "results must not depend on the call"
            wrong = replace(culprit.result, status=Status.INCORRECT, message=str(error), hint=hint_text)
            culprit.result = results[culprit.stage.id] = wrong
            rest = [item for item in group if item is not culprit]
            if rest:
                self._time_group(rest, sources, results)
            return
        except (KernelTimeout, KernelFault) as error:
            if len(group) > 1:
                for item in group:
                    self._time_group([item], sources, results)
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
            step = self.calibration().step(item.stage.id) if baseline else None
            item.result = replace(item.result, performance=judge_speed(self.rubric, timings, baseline, step))

    def calibration(self) -> calibrations.Calibration:
        """This GPU's calibration; measured now (and kept in the user's cache) when none matches."""
        if self._calibration is None:
            gpu = self.worker.device.name
            settings = self.rubric.timing
            found = calibrations.load_calibration(gpu, settings, self.options.calibration_dirs)
            if found is None:
                # Only the reference kernels run in a calibration: a worker of the grader's own, which compiles.
                options = dict(self.options.backend_options)
                with Worker(self.worker.backend_name, options, Sandbox(False)) as trusted, self._gate(exclusive=True):
                    found = trusted.call(calibrations.measure, settings, self.options.seed, timeout=1800)
                calibrations.write_calibration(found, calibrations.calibration_path(gpu, calibrations.USER_DIR))
            self._calibration = found
        return self._calibration

    def _unmeasured_reason(self) -> str | None:
        """Why speed is not measured, and so not counted, in this run; None when it is."""
        if self.worker.device.backend != "gpu":
            return "not measured on the CPU backend: speed is graded on a GPU"
        if not self.options.measure_speed:
            return "speed not measured (--no-speed)"
        if not self._references:
            return "not measured here: the reference kernels it is timed against are not installed"
        return None

    def _finish(self, stage: Stage, result: StageResult) -> StageResult:
        measured = self._unmeasured_reason() is None
        points = score(
            self.rubric,
            stage.id,
            result.status,
            sum(case.passed for case in result.cases),
            len(result.cases),
            result.findings,
            result.performance,
            performance_measured=measured,
            technique=result.technique,
        )
        return replace(result, points=points)


@dataclass
class _Checked:
    """A stage compiled and checked, on its way through the phases that take a student's stages together."""

    stage: Stage
    source: KernelSource
    build: Build
    result: StageResult
    phases: _Phases
    memo_key: str | None  # where its result goes in the class memo; None without one
    baseline: str | None  # the source of the student's own baseline it was keyed with; None: the reference


class _Phases:
    """Seconds spent in each phase of grading a stage (compile, correctness, analysis, sanitizer, timing), and
    apart from them, in waiting for the GPU (GPU_WAIT): `waited` reads the student's time at the gate so far."""

    def __init__(self, waited: Callable[[], float]) -> None:
        self._seconds: dict[str, float] = {}
        self._waited = waited

    def add(self, phase: str, seconds: float) -> None:
        """Time of a phase that several stages share, this stage's part of it."""
        if seconds:
            self._seconds[phase] = self._seconds.get(phase, 0.0) + seconds

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        started, waited = time.perf_counter(), self._waited()
        try:
            yield
        finally:
            gate = self._waited() - waited
            self.add(phase, time.perf_counter() - started - gate)
            self.add(GPU_WAIT, gate)

    @property
    def seconds(self) -> tuple[tuple[str, float], ...]:
        return tuple((phase, round(seconds, 4)) for phase, seconds in self._seconds.items())


def _own_baseline(
    stage: Stage, sources: Mapping[str, KernelSource | None], earlier: Mapping[str, StageResult]
) -> KernelSource | None:
    """The student's own previous stage, when it is correct: the kernel a stage's speedup is measured over."""
    own, own_result = sources.get(stage.previous or ""), earlier.get(stage.previous or "")
    return own if own is not None and own_result is not None and own_result.status is Status.CORRECT else None


def _collect(findings: dict[tuple, Finding], new: tuple[Finding, ...]) -> None:
    """Add findings, one per kind and line."""
    findings.update({(f.kind, f.line): f for f in new})


def _distinct(findings: dict[tuple, Finding]) -> tuple[Finding, ...]:
    """The findings, less a warp race on a line that also has a block-wide race: two warps racing on a line
    usually means lanes of one warp race there too, and the missing __syncthreads is the one thing to fix."""
    barrier_lines = {line for kind, line in findings if kind == "race_syncthreads"}
    return tuple(f for (kind, line), f in findings.items() if not (kind == "race_syncwarp" and line in barrier_lines))


def _compile_failure(stage: Stage, error: CompileError) -> StageResult:
    errors = [m for m in error.messages if m.severity == "error"]
    first = errors[0] if errors else None
    where = f" at line {first.line}" if first and first.line else ""
    detail = f": {first.text}" if first else f": {error}"
    return StageResult(
        stage=stage.id,
        status=Status.COMPILE_ERROR,
        message=f"does not compile{where}{detail}",
        hint="fix the first error first; later errors often follow from it",
        compiler=error.messages,
    )


def _verification_message(status: Status, cases: tuple[CaseResult, ...]) -> str:
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


def _unreadable(stage_id: str, problem: str, rubric: Rubric) -> StageResult:
    result = StageResult(stage_id, Status.INVALID_CELL, problem)
    points = score(rubric, stage_id, result.status, 0, 0, (), result.performance, performance_measured=False)
    return replace(result, points=points)


def _student(
    student: str,
    path: Path,
    options: GradeOptions,
    started: str,
    device: DeviceInfo,
    stages: tuple[StageResult, ...],
    problems: tuple[str, ...],
) -> StudentResult:
    return StudentResult(
        student=student,
        notebook=str(path),
        seed=options.seed,
        started=started,
        device=device,
        rubric=options.rubric.label,
        stages=stages,
        problems=problems,
        isolation=Sandbox(options.sandbox).label,
        grader_version=grader_version(),
    )


__all__ = ["GradeOptions", "GraderError", "grade_notebook", "grade_stages"]
