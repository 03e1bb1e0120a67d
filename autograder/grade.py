"""Grading one notebook, or a few stages' sources: read, compile, verify, time, score.

Every kernel runs in a Worker process (autograder.isolation) with time limits; this module only decides.
The same functions serve `autograder grade`, `autograder check`, the notebook self-check and nbgrader's test
cells, so all of them give the same verdicts and points.
"""

from __future__ import annotations

import secrets
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from autograder.errors import GraderError, NotebookError
from autograder.executors import StudentWorkers
from autograder.isolation import Worker
from autograder.memo import grader_version
from autograder.notebook import stage_cells
from autograder.pipeline.run import StudentRun
from autograder.pipeline.student import grade_student
from autograder.records import DeviceInfo, KernelSource, StageResult, Status, StudentResult
from autograder.rubric import Rubric, load_rubric, score
from autograder.sandbox import Sandbox
from autograder.sessions import Address
from autograder.stages import STAGE_IDS

NOT_STARTED = "not started"  # the device of a result whose notebook could not be read: no worker ran


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
    # All of a stage's correctness cases together: a kernel slowed on purpose just inside each case's limit would
    # otherwise hold a grading process for 40 of them (20 minutes a stage). A reference stage takes a second or
    # two on the CPU backend and a fraction of one on a GPU.
    stage_seconds: float = 240.0
    calibration_dirs: tuple[Path, ...] = ()
    # On the GPU, also run each kernel on the CPU backend over a few small inputs: a GPU run cannot show a
    # race that happened to give the right sum, and the rubric prices races the same on both backends.
    race_checks: bool = True
    backend_options: Mapping[str, object] = field(default_factory=dict)
    sandbox: bool = True  # compile and run student code in the sandbox (autograder.sandbox); False: --no-sandbox
    memo_dir: Path | None = None  # where a class keeps its stage results, so identical kernels are graded once

    def with_seed(self) -> GradeOptions:
        return self if self.seed is not None else replace(self, seed=secrets.randbits(63))


def settings_label(options: GradeOptions) -> str:
    """What `options` change of a full grading that decides verdicts ("" for none): --resume keeps a result only
    from a run with the same settings, so a `--quick` run's grades never stand for a full run's."""
    changed = [name for name, on in (("quick", options.quick), ("no speed", not options.measure_speed),
                                     ("no race checks", not options.race_checks)) if on]
    limits = (options.case_seconds, options.per_element_seconds, options.stage_seconds)
    if limits != (GradeOptions.case_seconds, GradeOptions.per_element_seconds, GradeOptions.stage_seconds):
        changed.append(f"case limits {limits[0]:g} s + {limits[1]:g} s an element, {limits[2]:g} s a stage")
    if options.calibration_dirs:
        changed.append(f"calibrations from {', '.join(path.name for path in options.calibration_dirs)}")
    return ", ".join(changed)


Progress = Callable[[str], None]


def grade_notebook(
    path: Path,
    student: str,
    options: GradeOptions,
    worker: Worker | None = None,
    progress: Progress | None = None,
    share: bool = False,
    sessions: Address | None = None,
) -> StudentResult:
    """Grade every stage of the notebook at `path`. `share`: the student's GPU workers may serve the next
    student this process grades (a class run; autograder.executors says when that is safe). `sessions`: where
    the class's shared compute-sanitizer sessions are (autograder.sessions), if anywhere."""
    options = options.with_seed()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        cells = stage_cells(path)
    except NotebookError as error:
        message = f"{student}: {error}"  # the file's name alone may be every student's (reduction.ipynb)
        stages = tuple(_unreadable(stage_id, Status.INVALID_CELL, message, options.rubric) for stage_id in STAGE_IDS)
        device = worker.device if worker else DeviceInfo(backend=options.backend, name=NOT_STARTED)
        return _student(student, path, options, started, device, stages, problems=(str(error),))
    except Exception as error:  # a bug in reading notebooks must not lose the student: every stage says so
        message = f"not graded: the grader failed to read the notebook ({type(error).__name__}); the staff are told"
        stages = tuple(_unreadable(stage_id, Status.GRADER_ERROR, message, options.rubric) for stage_id in STAGE_IDS)
        device = DeviceInfo(backend=options.backend, name=NOT_STARTED)
        failure = "".join(traceback.format_exception(error)).rstrip()
        return _student(student, path, options, started, device, stages, problems=(), grader_errors=(failure,))
    sources = {stage_id: cell.source for stage_id, cell in cells.items()}
    problems = {stage_id: cell.problem for stage_id, cell in cells.items() if cell.problem and cell.attempted}
    with _student_run(options, worker, share, sessions) as run:
        results: dict[str, StageResult] = {}
        run.workers.clean = grade_student(run, STAGE_IDS, sources, problems, results, progress)
        stages = tuple(results[stage_id] for stage_id in STAGE_IDS)
        device = run.worker.device
    notebook_problems = tuple(f"{stage_id}: {problem}" for stage_id, problem in problems.items())
    return _student(
        student, path, options, started, device, stages, notebook_problems, grader_errors=tuple(run.grader_errors)
    )


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
    with _student_run(options, worker, share=False) as run:
        run.workers.clean = grade_student(run, wanted, sources, problems or {}, results, progress)
    return tuple(results[stage_id] for stage_id in wanted)


@contextmanager
def _student_run(
    options: GradeOptions, worker: Worker | None, share: bool, sessions: Address | None = None
) -> Iterator[StudentRun]:
    """The pipeline's shared state over the student's workers, which end with it (autograder.executors)."""
    sandbox = Sandbox(options.sandbox)
    workers = StudentWorkers(
        options.backend, worker_options(options), sandbox, share=share, main=worker, sessions=sessions
    )
    try:
        yield StudentRun.start(options, workers)
    finally:
        workers.close()


def new_worker(options: GradeOptions, backend: str | None = None) -> Worker:
    """A fresh worker for one student, isolated as the options say."""
    return Worker(backend or options.backend, worker_options(options), sandbox=Sandbox(options.sandbox))


def worker_options(options: GradeOptions) -> dict[str, object]:
    """The backend options of a student's workers: the run's, and its secret seed, from which the CPU backend
    draws the blocks of each launch whose technique it measures, so that a kernel cannot know them."""
    seeded = {"seed": options.seed} if options.seed is not None else {}
    return {**options.backend_options, **seeded}


def no_notebook(student: str, options: GradeOptions, why: str) -> StudentResult:
    """A student whose folder holds no notebook the grader could choose: every stage says `why`."""
    options = options.with_seed()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    stages = tuple(_unreadable(stage_id, Status.INVALID_CELL, f"{student}: {why}", options.rubric)
                   for stage_id in STAGE_IDS)
    return _student(student, Path(student), options, started, DeviceInfo(options.backend, NOT_STARTED), stages, ())


def _unreadable(stage_id: str, status: Status, problem: str, rubric: Rubric) -> StageResult:
    result = StageResult(stage_id, status, problem)
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
    grader_errors: tuple[str, ...] = (),
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
        settings=settings_label(options),
        grader_version=grader_version(),
        grader_errors=grader_errors,
    )


__all__ = ["GradeOptions", "GraderError", "grade_notebook", "grade_stages"]
