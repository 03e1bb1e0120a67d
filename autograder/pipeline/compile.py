"""Phase 1: a stage's source becomes a Build (nvcc or g++, in the sandbox, after the source policy), or the
stage's compile error. A kernel with the wrong name or signature is a compile error too, found in the Build
before any worker loads it (autograder.build)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from autograder import sanitizer, technique
from autograder.errors import CompileError, KernelTimeout
from autograder.isolation import Worker
from autograder.pipeline.run import StudentRun
from autograder.pipeline.work import Phases
from autograder.records import Build, KernelSource, StageResult, Status
from autograder.sanitizer import TOOLS
from autograder.stages import Stage


def compile_stage(run: StudentRun, stage: Stage, source: KernelSource, phases: Phases) -> Build | StageResult:
    """The stage's Build, or its result when it does not compile."""
    try:
        with phases("compile"):
            return run.builder.build(stage, source)
    except CompileError as error:
        return compile_failure(stage, error)
    except KernelTimeout as error:
        return StageResult(stage.id, Status.CRASHED, f"the compiler failed: {error}")


@contextmanager
def building_ahead(run: StudentRun, stages: Sequence[tuple[Stage, KernelSource]]) -> Iterator[None]:
    """Start compiling these stages at once (nvcc or g++, and on the GPU the CPU analysis's g++), and the
    student's workers, while the first stages are checked: compiling is most of a student's CPU time, a worker
    on the GPU takes a second or more to start, and a student waiting for the GPU should leave no core idle.
    Each build waits for a free core of the machine (Builder), so sixteen students doing this at once still run
    one compiler a core; `compile_stage` takes each build, or its error, when ready, and a worker's first call
    waits for its start."""
    if not stages:
        yield  # nothing to compile: every stage comes from the class memo, and no worker need start
        return
    analysis = run.on_gpu and run.options.race_checks
    with ThreadPoolExecutor(max_workers=len(stages) * (2 if analysis else 1) + 5) as pool:
        for worker in _workers_ahead(run):
            pool.submit(worker.start)
        run.builder.start(stages, pool)
        for stage, source in stages:
            if technique.needs_ptx(stage):
                technique.start_ptx(source, run.worker.sandbox, pool)
        if analysis:  # after the GPU's: a process's first student waits here for its CPU worker
            run.checker_builder().start(stages, pool)
        yield


def _workers_ahead(run: StudentRun) -> list[Worker]:
    """The workers the student will surely use: its main one, on the GPU the CPU analysis's, and the
    compute-sanitizer sessions its quiet kernels share, where this process keeps them (a class's host starts
    its own: autograder.sessions)."""
    workers = [run.worker]
    if run.on_gpu:
        if run.options.race_checks:
            workers.append(run.workers.checker())
        tool = sanitizer.find_sanitizer()
        if tool is not None:
            sessions = [run.workers.session(name, sanitizer.launcher_of(tool, name), "shared") for name in TOOLS]
            workers += [session for session in sessions if isinstance(session, Worker)]  # else the class's host's
    return workers


def compile_failure(stage: Stage, error: CompileError) -> StageResult:
    """A compile error as the stage's result: its first error, on its line, with every message kept."""
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
