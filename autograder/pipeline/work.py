"""What passes between the phases of a student's grading: a stage on its way (StageWork), the seconds each
phase took (Phases), and how findings from several checkers are joined."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from autograder.records import Build, Finding, KernelSource, StageResult, Status, merged
from autograder.stages import Stage

GPU_WAIT = "gpu wait"  # the phase of waiting for the GPU: for a timing to end, or for correctness runs to end


class Phases:
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


@dataclass
class StageWork:
    """A stage compiled and checked, on its way through the phases that take a student's stages together
    (compute-sanitizer, timing). Each phase replaces `result` with what it adds."""

    stage: Stage
    source: KernelSource
    build: Build
    result: StageResult
    phases: Phases
    memo_key: str | None  # where its result goes in the class memo; None without one
    baseline: str | None  # the source of the student's own baseline it was keyed with; None: the reference
    # CRASHED or TIMEOUT: how its correctness run ended, where a finding of undefined behaviour made the stage
    # incorrect (pipeline.verdict.undefined_end). Every later phase treats it as a kernel that crashed or hung.
    ended: Status | None = None
    # The student's main worker's processes its kernel ran in (Worker.restarts then): a crash or a hang ends the
    # process it happens in, and a process started after it ran only the student's other kernels.
    ran_in: set[int] = field(default_factory=set)

    @property
    def ran_as(self) -> Status:
        """The stage's status, or how its correctness run ended where that was a crash or a hang."""
        return self.ended or self.result.status


def collect(findings: dict[tuple, Finding], new: tuple[Finding, ...]) -> None:
    """Add findings, one per kind and line: the latest, or one that stands for a write (records.merged)."""
    for finding in new:
        findings[finding.kind, finding.line] = merged(findings.get((finding.kind, finding.line)), finding)


def distinct(findings: dict[tuple, Finding]) -> tuple[Finding, ...]:
    """The findings, less a warp race on a line that also has a block-wide race: two warps racing on a line
    usually means lanes of one warp race there too, and the missing __syncthreads is the one thing to fix."""
    barrier_lines = {line for kind, line in findings if kind == "race_syncthreads"}
    return tuple(f for (kind, line), f in findings.items() if not (kind == "race_syncwarp" and line in barrier_lines))


def joined(*groups: tuple[Finding, ...]) -> tuple[Finding, ...]:
    """Several checkers' findings as one: one per kind and line, less warp races a block-wide race explains."""
    findings: dict[tuple, Finding] = {}
    for group in groups:
        collect(findings, group)
    return distinct(findings)
