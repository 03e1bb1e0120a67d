"""Several calls in one message to a worker (`Worker.call_each`): each answered and timed out on its own."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from autograder.errors import GraderError, KernelFault, KernelTimeout
from autograder.isolation import Worker

TESTS = Path(__file__).parent


def square(backend, value: int) -> int:
    return value * value


def slow_at(backend, value: int, stuck: int) -> int:
    if value == stuck:
        while True:
            time.sleep(1)
    return value


def crash_at(backend, value: int, crash: int) -> int:
    if value == crash:
        os.kill(os.getpid(), signal.SIGSEGV)
    return value


def fail_at(backend, value: int, failing: int) -> int:
    if value == failing:
        raise GraderError(f"no {value}")
    return value


@pytest.fixture
def worker():
    with Worker("cpu", readable=(TESTS,)) as worker:
        yield worker


def test_each_call_answers_in_order_and_the_worker_serves_the_next(worker: Worker) -> None:
    assert list(worker.call_each(square, [(value,) for value in range(5)], [30.0] * 5)) == [0, 1, 4, 9, 16]
    assert worker.call(square, 7, timeout=30) == 49 and worker.restarts == 0


def test_a_call_that_hangs_is_stopped_at_its_own_limit_after_the_ones_before_it(worker: Worker) -> None:
    # Three calls of 2 s of limit each: the third hangs. Its results before come, then it times out at its own
    # limit, counted from the result before it, not at the sum of the limits.
    got = []
    started = time.monotonic()
    with pytest.raises(KernelTimeout):
        for value in worker.call_each(slow_at, [(value, 2) for value in range(4)], [2.0] * 4):
            got.append(value)
    assert got == [0, 1] and time.monotonic() - started < 5.0
    assert not worker.alive
    assert worker.call(square, 3, timeout=30) == 9  # a fresh worker


@pytest.mark.parametrize(
    ("fn", "error", "match", "restarts"),
    [(crash_at, KernelFault, "SIGSEGV", 1), (fail_at, GraderError, "no 1", 0)],
    ids=["crash", "raise"],
)
def test_the_calls_end_at_the_first_that_crashes_or_raises(worker: Worker, fn, error, match, restarts) -> None:
    got = []
    with pytest.raises(error, match=match):
        for value in worker.call_each(fn, [(value, 1) for value in range(3)], [30.0] * 3):
            got.append(value)
    assert got == [0]
    # No reply of the calls after it is left to be read as a later call's; a crashed worker is started afresh.
    assert worker.call(square, 5, timeout=30) == 25 and worker.restarts == restarts


def test_a_caller_that_stops_taking_results_stops_the_worker(worker: Worker) -> None:
    results = worker.call_each(square, [(value,) for value in range(3)], [30.0] * 3)
    assert next(results) == 0
    results.close()  # two replies still on their way
    assert not worker.alive
    assert worker.call(square, 4, timeout=30) == 16 and worker.restarts == 1  # a fresh one
