"""Where each student is graded. The scheduler decides where a student's grading runs, never what it does.

The unit of work is one student: `grade_submission` (autograder.batch), a plain function of plain data. It runs
- here, one student after another (`workers=1`, no cluster);
- on a local Dask cluster (`workers=N`): N worker processes on this machine, each grading one student at a
  time in sandboxed processes (its GPU ones kept for its next student where that is safe: autograder.executors);
- on an existing Dask cluster (`scheduler="tcp://host:8786"`), such as one started by `dask-jobqueue` on Slurm.
  GPU workers there are declared with the Dask resource `GPU=1`, and each student's task asks for it.

On a machine with GPUs each student is placed on one GPU, and all its stages are timed there: on a local
cluster the GPU of the grading process that takes it (each process keeps to one, round robin over `gpus`),
elsewhere round robin over the students. `gpu_gate` makes the timing fair: correctness runs share a GPU, a
timing has it alone. The gate is a pair of file locks per GPU, so it holds across the processes of a local
cluster as well as across threads. So is `cpu_slot`, a core of the machine for each compile, so that students
compiling ahead of time (autograder.build) never run more compilers at once than the machine has cores.
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

Result = TypeVar("Result")

LOCK_DIR = Path(tempfile.gettempdir()) / "autograder-gpu-locks"


@dataclass(frozen=True)
class Placement:
    """Where one student runs: the GPU its stages are timed on (None on the CPU backend); or, on a local cluster
    with several GPUs, the GPUs to choose from where it runs (`chosen`)."""

    gpu: int | None
    gpus: tuple[int, ...] = ()

    def chosen(self) -> int | None:
        """The student's GPU: its own, or the GPU of the grading process that took it."""
        return self.gpus[_process_number() % len(self.gpus)] if self.gpus else self.gpu


def place(count: int, gpus: tuple[int, ...], by_process: bool = False) -> list[Placement]:
    """Round robin over the GPUs, so each gets every len(gpus)-th student. With `by_process` (a local cluster),
    each grading process keeps to one GPU instead, and takes its students there: the GPU workers it keeps
    (autograder.executors) then serve all its students, where round robin made every process keep a set of
    workers, CUDA contexts, on every GPU, and start more as its students changed GPU."""
    if not gpus:
        return [Placement(None)] * count
    if by_process and len(gpus) > 1:
        return [Placement(None, gpus)] * count
    return [Placement(gpus[index % len(gpus)]) for index in range(count)]


def _process_number() -> int:
    """This grading process's number among a local Dask cluster's (its workers are named 0, 1, ...), else 0."""
    try:
        from distributed import get_worker

        name = get_worker().name
    except (ImportError, ValueError):
        return 0
    return name if isinstance(name, int) else 0


@contextmanager
def gpu_gate(gpu: int | None, exclusive: bool) -> Iterator[None]:
    """Hold GPU `gpu` shared (correctness runs) or alone (timing), timings first.

    Two file locks a GPU. A timing registers on the first (shared among timings), then takes the second alone:
    it starts once the correctness runs already on the GPU are done. A correctness run takes the first alone,
    and so waits while any timing is registered, then the second shared. So the timings that come while one
    waits for the GPU go one after another, with no correctness run between them: the GPU empties once for a
    group of timings, not once for each. No correctness run waits for ever: each grading process times its
    student once, then goes back to correctness runs."""
    if gpu is None:
        yield
        return
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOCK_DIR / f"gpu{gpu}.timings", "a") as timings, open(LOCK_DIR / f"gpu{gpu}.lock", "a") as gate:
        if exclusive:
            fcntl.flock(timings, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_EX)
        else:
            fcntl.flock(timings, fcntl.LOCK_EX)
            fcntl.flock(gate, fcntl.LOCK_SH)  # granted at once: no timing holds it, none is registered
            fcntl.flock(timings, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
            fcntl.flock(timings, fcntl.LOCK_UN)


@contextmanager
def _quiet(logger: logging.Logger) -> Iterator[None]:
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


CPU_SLOTS = os.cpu_count() or 1
_CALLS = itertools.count()  # spreads the calls of one process over the slots


@contextmanager
def cpu_slot() -> Iterator[None]:
    """Hold one of the machine's cores, for a compile: all the grading processes of a machine together run at
    most as many compilers as it has cores, however many students each has started building (a file lock per
    core, held by whoever has the core).

    A compile takes the first free slot it finds; where none is free it waits, without polling, for one slot
    to be let go. Processes, and the calls of each, start looking (and wait) at different slots, so waiting
    compiles are spread over the slots: with more of them than cores, whichever compile ends wakes one, and a
    slot let go that no one waits for goes to the next compile that looks. A lock belongs to the open file
    description that took it, which each call opens for itself: two threads of a process never share a slot.
    No call holds one slot while it waits for another, so no waiting can deadlock."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    first = (os.getpid() + next(_CALLS)) % CPU_SLOTS
    tries = (_take((first + index) % CPU_SLOTS, wait=False) for index in range(CPU_SLOTS))
    slot = next((slot for slot in tries if slot is not None), None)
    if slot is None:
        slot = _take(first, wait=True)
    try:
        yield
    finally:
        os.close(slot)  # which lets go of it


def _take(index: int, *, wait: bool) -> int | None:
    """The lock file of slot `index`, opened and locked; None (and closed) if another holds it and not `wait`."""
    slot = os.open(LOCK_DIR / f"cpu{index}.lock", os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(slot, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(slot)
        return None
    except BaseException:
        os.close(slot)
        raise
    return slot


def run(
    function: Callable[..., Result],
    tasks: Iterable[tuple[Any, ...]],
    *,
    workers: int = 1,
    scheduler: str | None = None,
    gpu_tasks: bool = False,
    on_result: Callable[[Result], None],
    on_lost: Callable[[tuple[Any, ...], str], None],
) -> int:
    """Call `function(*task)` for every task, here or on Dask, and hand each result to `on_result` (in this
    process, in the order they finish). A task whose worker process was lost is run again elsewhere by Dask; one
    that cannot be run at all (its workers kept dying) goes to `on_lost` with why. Returns how many worker
    processes were lost and replaced on the way, for a one-line report."""
    tasks = list(tasks)
    if scheduler is None and workers <= 1:
        for task in tasks:
            on_result(function(*task))
        return 0
    from distributed import Client, LocalCluster, as_completed

    with _client(Client, LocalCluster, workers, scheduler) as client:
        # On a remote cluster a GPU student needs a GPU worker; locally the GPU gate shares the GPUs.
        resources = {"GPU": 1} if gpu_tasks and scheduler is not None else None
        futures = {client.submit(function, *task, resources=resources, pure=False): task for task in tasks}
        seen = set(client.scheduler_info()["workers"])
        for future in as_completed(futures):
            seen |= set(client.scheduler_info()["workers"])
            try:
                result = future.result()
            except Exception as error:  # noqa: BLE001 (Dask's KilledWorker and the like: the task, not the class)
                on_lost(futures[future], f"{type(error).__name__}: {error}")
                continue
            on_result(result)
        return len(seen - set(client.scheduler_info()["workers"]))


@contextmanager
def _client(client_class: Any, cluster_class: Any, workers: int, scheduler: str | None) -> Iterator[Any]:
    if scheduler is not None:
        with client_class(scheduler) as client:
            yield client
        return
    # One thread a worker: a student's grading waits on its own processes, and a worker grades one at a time.
    # Dask's own complaints (a heartbeat late on a loaded machine, a connection closed at the end, with their
    # tracebacks), here and in its workers, stay out of the run's output: what matters of them, a task lost with
    # its worker, comes back through `run`. Dask's profiler, which samples every worker's stack a hundred times a
    # second for its dashboard, is off: the local cluster has no dashboard, and it cost a grading process a
    # tenth of its CPU (measured with py-spy; README "Large classes", the throughput table).
    import dask

    with (
        dask.config.set({"distributed.worker.profile.enabled": False}),
        _quiet(logging.getLogger("distributed")),
        cluster_class(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
            silence_logs=logging.CRITICAL,
        ) as cluster,
        client_class(cluster) as client,
    ):
        yield client

