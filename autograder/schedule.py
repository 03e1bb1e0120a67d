"""Where each student is graded. The scheduler decides where a student's grading runs, never what it does.

The unit of work is one student: `grade_submission` (autograder.batch), a plain function of plain data. It runs
- here, one student after another (`workers=1`, no cluster);
- on a local Dask cluster (`workers=N`): N worker processes on this machine, each grading one student at a
  time in that student's own sandboxed processes;
- on an existing Dask cluster (`scheduler="tcp://host:8786"`), such as one started by `dask-jobqueue` on Slurm.
  GPU workers there are declared with the Dask resource `GPU=1`, and each student's task asks for it.

On a machine with GPUs each student is placed on one GPU (round robin over `gpus`), and all its stages are
timed there. `gpu_gate` makes the timing fair: correctness runs share a GPU, a timing has it alone. The gate is
a pair of file locks, so it holds across the processes of a local cluster as well as across threads.
"""

from __future__ import annotations

import fcntl
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
    """Where one student runs: the GPU its stages are timed on (None on the CPU backend)."""

    gpu: int | None


def place(count: int, gpus: tuple[int, ...]) -> list[Placement]:
    """Round robin over the GPUs, so each gets every len(gpus)-th student."""
    if not gpus:
        return [Placement(None)] * count
    return [Placement(gpus[index % len(gpus)]) for index in range(count)]


@contextmanager
def gpu_gate(gpu: int | None, exclusive: bool) -> Iterator[None]:
    """Hold GPU `gpu` shared (correctness runs) or alone (timing). A timing that waits keeps new correctness
    runs out (the turnstile), so it is never starved; it starts once the runs already on the GPU are done."""
    if gpu is None:
        yield
        return
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOCK_DIR / f"gpu{gpu}.turnstile", "a") as turnstile, open(LOCK_DIR / f"gpu{gpu}.lock", "a") as gate:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if exclusive:
            fcntl.flock(gate, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(gate, fcntl.LOCK_UN)
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)
            fcntl.flock(turnstile, fcntl.LOCK_UN)
            try:
                yield
            finally:
                fcntl.flock(gate, fcntl.LOCK_UN)


def run(
    function: Callable[..., Result],
    tasks: Iterable[tuple[Any, ...]],
    *,
    workers: int = 1,
    scheduler: str | None = None,
    gpu_tasks: bool = False,
    on_result: Callable[[Result], None],
) -> None:
    """Call `function(*task)` for every task, here or on Dask, and hand each result to `on_result` (in this
    process, in the order they finish)."""
    tasks = list(tasks)
    if scheduler is None and workers <= 1:
        for task in tasks:
            on_result(function(*task))
        return
    from distributed import Client, LocalCluster, as_completed

    with _client(Client, LocalCluster, workers, scheduler) as client:
        # On a remote cluster a GPU student needs a GPU worker; locally the GPU gate shares the GPUs.
        resources = {"GPU": 1} if gpu_tasks and scheduler is not None else None
        futures = [client.submit(function, *task, resources=resources, pure=False) for task in tasks]
        for future in as_completed(futures):
            on_result(future.result())


@contextmanager
def _client(client_class: Any, cluster_class: Any, workers: int, scheduler: str | None) -> Iterator[Any]:
    if scheduler is not None:
        with client_class(scheduler) as client:
            yield client
        return
    # One thread a worker: a student's grading waits on its own processes, and a worker grades one at a time.
    with (
        cluster_class(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=40
        ) as cluster,
        client_class(cluster) as client,
    ):
        yield client

