"""The worker process: time limits, crashes, and output kept away from the grader's terminal."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest

from autograder import isolation
from autograder.errors import GraderError, KernelFault, KernelTimeout, StartTimeout
from autograder.isolation import BudgetSpent, Worker
from autograder.sandbox import Sandbox, processes_under


def backend_name(backend) -> str:
    return backend.name


def sleep_forever(backend) -> None:
    while True:
        time.sleep(1)


def segfault(backend) -> None:
    print("about to crash", flush=True)
    os.kill(os.getpid(), signal.SIGSEGV)


def threads_and_environment(backend) -> tuple[int, tuple[str, ...]]:
    """The worker's threads, and what it was told about the math libraries' thread pools."""
    names = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    return len(os.listdir("/proc/self/task")), tuple(os.environ.get(name, "unset") for name in names)


def sleep_then(backend, seconds: float) -> float:
    """Wait `seconds` without running: as a worker held up by the machine does."""
    time.sleep(seconds)
    return seconds


def burn_then_sleep(backend, burn: float, sleep: float) -> float:
    """Keep a core busy `burn` seconds, then wait `sleep` seconds without running."""
    end = time.process_time() + burn
    while time.process_time() < end:
        pass
    time.sleep(sleep)
    return burn + sleep


def dies_after_its_reply(backend) -> None:
    """Reply, then end a moment later (as a worker killed from outside, or by the machine's memory running out)."""
    threading.Timer(0.2, os._exit, (1,)).start()


def burn(backend, seconds: float) -> float:
    """Keep a core busy for `seconds` of the worker's CPU time."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return seconds


def chatter(backend) -> str:
    print("to stdout", flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    os.write(2, b"straight to fd 2\n")
    return "done"


TESTS = Path(__file__).parent


@pytest.fixture
def worker():
    # The functions it runs are this module's: the sandboxed worker may read the tests folder.
    with Worker("cpu", readable=(TESTS,)) as worker:
        yield worker


def test_a_call_runs_in_the_child_with_the_backend(worker: Worker) -> None:
    assert worker.call(backend_name, timeout=30) == "cpu"
    assert worker.device.backend == "cpu"


def test_a_worker_started_ahead_from_a_thread_outlives_the_thread(worker: Worker) -> None:
    # The sandbox ends a process when the thread that started it ends (--die-with-parent): a worker started
    # ahead from a pool's thread must still be there for the calls that follow, with no second start.
    ahead = threading.Thread(target=worker.start)
    ahead.start()
    ahead.join()
    time.sleep(0.5)  # a parent-death signal, had one been sent, has arrived
    assert worker.alive
    assert worker.call(backend_name, timeout=30) == "cpu" and worker.restarts == 0


def start_and_call() -> None:
    with Worker("cpu", readable=(TESTS,)) as worker:
        assert worker.call(backend_name, timeout=30) == "cpu"


def test_a_process_forked_from_the_grader_starts_workers_too(worker: Worker) -> None:
    worker.start()  # the grader's starting thread exists: a forked child has no such thread, and needs its own
    child = multiprocessing.get_context("fork").Process(target=start_and_call)
    child.start()
    child.join(timeout=120)
    assert child.exitcode == 0


def test_a_hang_is_stopped_and_the_next_call_gets_a_fresh_worker(worker: Worker) -> None:
    started = time.monotonic()
    with pytest.raises(KernelTimeout, match="1 s limit"):
        worker.call(sleep_forever, timeout=1)
    assert time.monotonic() - started < 10
    assert worker.call(backend_name, timeout=30) == "cpu"
    assert worker.restarts == 1


def worker_processes() -> dict[int, float]:
    """The interpreters of this process's workers (not their sandboxes' processes, nor any other grader's): each
    one's pid and CPU seconds so far."""
    found = {}
    for pid in processes_under(os.getpid()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if b"autograder.isolation" in argv and b"bwrap" not in argv[0]:
            found[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return found


@contextmanager
def machine_stalls(after_cpu_seconds: float) -> Iterator[list[int]]:
    """The machine stalling under a worker: the first worker that runs `after_cpu_seconds` more from here on (a
    worker started later: from its start) is stopped (SIGSTOP: it makes no progress, as a process waiting in the
    kernel does) and left so. Idle workers of earlier tests run nothing, and are left alone. Yields the pids
    stopped."""
    seen = worker_processes()
    stopped: list[int] = []
    over = threading.Event()

    def watch() -> None:
        while not over.is_set() and not stopped:
            for pid, cpu in worker_processes().items():
                if cpu - seen.setdefault(pid, 0.0) >= max(after_cpu_seconds, 0.01):
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
                    break
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield stopped
    finally:
        over.set()
        watcher.join()


def test_calls_held_up_by_a_stalled_machine_are_tried_again_in_a_fresh_worker(worker: Worker) -> None:
    # A stall of the machine (the driver's lock while many CUDA contexts start, the kernel cleaning up the
    # sandboxes' namespaces) holds a call up as long as a hang: it once gave two correct stages 'timeout' in a
    # class. Confirmed, a call past its limit runs again in a fresh worker with twice the time, and so do the
    # calls after it; the replies are all there, in order. Here the worker stalls in the middle of the second.
    worker.call(burn, 0.0, timeout=30)  # started, this module imported there
    with machine_stalls(after_cpu_seconds=0.6) as stopped:
        replies = list(worker.call_each(burn, [(0.3,), (1.0,), (0.1,)], [2, 2, 2], confirm=True))
    assert stopped and replies == [0.3, 1.0, 0.1]
    assert worker.restarts == 1


def test_a_call_that_waits_past_its_limit_twice_is_a_hang_and_says_both_limits(worker: Worker) -> None:
    # A worker that neither runs nor waits for a core may be held up by the machine: tried again, once.
    worker.call(burn, 0.0, timeout=30)
    started = time.monotonic()
    with pytest.raises(KernelTimeout, match=r"1 s limit.*second try, in a fresh worker with 2 s, ran past its time"):
        list(worker.call_each(sleep_then, [(0.0,), (60.0,), (0.0,)], [1, 1, 1], confirm=True))
    assert time.monotonic() - started < 20
    assert worker.restarts == 1 and not worker.alive  # the second try's process was stopped too


def test_a_cpu_worker_kept_busy_past_its_limit_is_a_hang_at_once(worker: Worker) -> None:
    # On the CPU backend the kernel runs on the worker's own cores: busy past its limit (a spin that never ends)
    # is the kernel's, not the machine's, and a second try would only make a hang cost three times its limit.
    worker.call(burn, 0.0, timeout=30)
    started = time.monotonic()
    with pytest.raises(KernelTimeout, match="1 s limit") as caught:
        list(worker.call_each(burn, [(0.1,), (60.0,), (0.1,)], [1, 1, 1], confirm=True))
    assert "second try" not in str(caught.value) and time.monotonic() - started < 5
    assert worker.restarts == 0 and not worker.alive
    # Busy for most of the time since the calls were sent, over several calls: still the kernel's.
    with pytest.raises(KernelTimeout, match="2 s limit") as caught:
        list(worker.call_each(burn, [(0.9,), (0.9,), (60.0,)], [2, 2, 2], confirm=True))
    assert "second try" not in str(caught.value) and worker.restarts == 1


def test_calls_sent_with_a_hold_each_run_inside_one_of_their_own_and_its_waits_count_toward_no_limit(
    worker: Worker,
) -> None:
    # The GPU's gate, shared by correctness runs: each case alone inside a hold, so that a timing waits for one
    # case, not a stage's. A wait for the gate (another student's timing) is no kernel's time: four waits of
    # 0.5 s do not spend a budget of 1 s that the calls themselves keep within.
    worker.call(burn, 0.0, timeout=30)
    events: list[str] = []

    @contextmanager
    def hold() -> Iterator[None]:
        time.sleep(0.5)
        events.append("held")
        yield
        events.append("let go")

    replies = []
    for reply in worker.call_each(burn, [(0.05,)] * 4, [30] * 4, budget=1.0, confirm=True, hold=hold):
        replies.append(reply)
        events.append("reply")
    assert replies == [0.05] * 4 and events == ["held", "reply", "let go"] * 4 and worker.restarts == 0


def test_a_call_held_up_after_busy_calls_is_tried_again(worker: Worker) -> None:
    # Busy is judged over the call that ran out of time alone: four calls that kept a core busy, then one that
    # waited past its limit without running (held up), which gets its second try.
    worker.call(burn, 0.0, timeout=30)
    calls = [(0.9, 0.0)] * 4 + [(0.0, 3.0)]
    replies = list(worker.call_each(burn_then_sleep, calls, [2] * 5, confirm=True))
    assert replies == [0.9] * 4 + [3.0] and worker.restarts == 1


def test_a_worker_that_dies_between_calls_sent_apart_is_a_fault(worker: Worker) -> None:
    # Each call sent in a message of its own (a hold): a worker that died after its last reply is found when the
    # next call is sent, a fault of the kernel that ran there (crashed), not the grader's broken pipe.
    worker.call(burn, 0.0, timeout=30)
    replies = worker.call_each(dies_after_its_reply, [(), ()], [30, 30], confirm=True, hold=nullcontext)
    assert next(replies) is None
    time.sleep(1.0)
    with pytest.raises(KernelFault, match="the worker died during dies_after_its_reply"):
        next(replies)


def test_the_time_calls_may_take_together_is_not_tried_again(worker: Worker) -> None:
    # The budget bounds what a kernel slowed on purpose just inside each case's limit costs a grading process: a
    # second try would double it. It holds across a confirmed call's second try too.
    worker.call(burn, 0.0, timeout=30)
    started = time.monotonic()
    with pytest.raises(BudgetSpent, match="the 10 runs ran past the 1.5 s they may take together"):
        list(worker.call_each(burn, [(0.4,)] * 10, [5] * 10, budget=1.5, confirm=True))
    assert time.monotonic() - started < 5 and worker.restarts == 0
    # Stalled in its first call, tried again in a fresh worker: the second try has what is left of the 3 s (its
    # start aside), not 3 s afresh, and runs out of it.
    worker.call(burn, 0.0, timeout=30)  # started again: the stall comes in the calls, not in a start
    with machine_stalls(after_cpu_seconds=0.3) as stopped, pytest.raises(BudgetSpent, match="the 2 runs ran past"):
        list(worker.call_each(burn, [(1.6,), (0.01,)], [2, 2], budget=3, confirm=True))
    assert stopped and worker.restarts == 2 and time.monotonic() - started < 20  # the budget's stop, then the stall's


def test_a_worker_that_does_not_start_in_time_is_the_machines_trouble_not_a_kernels_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No student code runs while a worker starts: a start past its limit is the grader's failure (the stage is
    # graded again by a later run), where a KernelTimeout would be the student's 'timeout'.
    monkeypatch.setattr(isolation, "STARTUP_SECONDS", 1.0)
    with Worker("cpu", readable=(TESTS,)) as worker, machine_stalls(after_cpu_seconds=0.05) as stopped:
        with pytest.raises(StartTimeout, match="starting the backend ran past its 1 s limit") as caught:
            list(worker.call_each(burn, [(0.1,)], [30], confirm=True))
        assert stopped and not isinstance(caught.value, KernelTimeout) and not worker.alive
        monkeypatch.undo()
        assert worker.call(burn, 0.1, timeout=30) == 0.1  # the machine well again, the next use starts it


def test_a_stall_of_the_machine_during_a_students_cases_changes_no_verdict(tmp_path: Path) -> None:
    # A stage whose every case keeps a core busy a while (thread 0 of block 0 counts), so the stall lands in
    # the middle of its cases, each limited to 3 s: graded alone, and graded while the machine stalls under its
    # worker for good, it gets the same statuses and messages.
    # Imported here: a worker imports this module for the functions it runs, and a fresh one must start fast.
    import nbformat

    from autograder.grade import GradeOptions, grade_notebook
    from autograder.notebook import kernel_cell
    from autograder.records import Status
    from autograder.references import reference_source

    spin = "if (threadIdx.x == 0 && blockIdx.x == 0) { for (volatile unsigned long long k = 0; k < 20000000ull; " \
           "k = k + 1) {} }\n    "
    slow = reference_source("naive").text.replace("sdata[tid] = (i < n)", spin + "sdata[tid] = (i < n)", 1)
    cells = [kernel_cell("naive", slow), kernel_cell("anti_divergence", reference_source("anti_divergence").text)]
    notebook = tmp_path / "stalled.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), notebook)
    options = GradeOptions(backend="cpu", seed=3, quick=True, measure_speed=False, case_seconds=3.0)

    def graded() -> list[tuple[str, object, str]]:
        return [(s.stage, s.status, s.message) for s in grade_notebook(notebook, "stalled", options).stages]

    alone = graded()
    with machine_stalls(after_cpu_seconds=1.0) as stopped:
        stalled = graded()
    assert stopped, "the stall never came: the stage's cases took less CPU than expected"
    assert alone[0][1] is Status.CORRECT and stalled == alone


def test_a_crash_is_a_fault_that_names_the_signal_and_keeps_the_output(worker: Worker) -> None:
    with pytest.raises(KernelFault, match="SIGSEGV") as caught:
        worker.call(segfault, timeout=30)
    assert "about to crash" in str(caught.value)
    assert worker.call(backend_name, timeout=30) == "cpu"


def test_a_backend_that_fails_to_start_says_why_at_every_use_and_leaves_no_process() -> None:
    # A worker whose backend failed to start was left running without a device: its next use took it for started
    # and failed on an assertion, with no word of why (a whole class of stages graded as grader errors).
    with Worker("cpu", {"schedule": "no such order"}, readable=(TESTS,)) as worker:
        for _ in range(2):
            with pytest.raises(GraderError, match="failed to start.*no such order"):
                worker.start()
            assert not worker._alive()


def test_the_child_writes_nothing_to_the_grader_terminal(worker: Worker, capfd: pytest.CaptureFixture) -> None:
    assert worker.call(chatter, timeout=30) == "done"
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_a_worker_of_a_kind_already_started_says_its_device_without_starting(worker: Worker) -> None:
    started = worker.device  # a fresh worker's own word
    with Worker("cpu", readable=(TESTS,)) as again:
        assert again.device == started
        assert not again._alive()  # no process: a student whose stages all come from the memo starts none
        assert again.call(backend_name, timeout=30) == "cpu"  # it starts when it has work
        assert again._alive() and again.device == started


def test_workers_leave_no_descriptor_open_in_the_grader() -> None:
    # A grading process makes workers for every student: a descriptor left open for each (its output file, say)
    # runs a class of hundreds into the process's limit, and pushes the worker's channel to high numbers.
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        Worker("cpu").close()
    with Worker("cpu", readable=(Path(__file__).parent,)) as worker:
        assert worker.call(backend_name, timeout=60) == "cpu"
    assert len(os.listdir("/proc/self/fd")) <= before


@pytest.mark.parametrize("sandboxed", [True, False])
def test_a_worker_starts_no_thread_pool_of_a_math_library(sandboxed: bool) -> None:
    # numpy's BLAS starts a thread a core at import, each spinning a while: 2.3 core-seconds a worker on a
    # 16-core GPU machine, and a class starts a worker a student. The sandbox's empty environment had lost the
    # setting that stops it (on this machine's cores: one thread more without it, wherever there are two).
    with Worker("cpu", sandbox=Sandbox(sandboxed), readable=(TESTS,)) as worker:
        count, settings = worker.call(threads_and_environment, timeout=60)
    assert settings == ("1", "1", "1")
    assert count == 1  # its own thread only: the CPU backend runs kernels on it
