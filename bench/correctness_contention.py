"""How correctness runs slow each other down on one GPU: k sandboxed GPU workers run every correctness case of
the seven reference stages at once, for several k.

    python3 bench/correctness_contention.py [--counts 1,8] [--rounds 3]

What a class's grading processes do between their other phases, without the rest of the grader: each worker
is its own process and CUDA context, as in a class. Prints, for each k, the median over the workers of the wall
time and of the worker's CPU time for one pass over the cases (272 cases, seven stages), and the value of every
case, summed, so that two versions of the grader can be compared on the same numbers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from pathlib import Path

from autograder.build import Builder
from autograder.isolation import Worker
from autograder.references import reference_source
from autograder.sandbox import Sandbox
from autograder.stages import REQUIRED_STAGE_IDS, get_stage
from autograder.verify import correctness_cases, run_case

SEED = 1


def cpu_seconds(pid: int) -> float:
    """The CPU time of a process and every process below it."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    total += (int(fields[11]) + int(fields[12])) / tick
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            total += cpu_seconds(int(child))
    return total


def measure(count: int, rounds: int, calls: list[tuple]) -> None:
    workers = [Worker("gpu", {}, Sandbox(True)) for _ in range(count)]
    try:
        for worker in workers:
            worker.start()
        walls: list[float] = [0.0] * count
        cpus: list[float] = [0.0] * count
        values: list[float] = [0.0] * count

        def work(index: int) -> None:
            worker = workers[index]
            list(worker.call_each(run_case, calls, [60.0] * len(calls)))  # kernels loaded, inputs drawn: not counted
            started, used = time.perf_counter(), cpu_seconds(worker._process.pid)
            for _ in range(rounds):
                values[index] = sum(value for value, _, _ in worker.call_each(run_case, calls, [60.0] * len(calls)))
            walls[index] = (time.perf_counter() - started) / rounds
            cpus[index] = (cpu_seconds(worker._process.pid) - used) / rounds

        threads = [threading.Thread(target=work, args=(index,)) for index in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        print(
            f"{count:>3} workers at once: a pass over the cases takes {statistics.median(walls):.3f} s "
            f"(median), {statistics.median(cpus):.3f} s of the worker's CPU; values summed {values[0]:.6g}",
            flush=True,
        )
    finally:
        for worker in workers:
            worker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,8", help="how many workers at once, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="passes over the cases per worker")
    args = parser.parse_args()
    with Worker("gpu", {}, Sandbox(True)) as first:
        builder = Builder(first.device, first.sandbox)
        print(f"{first.device.name}; {len(REQUIRED_STAGE_IDS)} reference stages, seed {SEED}")
    calls = []
    for stage_id in REQUIRED_STAGE_IDS:
        stage = get_stage(stage_id)
        build = builder.build(stage, reference_source(stage_id))
        calls += [(build, case, 256) for case in correctness_cases(stage, SEED)]
    for count in (int(text) for text in args.counts.split(",")):
        measure(count, args.rounds, calls)


if __name__ == "__main__":
    main()
