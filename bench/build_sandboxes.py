"""Time the CPU analysis's builds of the seven reference stages, compiled afresh, and count their sandboxes.

    .venv/bin/python bench/build_sandboxes.py [--rounds 5]

Each round salts the seven reference kernels (so no cached build serves them) and builds each the way a GPU run's
CPU analysis does (the instrumented build only). Prints the median wall time of a round and the sandboxed runs a
round starts: every sandbox takes the kernel's locks over namespaces while it starts, which a class of hundreds
of students waits on. Compare two versions by running each checkout's copy in turn, several times.
"""

from __future__ import annotations

import argparse
import statistics
import time

from autograder.backends.cpu.compiler import compile_kernel, prepare_toolchain
from autograder.records import KernelSource
from autograder.references import reference_source
from autograder.sandbox import Sandbox
from autograder.stages import REQUIRED_STAGE_IDS, get_stage


class CountingSandbox(Sandbox):
    """The sandbox, counting the tools it runs."""

    runs = 0

    def run_tool(self, *args, **kwargs):
        CountingSandbox.runs += 1
        return super().run_tool(*args, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    toolchain, sandbox = prepare_toolchain(), CountingSandbox()
    seconds = []
    for round_ in range(rounds):
        started = time.monotonic()
        for stage_id in REQUIRED_STAGE_IDS:
            text = f"// round {round_}, {time.time_ns()}\n{reference_source(stage_id).text}"
            compile_kernel(toolchain, KernelSource(text), get_stage(stage_id), sandbox, fast=False)
        seconds.append(time.monotonic() - started)
    print(f"seven stages' analysis builds: {statistics.median(seconds):.2f} s a round (median of {rounds}), "
          f"{CountingSandbox.runs / rounds:.0f} sandboxed runs a round")


if __name__ == "__main__":
    main()
