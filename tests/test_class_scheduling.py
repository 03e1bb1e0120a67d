"""Grading a class in parallel, on Dask, resumed after a kill: the same grades as one student after another."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import dask
import pytest

from autograder import batch, schedule
from autograder.batch import ClassOptions, grade_class
from autograder.build import Builder, reference_build
from autograder.executors import StudentWorkers
from autograder.grade import GradeOptions, grade_notebook
from autograder.isolation import Worker
from autograder.pipeline.run import StudentRun
from autograder.records import PerfVerdict, Status, StudentResult, to_dict
from autograder.references import reference_source
from autograder.sandbox import TOOL_NICENESS, Sandbox
from autograder.schedule import Placement, gpu_gate, place, run
from autograder.stages import get_stage
from autograder.verify import UNDEFINED_KINDS

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "submissions"
STUDENTS = ("alice", "bob", "carol", "grace")  # every kind of verdict of the example class, in less time
OPTIONS = GradeOptions(backend="cpu", seed=20261123, quick=True, measure_speed=False)


def grades(results: tuple[StudentResult, ...]) -> dict:
    """What must not depend on how a class was scheduled: statuses, points, findings and cases, per student
    (as JSON text, in which a NaN a kernel left equals another NaN)."""
    fields = ("stage", "status", "points", "findings", "cases", "technique")
    return {r.student: json.dumps([[to_dict(getattr(s, f)) for f in fields] for s in r.stages]) for r in results}


def verdicts(results: tuple[StudentResult, ...]) -> dict:
    """What must not depend on how a class was scheduled on a GPU: each stage's status, correctness points and
    findings, and its cases' verdicts, where its result is defined: a racing kernel sums differently from run
    to run on a GPU (which is why it is incorrect whatever it sums), and a speed verdict can flip between runs
    where a stage is exactly as fast as it must be."""
    return {
        r.student: [
            (s.stage, s.status, s.points.correctness, sorted((f.kind, f.line) for f in s.findings),
             [] if any(f.kind in UNDEFINED_KINDS for f in s.findings) else [(c.label, c.passed) for c in s.cases])
            for s in r.stages
        ]
        for r in results
    }


@pytest.fixture(scope="module")
def klass(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("class")
    for student in STUDENTS:
        shutil.copy(EXAMPLES / f"{student}.ipynb", folder)
    return folder


@pytest.fixture(scope="module")
def serial(klass: Path, tmp_path_factory: pytest.TempPathFactory):
    return grade_class(klass, tmp_path_factory.mktemp("serial"), OPTIONS)


def test_a_local_dask_cluster_gives_the_serial_grades(klass: Path, serial, tmp_path: Path) -> None:
    parallel = grade_class(klass, tmp_path, OPTIONS, spread=ClassOptions(workers=2))
    assert [r.student for r in parallel.results] == list(STUDENTS)
    assert grades(parallel.results) == grades(serial.results)
    assert (tmp_path / "grades.csv").read_text() == (serial.out / "grades.csv").read_text()


def dies_once(marks: Path, index: int) -> int:
    """A task whose first run kills its worker process, as a machine out of memory would."""
    mark = marks / str(index)
    if not mark.exists():
        mark.touch()
        os._exit(1)
    return index


def always_dies(_: Path, index: int) -> int:
    os._exit(1)


def test_a_lost_worker_is_replaced_its_task_run_again_and_the_run_stays_quiet(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    done: list[int] = []
    lost: list[tuple] = []
    replaced = run(dies_once, [(tmp_path, 0), (tmp_path, 1)], workers=2, on_result=done.append,
                   on_lost=lambda task, why: lost.append(task))
    assert sorted(done) == [0, 1] and lost == [] and replaced >= 1
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):  # give up after its second worker dies
        given_up = run(always_dies, [(tmp_path, 2)], workers=2, on_result=done.append,
                       on_lost=lambda task, why: lost.append((task, why)))
    assert lost and lost[0][0] == (tmp_path, 2) and "KilledWorker" in lost[0][1] and given_up >= 1
    output = capfd.readouterr()
    assert "Traceback" not in output.out + output.err


class Killed(Exception):
    pass


def test_a_killed_run_resumed_gives_the_uninterrupted_grades_and_keeps_what_it_had(
    klass: Path, serial, tmp_path: Path
) -> None:
    def kill_after_two(student: str, done: int, total: int) -> None:
        if done == 2:
            raise Killed

    with pytest.raises(Killed):
        grade_class(klass, tmp_path, OPTIONS, on_student=kill_after_two)
    kept = {path.name: path.stat().st_mtime_ns for path in tmp_path.glob("*.json")}
    assert len(kept) == 2
    # The class table, written at most once a second while a class runs, holds them too once the run has stopped.
    table = (tmp_path / "grades.csv").read_text().splitlines()
    assert sorted(line.split(",")[0] for line in table[1:]) == sorted(Path(name).stem for name in kept)
    regraded: list[str] = []
    # No --seed: the resumed run takes the seed of the results it keeps.
    resumed = grade_class(
        klass, tmp_path, replace(OPTIONS, seed=None), on_student=lambda s, d, t: regraded.append(s),
        spread=ClassOptions(resume=True),
    )
    assert grades(resumed.results) == grades(serial.results)
    assert {path.name: path.stat().st_mtime_ns for path in tmp_path.glob("*.json") if path.name in kept} == kept
    assert sorted(regraded[2:]) == sorted(set(STUDENTS) - {Path(name).stem for name in kept})


def test_resume_regrades_a_changed_notebook_and_a_changed_rubric(klass: Path, serial, tmp_path: Path) -> None:
    folder = tmp_path / "class"
    shutil.copytree(klass, folder)
    out = tmp_path / "out"
    shutil.copytree(serial.out, out)
    shutil.copy(EXAMPLES / "alice.ipynb", folder / "bob.ipynb")  # bob hands in again: alice's notebook
    again = grade_class(folder, out, OPTIONS, spread=ClassOptions(resume=True))
    by_student = {r.student: r for r in again.results}
    assert by_student["bob"].total == by_student["alice"].total
    assert by_student["carol"].started == next(r for r in serial.results if r.student == "carol").started
    fixed = replace(OPTIONS, rubric=replace(OPTIONS.rubric, sha256="f1" * 32))  # the rubric file changed
    regraded = grade_class(folder, out, fixed, spread=ClassOptions(resume=True))
    assert {r.rubric for r in regraded.results} == {fixed.rubric.label} != {OPTIONS.rubric.label}


def test_resume_keeps_only_results_of_a_run_with_the_same_settings(tmp_path: Path) -> None:
    # A --quick or --no-speed run's grades never stand for a full run's: the case that only a full run has may
    # be the one a kernel fails.
    folder = tmp_path / "class"
    folder.mkdir()
    shutil.copy(EXAMPLES / "grace.ipynb", folder)
    quick = grade_class(folder, tmp_path / "out", OPTIONS)
    assert quick.results[0].settings == "quick, no speed"
    fuller = replace(OPTIONS, measure_speed=True)
    again = grade_class(folder, tmp_path / "out", fuller, spread=ClassOptions(resume=True))
    assert again.results[0].settings == "quick"  # graded again, by this run
    kept = grade_class(folder, tmp_path / "out", fuller, spread=ClassOptions(resume=True))
    assert kept.results == again.results  # the same settings: kept as it was, its start time too


def test_a_notebook_handed_in_again_while_it_is_graded_is_graded_again_on_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its result cannot tell which file it graded: it says so, and holds no hash for --resume to keep it by.
    folder = tmp_path / "class"
    folder.mkdir()
    shutil.copy(EXAMPLES / "grace.ipynb", folder / "bob.ipynb")
    grade = batch.grade_notebook

    def handed_in_again(path: Path, *args, **kwargs):
        result = grade(path, *args, **kwargs)
        shutil.copy(EXAMPLES / "bob.ipynb", path)
        return result

    monkeypatch.setattr(batch, "grade_notebook", handed_in_again)
    first = grade_class(folder, tmp_path / "out", OPTIONS).results[0]
    assert first.notebook_sha256 == "" and "changed while it was graded" in first.problems[-1]
    monkeypatch.undo()
    resumed = grade_class(folder, tmp_path / "out", OPTIONS, spread=ClassOptions(resume=True)).results[0]
    alone = grade_class(folder, tmp_path / "alone", OPTIONS).results[0]
    assert grades((resumed,)) == grades((alone,)) != grades((first,))
    assert resumed.notebook_sha256 == hashlib.sha256((folder / "bob.ipynb").read_bytes()).hexdigest()


def test_one_kernel_in_two_string_forms_gets_each_students_own_lines_from_the_class_memo(tmp_path: Path) -> None:
    # The same kernel text, starting on the same cell line: as an r-string (a line a line) and as one line of \n
    # escapes (every line on cell line 1). The second student's findings and warnings, from the class memo and
    # the build cache, must name its own cell's lines.
    kernel = (EXAMPLES.parent.parent / "tests" / "cpu_kernels" / "bug_missing_bounds.cu").read_text()
    kernel = kernel.split("\n", 1)[1].replace("{\n", "{\n#warning a warning on line 3\n", 1)
    forms = {"raw": f'SEQUENTIAL_SOURCE = r"""{kernel}"""\n', "escaped": f"SEQUENTIAL_SOURCE = {json.dumps(kernel)}\n"}
    folder = tmp_path / "class"
    folder.mkdir()
    for student, cell_source in forms.items():
        notebook = json.loads((EXAMPLES / "grace.ipynb").read_text())
        (cell,) = (c for c in notebook["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "sequential")
        cell["source"] = cell_source
        (folder / f"{student}.ipynb").write_text(json.dumps(notebook))
    results = {r.student: r for r in grade_class(folder, tmp_path / "out", OPTIONS).results}
    stages = {student: next(s for s in r.stages if s.stage == "sequential") for student, r in results.items()}
    load = kernel.split("\n").index("    sdata[tid] = g_in[i];") + 1
    assert {f.kind: f.line for f in stages["raw"].findings} == {"out_of_bounds": load}
    assert {f.kind: f.line for f in stages["escaped"].findings} == {"out_of_bounds": 1}
    assert [m.line for m in stages["raw"].compiler] == [3] and [m.line for m in stages["escaped"].compiler] == [1]


def test_students_are_spread_round_robin_over_the_gpus() -> None:
    assert [p.chosen() for p in place(5, (0, 1))] == [0, 1, 0, 1, 0]
    assert [p.chosen() for p in place(2, ())] == [None, None]


def gpu_of_this_process(placement: Placement) -> tuple[int, int | None]:
    time.sleep(0.2)  # long enough that both processes take students
    return os.getpid(), placement.chosen()


def test_on_a_local_cluster_each_grading_process_keeps_to_one_gpu() -> None:
    # So the GPU workers a process keeps serve all its students, with no CUDA contexts on every GPU.
    placements = place(12, (0, 1), by_process=True)
    assert placements[0].chosen() == 0  # outside a cluster, one process: the first GPU
    seen: list[tuple[int, int | None]] = []
    run(gpu_of_this_process, [(p,) for p in placements], workers=2, on_result=seen.append, on_lost=print)
    gpus_by_process: dict[int, set[int | None]] = {}
    for pid, gpu in seen:
        gpus_by_process.setdefault(pid, set()).add(gpu)
    assert len(seen) == 12 and len(gpus_by_process) == 2
    assert sorted(gpu for gpus in gpus_by_process.values() for gpu in gpus) == [0, 1]


def held(gpu: int, plan: list[tuple[str, bool, float, float]]) -> dict[tuple[str, str], float]:
    """Hold GPU `gpu`'s gate from a thread for each (name, exclusive, seconds held, seconds after the first
    thread it starts): when each one's hold started and ended."""
    events: dict[tuple[str, str], float] = {}
    lock = threading.Lock()

    def hold(name: str, exclusive: bool, seconds: float) -> None:
        with gpu_gate(gpu, exclusive):
            with lock:
                events[name, "start"] = time.monotonic()
            time.sleep(seconds)
            with lock:
                events[name, "end"] = time.monotonic()

    threads = []
    started = time.monotonic()
    for name, exclusive, seconds, after in plan:
        time.sleep(max(0.0, started + after - time.monotonic()))
        threads.append(threading.Thread(target=hold, args=(name, exclusive, seconds)))
        threads[-1].start()
    for thread in threads:
        thread.join()
    return events


def test_compilers_and_tools_yield_the_cores_to_the_workers_that_hold_the_gpu(tmp_path: Path) -> None:
    # On a machine full of compiles, a worker running a student's cases (holding the GPU, which the other
    # grading processes wait for) gets a core first. README, "Large classes".
    own = os.nice(0)
    tool = Sandbox().run_tool(["nice"], tmp_path, timeout=30)
    assert int(tool.stdout) == min(own + TOOL_NICENESS, 19), tool.stderr
    log = tmp_path / "worker.log"
    ours, theirs = socket.socketpair()
    with ours, theirs:
        worker = Sandbox().start_worker(["nice"], log=log, channel=theirs, gpu=False)
        assert worker.wait(timeout=30) == 0
    assert int(log.read_text()) == own


def test_a_process_builds_each_reference_once_and_its_later_students_wait_for_no_core(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every student's timing compares with the reference kernels: a process builds each once, and a later
    student takes it even while every core of the machine is compiling, when a student's own compile waits for
    a core (its Builder used to find the references in the cache only after waiting for one)."""
    monkeypatch.setattr(schedule, "LOCK_DIR", tmp_path)
    monkeypatch.setattr(schedule, "CPU_SLOTS", 2)
    with Worker("cpu") as worker, ThreadPoolExecutor(2) as pool:
        first = reference_build(worker.device, worker.sandbox, "naive")
        stage, source = get_stage("naive"), reference_source("naive")
        own = replace(source, text=f"{source.text}// {secrets.token_hex(8)}: a source no cache holds\n")
        with schedule.cpu_slot(), schedule.cpu_slot():  # every core taken
            compiling = pool.submit(Builder(worker.device, worker.sandbox).build, stage, own)
            later = pool.submit(reference_build, worker.device, worker.sandbox, "naive")
            assert later.result(timeout=20) is first
            time.sleep(1.0)
            assert not compiling.done()
        assert compiling.result(timeout=60).source == own


def test_a_timing_has_its_gpu_alone_and_is_not_starved_by_correctness_runs() -> None:
    checks = [(f"check{i}", False, 0.3, 0.0) for i in range(3)]
    at = held(7, [*checks, ("timing", True, 0.3, 0.05), ("late-check", False, 0.1, 0.1)])
    assert at[("timing", "start")] >= max(at[(f"check{i}", "end")] for i in range(3))  # it waited for them
    assert at[("late-check", "start")] >= at[("timing", "end")]  # and nothing started while it timed
    checks_overlap = at[("check1", "start")] < at[("check0", "end")]
    assert checks_overlap  # correctness runs share the GPU


def test_timings_that_wait_together_go_one_after_another_before_any_new_correctness_run() -> None:
    # Each comes while the ones before it still wait or run.
    at = held(8, [("check0", False, 0.4, 0.0), ("timing0", True, 0.2, 0.05), ("check1", False, 0.1, 0.1),
                  ("timing1", True, 0.2, 0.15)])
    assert at[("timing0", "start")] >= at[("check0", "end")]
    assert at[("timing1", "start")] >= at[("timing0", "end")]  # the timings never overlap
    assert at[("check1", "start")] >= at[("timing1", "end")]  # the later timing went first: one drain for both


@pytest.mark.gpu
def test_on_a_gpu_parallel_students_are_timed_on_their_gpu_with_the_serial_statuses(
    klass: Path, tmp_path: Path
) -> None:
    options = replace(OPTIONS, backend="gpu", measure_speed=True)
    # One by one in this process, the GPU workers kept from student to student (autograder.executors); on a
    # local Dask cluster, each worker process keeping its own; and each student alone, in fresh workers.
    serial = grade_class(klass, tmp_path / "serial", options, spread=ClassOptions(gpus=(0,)))
    parallel = grade_class(klass, tmp_path / "parallel", options, spread=ClassOptions(workers=3, gpus=(0,)))
    alone = tuple(grade_notebook(klass / f"{student}.ipynb", student, options) for student in STUDENTS)
    assert {r.gpu for r in parallel.results} == {0}
    assert verdicts(parallel.results) == verdicts(serial.results) == verdicts(alone)
    assert all(
        s.performance.verdict is not PerfVerdict.NOT_MEASURED
        for r in parallel.results for s in r.stages if s.status is Status.CORRECT
    )


def test_a_students_threads_waiting_at_once_count_the_wait_once() -> None:
    # The compute-sanitizer tools of a student ask for the GPU at once. Counted twice, the student's wait would
    # be longer than its phase, whose own time (the phase less the wait) would come out below zero.
    run = StudentRun(GradeOptions(), workers=None, builder=None, memo=None, gpu=9, references=False)  # type: ignore[arg-type]
    timing = threading.Thread(target=held, args=(9, [("timing", True, 0.4, 0.0)]))
    timing.start()
    time.sleep(0.1)  # the timing holds the GPU alone

    def ask() -> None:
        with run.gate(exclusive=False):
            pass

    started = time.perf_counter()
    askers = [threading.Thread(target=ask) for _ in range(3)]
    for asker in askers:
        asker.start()
    for thread in (*askers, timing):
        thread.join()
    assert 0.2 < run.waited <= time.perf_counter() - started



def test_a_worker_started_ahead_is_closed_with_its_student_even_while_it_starts() -> None:
    # A process's first student starts its CPU analysis's worker in a thread. A student that needs no worker
    # (every stage from the memo, or none handed in) may end while it starts: it must not be left running.
    workers = StudentWorkers("cpu", {}, Sandbox(False))
    workers.start_checker_ahead()
    workers.close()
    time.sleep(2.0)  # any start still going has ended by now (a CPU worker starts in a fraction of a second)
    assert not workers.checker().alive
