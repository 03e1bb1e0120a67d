"""The worker process: time limits, crashes, and output kept away from the grader's terminal."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from autograder.errors import GraderError, KernelFault, KernelTimeout
from autograder.isolation import Worker
from autograder.sandbox import Sandbox


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
