"""Grading a class: find the hand-ins, grade each, and write every result as soon as it is known.

Layouts accepted under the submissions folder:
- nbgrader's: `<student>/<assignment>/<notebook>.ipynb`
- flat: `<student>.ipynb`
- one folder per student: `<student>/<notebook>.ipynb`

Each student's result is written to `<out>/<student>.json` with an atomic rename, so a crash or a Ctrl-C never
leaves a half-written file and never loses the results already written. The class table `<out>/grades.csv`,
and `<out>/graded.txt`, the list of its students' result files that publishing reads, are rewritten (atomically)
after every student.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tempfile
import threading
import time
import traceback
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import pandas as pd

from autograder.backends.cpu.compiler import precompiled_preludes
from autograder.errors import GraderError
from autograder.executors import close_kept
from autograder.files import regular_file_sha256
from autograder.grade import GradeOptions, grade_notebook, no_notebook, settings_label
from autograder.isolation import Worker, cpu_toolchain
from autograder.memo import grader_version
from autograder.notebook import MAX_NOTEBOOK_BYTES
from autograder.records import StudentResult, from_dict, to_dict
from autograder.sandbox import Sandbox
from autograder.sanitizer import TOOLS, find_sanitizer, launcher_of
from autograder.schedule import Placement, place, run
from autograder.sessions import Address, SessionHost
from autograder.spreadsheets import csv_text
from autograder.stages import STAGE_IDS, Shape
from autograder.timing import publish_input

PREFERRED_NOTEBOOK = "reduction.ipynb"


@dataclass(frozen=True)
class Submission:
    student: str
    notebook: Path | None
    problem: str | None = None  # why no notebook could be chosen
    shown: str = ""  # where the hand-in is, relative to the submissions folder: what results record

    def stamp(self, result: StudentResult) -> StudentResult:
        """`result` naming its notebook by its place in the submissions folder, never by a host path, and
        carrying the problem of finding it first."""
        problems = (self.problem, *result.problems) if self.problem else result.problems
        return replace(result, notebook=self.shown or self.student, problems=problems)


Skipped = tuple[str, str]  # (entry relative to the submissions folder, why it was not graded)


@dataclass(frozen=True)
class Discovery:
    """The hand-ins found under a submissions folder, and the entries left out."""

    submissions: tuple[Submission, ...]
    skipped: tuple[Skipped, ...]


@dataclass(frozen=True)
class ClassRun:
    """What a class run produced: the results written, the students the grader itself failed on, and the
    entries of the submissions folder that were not graded."""

    results: tuple[StudentResult, ...]
    failures: tuple[tuple[str, str], ...]  # (student, what went wrong in the grader)
    out: Path
    skipped: tuple[Skipped, ...] = ()
    lost_workers: int = 0  # worker processes of a cluster lost on the way (their students were graded again)


LINK_REFUSED = "a symbolic link: refused without being read; hand in the file itself"
NOT_REGULAR = "not a regular file (a FIFO or a device): refused without being read"
MAX_DEPTH = 6  # folders below a student's folder searched for the notebook (nbgrader's layout needs 1)
# Never a hand-in, at any depth: Jupyter's autosaves, and the AppleDouble copies a macOS zip adds (`._hw1.ipynb`).
TOOL_DEBRIS = (".ipynb_checkpoints", "__MACOSX")


def find_submissions(folder: Path, assignment: str | None = None, out: Path | None = None) -> list[Submission]:
    """Every student's hand-in under `folder`, sorted by student."""
    return list(discover(folder, assignment, out).submissions)


def check_assignment(assignment: str) -> str:
    """`assignment` if it names one folder (`reduction`), which is looked for inside every student's folder; else
    GraderError: a path (`a/b`, `/abs`, `..`) could take one student's notebook from another's folder."""
    if assignment in ("", ".", "..") or "/" in assignment or os.sep in assignment or "\0" in assignment:
        raise GraderError(f"{assignment!r}: give the assignment as a folder name (reduction), the folder inside "
                          "each student's folder that holds the hand-in, not a path")
    return assignment


def discover(folder: Path, assignment: str | None = None, out: Path | None = None) -> Discovery:
    """Every student's hand-in under `folder`, sorted by student, and every entry left out with the reason.

    Nothing is followed or read through a symbolic link: a link anywhere in the tree (a linked notebook, a
    linked student folder, a link inside one) is refused and listed, so a hand-in cannot reach outside it.
    `out`: the folder the results go to, never a student's even where it lies in `folder`.
    """
    if not folder.is_dir():
        raise GraderError(f"{folder}: no such folder of submissions")
    if assignment is not None:
        check_assignment(assignment)
    results = out.resolve() if out is not None else None
    found: list[Submission] = []
    skipped: list[Skipped] = []
    for entry in _listing(folder, folder, skipped):
        path = Path(entry.path)
        if path.resolve() == results:
            skipped.append((entry.name, "the folder the results are written to (--out)"))
        elif entry.name.startswith("."):
            skipped.append((entry.name, "a hidden entry (its name starts with a dot)"))
        elif entry.is_symlink():
            skipped.append((entry.name, LINK_REFUSED))
        elif entry.is_dir(follow_symlinks=False):
            found.append(_student_folder(path, folder, assignment, skipped))
        elif entry.is_file(follow_symlinks=False) and path.suffix == ".ipynb":
            found.append(Submission(path.stem, path, shown=entry.name))
        else:
            skipped.append((entry.name, "neither a notebook (.ipynb) nor a student's folder"))
    return Discovery(_one_per_student(found, skipped), tuple(skipped))


def _one_per_student(found: list[Submission], skipped: list[Skipped]) -> tuple[Submission, ...]:
    """One hand-in per student where there are two (`ada.ipynb` beside a folder `ada/`): the first by name that
    has a notebook to grade, so a folder holding none (a PDF, only autosaves) never hides the student's
    notebook; the other is listed as skipped."""
    by_stem: dict[str, list[Submission]] = {}
    for submission in found:
        by_stem.setdefault(file_stem(submission.student), []).append(submission)
    unique = []
    for hand_ins in by_stem.values():
        kept = next((hand_in for hand_in in hand_ins if hand_in.notebook is not None), hand_ins[0])
        unique.append(kept)
        for other in hand_ins:
            if other is kept:
                continue
            if other.notebook is None and kept.notebook is not None:
                skipped.append((other.shown, f"{other.problem}; {kept.shown}, of the same student name, is graded"))
            else:
                skipped.append((other.shown, f"another hand-in, {kept.shown}, has the same student name"))
    return tuple(unique)


def _listing(folder: Path, top: Path, skipped: list[Skipped]) -> list[os.DirEntry[str]]:
    """The entries of `folder` by name. A folder that cannot be listed, and an entry whose name is not printable
    text (invalid UTF-8, control characters), are listed as skipped."""
    try:
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=lambda entry: entry.name)
    except OSError as error:
        skipped.append((_relative(folder, top), f"cannot be listed ({error.strerror})"))
        return []
    printable = []
    for entry in entries:
        if _UNPRINTABLE.search(entry.name):
            skipped.append((_relative(Path(entry.path), top), "its name is not printable text (invalid UTF-8 or "
                                                             "control characters); rename it"))
        else:
            printable.append(entry)
    return printable


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


def _relative(path: Path, top: Path) -> str:
    """`path` relative to the submissions folder, as printable text."""
    relative = path.relative_to(top).as_posix().encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return _UNPRINTABLE.sub("?", relative)


def _student_folder(folder: Path, top: Path, assignment: str | None, skipped: list[Skipped]) -> Submission:
    student, shown = folder.name, f"{folder.name}/"
    root = folder / assignment if assignment else folder
    if not _is_real_folder(root):  # the student handed in other assignments, not this one
        link = " (a symbolic link, refused)" if root.is_symlink() else ""
        return Submission(student, None, f"no notebook for this assignment: no folder {shown}{assignment}/{link}",
                          shown)
    before = len(skipped)
    notebooks = sorted(_notebooks(root, top, skipped))
    if not notebooks:
        refused = [path for path, _ in skipped[before:]]
        why = f" ({', '.join(refused)} refused: see the class summary)" if refused else ""
        return Submission(student, None, f"no notebook in {_relative(root, top)}/{why}", shown)
    preferred = [p for p in notebooks if p.name == PREFERRED_NOTEBOOK]
    if len(notebooks) == 1 or len(preferred) == 1:
        notebook = notebooks[0] if len(notebooks) == 1 else preferred[0]
        return Submission(student, notebook, shown=_relative(notebook, top))
    names = ", ".join(_relative(p, folder) for p in notebooks)
    return Submission(student, None, f"several notebooks ({names}); {_choice(notebooks, root, assignment)}", shown)


def _choice(notebooks: list[Path], root: Path, assignment: str | None) -> str:
    """How a TA can make one of a student's several notebooks the hand-in."""
    advice = f"keep only the notebook to grade, or name it {PREFERRED_NOTEBOOK}"
    places = [path.relative_to(root).parts for path in notebooks]
    folders = sorted({parts[0] for parts in places if len(parts) > 1})
    if assignment is None and folders and len({parts[0] for parts in places}) > 1:  # it picks a folder, not a file
        return f"pass --assignment with the folder to grade ({', '.join(folders)}), or {advice}"
    return advice


def _is_real_folder(path: Path) -> bool:
    """True for a folder that is not a symbolic link (none is ever followed)."""
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def _notebooks(folder: Path, top: Path, skipped: list[Skipped], depth: int = 0) -> list[Path]:
    """The notebooks under `folder`, never through a symbolic link: links, notebooks that are hidden or not
    regular files, and folders too deep or unreadable, are listed as skipped; hidden folders and TOOL_DEBRIS are
    left alone."""
    found: list[Path] = []
    for entry in _listing(folder, top, skipped):
        path = Path(entry.path)
        if entry.name in TOOL_DEBRIS or (entry.name.startswith(".") and path.suffix != ".ipynb"):
            continue
        if entry.name.startswith("."):
            skipped.append((_relative(path, top), "a hidden entry (its name starts with a dot)"))
        elif entry.is_symlink():
            skipped.append((_relative(path, top), LINK_REFUSED))
        elif entry.is_dir(follow_symlinks=False):
            if depth < MAX_DEPTH:
                found += _notebooks(path, top, skipped, depth + 1)
            else:
                skipped.append((_relative(path, top), f"more than {MAX_DEPTH} folders deep"))
        elif path.suffix == ".ipynb":
            if entry.is_file(follow_symlinks=False):
                found.append(path)
            else:
                skipped.append((_relative(path, top), NOT_REGULAR))
    return found


@dataclass(frozen=True)
class ClassOptions:
    """How a class is spread out (autograder.schedule). The defaults grade one student after another here."""

    workers: int = 1  # students graded at once on this machine (more than one: a local Dask cluster)
    scheduler: str | None = None  # the address of an existing Dask cluster
    gpus: tuple[int, ...] = ()  # the GPUs students are placed on (autograder.schedule.place); () for the default
    resume: bool = False  # keep the results of students whose notebook, rubric and grader are unchanged
    # Keep a grading process's GPU workers from one student to the next where that is safe (autograder.executors);
    # False gives every student fresh ones, at a CUDA context or four a student.
    share_workers: bool = True


def grade_class(
    folder: Path,
    out: Path,
    options: GradeOptions,
    assignment: str | None = None,
    on_student: Callable[[str, int, int], None] | None = None,
    spread: ClassOptions = ClassOptions(),
) -> ClassRun:
    """Grade every submission under `folder` with one seed for the run, writing results under `out`.

    `on_student(student, done, total)` is called as each student's result is written, in the order they
    finish. Results are written one by one as they come, so a run that is stopped keeps what it finished, and
    `--resume` (spread.resume) takes up where it stopped; the class table (grades.csv, graded.txt) is written again
    at most once a second as students finish, and in full when the run ends or is stopped.
    """
    out.mkdir(parents=True, exist_ok=True)
    discovery = discover(folder, assignment, out)
    previous = _previous_results(out) if spread.resume else {}
    if spread.resume and options.seed is None:
        seeds = {result.seed for result in previous.values()}
        options = replace(options, seed=seeds.pop()) if len(seeds) == 1 else options
    # One seed for the class, and a memo of stage results: identical kernels are graded once (autograder.memo).
    options = replace(options.with_seed(), memo_dir=options.memo_dir or out / ".stages")
    Sandbox(options.sandbox).require()  # refuse untrusted code up front where it cannot be isolated
    results: list[StudentResult] = []
    failures: list[tuple[str, str]] = []
    unwritten: list[str] = []  # students the grader failed on with no result at all
    tasks = []
    local_cluster = spread.workers > 1 and spread.scheduler is None
    for submission, placement in zip(
        discovery.submissions, place(len(discovery.submissions), spread.gpus, by_process=local_cluster), strict=True
    ):
        kept = previous.get(file_stem(submission.student))
        if kept is not None and _still_valid(kept, submission, options):
            if submission.stamp(kept) != kept:  # the same notebook, moved in the submissions folder
                kept = submission.stamp(kept)
                write_json(out / f"{file_stem(kept.student)}.json", to_dict(kept))
            results.append(kept)
        else:
            tasks.append((submission, options, placement, spread.share_workers))
    total = len(discovery.submissions)
    if on_student:
        for done, result in enumerate(results, 1):
            on_student(result.student, done, total)

    table_written = time.monotonic()

    def record(outcome: tuple[str, StudentResult | None, str | None]) -> None:
        nonlocal table_written
        student, result, failure = outcome
        if result is None:
            failures.append((student, failure or "no result"))
            unwritten.append(student)
        else:
            write_json(out / f"{file_stem(student)}.json", to_dict(result))
            results.append(result)
            if time.monotonic() - table_written >= TABLE_SECONDS:
                write_class_table(_by_student(results), out)
                table_written = time.monotonic()
            if result.grader_errors:  # graded, but the grader failed on part of it: the staff must know
                failures.append((student, "\n\n".join(result.grader_errors)))
        if on_student:
            on_student(student, len(results) + len(unwritten), total)

    write_class_table(_by_student(results), out)

    def lost(task: tuple, why: str) -> None:
        record((task[0].student, None, f"its grading was lost with the worker processes that ran it: {why}"))

    gpu_tasks = options.backend != "cpu"
    timed_here = gpu_tasks and bool(_class_gpus(options, spread)) and options.measure_speed and bool(tasks)
    # The CPU backend's runtime is every worker's but a GPU worker's with no race analysis, and the local cluster's.
    built_here = bool(tasks) and spread.scheduler is None and (options.backend != "gpu" or options.race_checks)
    with (
        _ahead(partial(_publish_timing_inputs, options) if timed_here else None,
               partial(_build_cpu_backend, options) if built_here else None),
        _shared_sessions(options, spread, local_cluster and gpu_tasks and bool(tasks)) as sessions,
    ):
        try:
            lost_workers = run(grade_submission, [(*task, sessions) for task in tasks], workers=spread.workers,
                               scheduler=spread.scheduler, gpu_tasks=gpu_tasks, on_result=record, on_lost=lost)
        finally:
            try:
                close_kept()  # the workers this process kept for its next student (a cluster's end with its processes)
            finally:
                write_class_table(_by_student(results), out)
    if failures:
        write_json(out / f"{FAILURES_STEM}.json", [{"student": s, "error": e} for s, e in failures])
    return ClassRun(_by_student(results), tuple(sorted(failures)), out, discovery.skipped, lost_workers)


# The class table is written again at most this often while a class runs, and once at its end: each write holds
# every student so far, so writing it for each student made a class's own bookkeeping grow with its square (500
# students: 5 s of the main process; 2,000: over a minute).
TABLE_SECONDS = 1.0


def _by_student(results: list[StudentResult]) -> tuple[StudentResult, ...]:
    """Results in one order whatever order they finished in, so a class table never depends on the schedule."""
    return tuple(sorted(results, key=lambda result: result.student))


def _class_gpus(options: GradeOptions, spread: ClassOptions) -> tuple[int, ...]:
    """The GPUs a class is graded on: without --gpus the first, where there is one (the `auto` backend's choice)."""
    return spread.gpus or ((0,) if options.backend == "gpu" or Path("/dev/nvidia0").exists() else ())


@contextmanager
def _ahead(*jobs: Callable[[], object] | None) -> Iterator[None]:
    """The jobs run now, each in a thread of its own, while the class's processes start and its first students
    compile: what every grading process would otherwise do, or wait for, at its first student, all at once."""
    threads = [threading.Thread(target=job, daemon=True) for job in jobs if job is not None]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        for thread in threads:
            thread.join()


def _publish_timing_inputs(options: GradeOptions) -> None:
    """Draw and publish the class's timing inputs: every grading process then reads them
    (autograder.timing.publish_input), none draws its own at its first timing, when the first students all time
    at once."""
    for shape in (Shape.SUM_1D, Shape.MAX_2D):
        publish_input(options.seed, options.rubric.timing.size_of(shape))


def _build_cpu_backend(options: GradeOptions) -> None:
    """Build the CPU backend's runtime and precompiled preludes (once a machine: a fresh one builds them here),
    which the CPU backend's workers and the CPU analysis's builds of every grading process use."""
    with suppress(Exception):  # no CPU backend here (no g++, a cache it cannot write): its workers say why
        precompiled_preludes(cpu_toolchain(options.backend_options))


@contextmanager
def _shared_sessions(options: GradeOptions, spread: ClassOptions, wanted: bool) -> Iterator[Address | None]:
    """The class's compute-sanitizer sessions, one a tool and GPU, that all the grading processes of a local
    cluster share (autograder.sessions); None where they would not be used: no GPU, no compute-sanitizer, no
    local cluster, or no worker kept from one student to the next."""
    tool = find_sanitizer()
    gpus = _class_gpus(options, spread)
    if not (wanted and gpus and spread.share_workers and tool is not None):
        yield None
        return
    sandbox, backend_options = Sandbox(options.sandbox), dict(options.backend_options)

    def make(name: str, gpu: int) -> Worker:
        return Worker("gpu", {**backend_options, "device_index": gpu}, sandbox, launcher=launcher_of(tool, name))

    try:
        host = SessionHost(make, TOOLS, gpus)
    except OSError:  # no socket here (a folder path too long for one, say): each process keeps its own sessions
        yield None
        return
    with host:
        yield host.address


def grade_submission(
    submission: Submission,
    options: GradeOptions,
    placement: Placement,
    share: bool = True,
    sessions: Address | None = None,
) -> tuple[str, StudentResult | None, str | None]:
    """Grade one student where the scheduler put it: (student, result, None), or (student, None, what went
    wrong in the grader). Its GPU workers may serve the next student this process grades, where nothing an
    earlier student's kernel did can reach it (autograder.executors); every other worker is fresh. `sessions`:
    the class's shared compute-sanitizer sessions, if it has them."""
    gpu = placement.chosen()
    if gpu is not None:
        options = replace(options, backend_options={**options.backend_options, "device_index": gpu})
    before = _sha256(submission.notebook)
    try:
        if submission.notebook is None:
            result = no_notebook(submission.student, options, submission.problem or "no notebook")
        else:
            result = grade_notebook(submission.notebook, submission.student, options, share=share, sessions=sessions)
    except Exception as error:  # a bug in the grader must not stop the class
        return submission.student, None, f"{error!r}\n{traceback.format_exc()}"
    if _sha256(submission.notebook) != before:  # handed in again while it was graded: which file was read?
        changed = "the notebook changed while it was graded: these grades may be of the earlier file"
        result = replace(result, problems=(*result.problems, changed))  # and no hash: --resume grades it again
        return submission.student, replace(submission.stamp(result), gpu=gpu), None
    return submission.student, replace(submission.stamp(result), gpu=gpu, notebook_sha256=before), None


def _sha256(path: Path | None) -> str:
    """The hand-in's hash, or "" where it cannot be read as a notebook (a link, too large: its verdict says why)."""
    try:
        return regular_file_sha256(path, MAX_NOTEBOOK_BYTES) if path else ""
    except OSError:
        return ""


def _previous_results(out: Path) -> dict[str, StudentResult]:
    """The results already in `out`, by file stem; a file that cannot be read is graded again."""
    found = {}
    for path in sorted(out.glob("*.json")):
        if path.stem == FAILURES_STEM:
            continue
        try:
            found[path.stem] = from_dict(StudentResult, json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def _still_valid(result: StudentResult, submission: Submission, options: GradeOptions) -> bool:
    """Whether a result of an earlier run stands for this run: the same notebook, rubric, grader, seed and
    isolation, and the backend asked for."""
    return (
        not result.grader_errors
        and result.notebook_sha256 != ""
        and result.notebook_sha256 == _sha256(submission.notebook)
        and result.rubric == options.rubric.label
        and result.grader_version == grader_version()
        and result.seed == options.seed
        and result.settings == settings_label(options)
        and result.isolation == Sandbox(options.sandbox).label
        and options.backend in ("auto", result.device.backend)
    )


MAX_STEM_CHARS = 64
_HASHED_STEM = re.compile(r".*-[0-9a-f]{8}")  # an id that looks hashed is hashed too, so stems never collide
FAILURES_STEM = "grader-failures"  # the grader's own file beside the results: no student's file is named so
GRADED_LIST = "graded.txt"  # the result files of the latest grading run into a folder, one a line


def file_stem(student: str) -> str:
    """A file name for a student's files: readable, and different for different students.

    Ids may hold spaces, slashes, an @ or non-Latin letters. Accents are dropped and anything else outside
    `A-Za-z0-9._-` becomes `_`; wherever that changed the id, a short hash of the id follows, so `a b` and `a_b`
    get different files and a name in another script does not collapse to a shared one.
    """
    ascii_only = unicodedata.normalize("NFKD", student).encode("ascii", "ignore").decode()
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", ascii_only).strip("._")[:MAX_STEM_CHARS] or "student"
    if safe == student and not _HASHED_STEM.fullmatch(safe) and safe.lower() != FAILURES_STEM:
        return safe
    digest = hashlib.sha256(student.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{safe}-{digest}"


def write_json(path: Path, data: object) -> None:
    _atomic_write(path, json.dumps(data, indent=2, allow_nan=True) + "\n")


def grade_table(results: list[StudentResult] | tuple[StudentResult, ...]) -> pd.DataFrame:
    """One row per student: total, maximum, and each stage's points and status."""
    rows = []
    for result in results:
        row: dict[str, object] = {"student": result.student, "total": result.total, "max": result.max_total}
        for stage in result.stages:
            row[f"{stage.stage}_points"] = stage.points.total if stage.points else 0.0
            row[f"{stage.stage}_status"] = stage.status.value
            row[f"{stage.stage}_speed"] = stage.performance.verdict.value
        row.update(seed=result.seed, device=result.device.name, backend=result.device.backend)
        rows.append(row)
    columns = ["student", "total", "max"]
    for stage_id in STAGE_IDS:
        columns += [f"{stage_id}_points", f"{stage_id}_status", f"{stage_id}_speed"]
    columns += ["seed", "device", "backend"]
    return pd.DataFrame(rows, columns=columns)


def write_class_table(results: list[StudentResult] | tuple[StudentResult, ...], out: Path) -> None:
    """`out/grades.csv`, and `out/GRADED_LIST`: the result files of these students, the ones that publishing
    reads (autograder.publish.results), so a result left in `out` by an earlier run (a student since removed or
    renamed) is published no more than it is in grades.csv."""
    _atomic_write(out / "grades.csv", csv_text(grade_table(results)))
    _atomic_write(out / GRADED_LIST, "".join(f"{file_stem(result.student)}.json\n" for result in results))


def _atomic_write(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
