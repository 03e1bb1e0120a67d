"""What every phase of one student's grading shares: the options, the student's workers, the builder, the
class memo, the student's GPU and its gate, and the grader's own failures met on the way."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from autograder import calibration as calibrations
from autograder.build import Builder
from autograder.executors import StudentWorkers
from autograder.isolation import Worker
from autograder.memo import StageMemo
from autograder.pipeline.work import Phases, StageWork
from autograder.references import references_available
from autograder.rubric import Rubric
from autograder.sandbox import Sandbox
from autograder.schedule import gpu_gate

if TYPE_CHECKING:
    from autograder.grade import GradeOptions


@dataclass
class StudentRun:
    options: GradeOptions
    workers: StudentWorkers
    builder: Builder
    memo: StageMemo | None  # the class memo; None grading alone
    gpu: int | None  # the GPU this student is timed on: its correctness runs share it, its timing has it alone
    references: bool  # whether the reference kernels, which speed is measured against, are installed
    waited: float = 0.0  # seconds waited at the GPU's gate: part of no phase but GPU_WAIT
    grader_errors: list[str] = field(default_factory=list)  # the grader's own failures, for the course staff
    # The main worker's processes (Worker.restarts then) in which a stage's grading ended in an error, its
    # kernel perhaps run: such a process serves no later student (autograder.pipeline.student).
    failed_in: set[int] = field(default_factory=set)
    _calibration: calibrations.Calibration | None = None
    _wait_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _waiters: int = 0  # the student's threads waiting at the gate now
    _since: float = 0.0  # when `waited` was last brought up to date
    _checker_builder: Builder | None = None

    @classmethod
    def start(cls, options: GradeOptions, workers: StudentWorkers) -> StudentRun:
        main = workers.main
        if not main.known and options.race_checks and options.backend != "cpu" and Path("/dev/nvidia0").exists():
            # A process's first student: its builder waits for the main worker's start (on a GPU a CUDA context,
            # seconds when a class starts) to learn the device; the CPU analysis's worker starts meanwhile.
            workers.start_checker_ahead()
        return cls(
            options=options,
            workers=workers,
            builder=Builder(main.device, main.sandbox, dict(options.backend_options)),
            memo=StageMemo(options.memo_dir) if options.memo_dir is not None else None,
            gpu=int(options.backend_options.get("device_index", 0)) if main.device.backend == "gpu" else None,
            references=references_available(),
        )

    @property
    def rubric(self) -> Rubric:
        return self.options.rubric

    @property
    def worker(self) -> Worker:
        """The student's main worker: its correctness runs and its timing."""
        return self.workers.main

    @property
    def on_gpu(self) -> bool:
        return self.worker.device.backend == "gpu"

    def checker_builder(self) -> Builder:
        """Builds for the CPU analysis of GPU stages (autograder.pipeline.analyse)."""
        if self._checker_builder is None:
            self._checker_builder = Builder(self.workers.checker().device, self.worker.sandbox, {"analysis": True})
        return self._checker_builder

    @contextmanager
    def gate(self, exclusive: bool) -> Iterator[None]:
        """This student's GPU, shared or alone (autograder.schedule.gpu_gate), the wait counted: the time in which
        any of the student's threads waited (the compute-sanitizer tools ask at once), so no phase's own time,
        its time less the wait, comes out below zero."""
        self._waiting(+1)
        held = False
        try:
            with gpu_gate(self.gpu, exclusive):
                held = True
                self._waiting(-1)
                yield
        finally:
            if not held:  # the gate failed before it was held
                self._waiting(-1)

    def _waiting(self, change: int) -> None:
        with self._wait_lock:
            now = time.perf_counter()
            if self._waiters:
                self.waited += now - self._since
            self._waiters += change
            self._since = now

    @contextmanager
    def shared_phase(self, phase: str, items: Sequence[StageWork]) -> Iterator[None]:
        """Time a phase that several stages go through together, each charged an equal part of it."""
        together = Phases(lambda: self.waited)
        try:
            with together(phase):
                yield
        finally:
            for item in items:
                for name, seconds in together.seconds:
                    item.phases.add(name, seconds / len(items))

    def grader_failed(self, where: str, error: BaseException) -> str:
        """Record a failure of the grader itself (a bug, or its machine) while grading this student, with its
        traceback for the staff; returns the one line a student's message shows."""
        self.grader_errors.append(f"{where}: {''.join(traceback.format_exception(error)).rstrip()}")
        return f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}".rstrip(": ")

    def unmeasured_reason(self) -> str | None:
        """Why speed is not measured, and so not counted, in this run; None when it is."""
        if not self.on_gpu:
            return "not measured on the CPU backend: speed is graded on a GPU"
        if not self.options.measure_speed:
            return "speed not measured (--no-speed)"
        if not self.references:
            return "not measured here: the reference kernels it is timed against are not installed"
        return None

    def calibration(self) -> calibrations.Calibration:
        """This GPU's calibration; measured now (and kept in the user's cache) when none matches."""
        if self._calibration is None:
            gpu = self.worker.device.name
            settings = self.rubric.timing
            found = calibrations.load_calibration(gpu, settings, self.options.calibration_dirs)
            if found is None:
                # Only the reference kernels run in a calibration: a worker of the grader's own, which compiles.
                options = dict(self.options.backend_options)
                with Worker(self.worker.backend_name, options, Sandbox(False)) as trusted, self.gate(exclusive=True):
                    found = trusted.call(calibrations.measure, settings, self.options.seed, timeout=1800)
                calibrations.write_calibration(found, calibrations.calibration_path(gpu, calibrations.USER_DIR))
            self._calibration = found
        return self._calibration
