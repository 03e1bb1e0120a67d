"""How long sandboxed workers take to start when a class starts them all at once, as its grading processes do.

    .venv/bin/python bench/worker_starts.py [--counts 1,16,32] [--backends cpu,gpu]

For each count, that many workers of a backend start at once, each from a thread of its own, and the time to
the first, the median and the last ready one is printed. A CPU worker's start is the Python interpreter and the
grader's imports; a GPU worker's adds its CUDA context, which the driver makes one at a time. On a machine with
several GPUs the GPU workers start twice: seeing every GPU, and seeing only theirs (CUDA_VISIBLE_DEVICES).
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

from autograder.isolation import Worker
from autograder.sandbox import Sandbox


def started(count: int, backend: str) -> list[float]:
    """Seconds from the start of all to each worker's readiness, in order; a worker that cannot start ends the
    benchmark with its reason, so that no figure stands for fewer workers than it says."""
    options = {"device_index": 0} if backend == "gpu" else {}
    workers = [Worker(backend, options, Sandbox(True)) for _ in range(count)]
    began = time.perf_counter()
    ready: list[float] = []
    failures: list[BaseException] = []

    def start(worker: Worker) -> None:
        try:
            worker.start()
        except BaseException as error:  # noqa: BLE001 (reported below, in the main thread)
            failures.append(error)
            return
        ready.append(time.perf_counter() - began)

    threads = [threading.Thread(target=start, args=(worker,)) for worker in workers]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for worker in workers:
            worker.close()
    if failures:
        raise SystemExit(f"{len(failures)} of {count} {backend} workers did not start: {failures[0]}")
    return sorted(ready)


def gpu_count() -> int:
    return len([name for name in os.listdir("/dev") if name.removeprefix("nvidia").isdigit()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,16,32", help="workers started at once, comma-separated")
    parser.add_argument("--backends", default="cpu,gpu", help="cpu, gpu or both (gpu where a GPU is)")
    args = parser.parse_args()
    settings: list[tuple[str, str, str | None]] = []
    for backend in args.backends.split(","):
        if backend == "cpu":
            settings.append(("cpu", "cpu", None))
        elif gpu_count():
            settings.append(("gpu, every GPU it sees", "gpu", None))
            if gpu_count() > 1:
                settings.append(("gpu, CUDA_VISIBLE_DEVICES=0", "gpu", "0"))
    if not settings:
        parser.error("no GPU here: start CPU workers (--backends cpu)")
    started(1, settings[0][1])  # the first start builds what every later one finds ready (the CPU runtime)
    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    for count in (int(number) for number in args.counts.split(",")):
        for label, backend, visible in settings:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            if (visible or seen) is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = visible or seen  # the sandbox passes it on to the worker
            ready = started(count, backend)
            print(f"{label:<28} {count:>3} at once: first {ready[0]:5.2f} s, median {statistics.median(ready):5.2f} s, "
                  f"last {ready[-1]:5.2f} s", flush=True)


if __name__ == "__main__":
    main()
