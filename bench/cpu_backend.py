"""Time the CPU backend on each reference stage: one whole reduction, with all checks and without.

    .venv/bin/python bench/cpu_backend.py [--size 1048576] [--kernels solutions/reduction/kernels]

It also times what grading one submission costs on the CPU backend: compiling all seven stages and running
every correctness size of the catalogue (SUM_SIZES, MAX2D_SHAPES) with checks on. Targets: a 2^20-element
stage with all checks under 1 s on one core; all seven stages under 30 s.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np

from autograder.backends.cpu import CpuBackend
from autograder.launch import Plan
from autograder.records import KernelSource
from autograder.stages import MAX2D_SHAPES, REQUIRED_STAGE_IDS, SUM_SIZES, Shape, get_stage

ROOT = Path(__file__).resolve().parent.parent


def reduce_once(backend: CpuBackend, kernel, size: tuple[int, ...]) -> float:
    """Seconds for one whole checked reduction of `size` (input written, every pass, guards checked)."""
    plan = Plan.create(backend, kernel, size, 256)
    plan.load(np.ones(math.prod(size), np.float32))
    start = time.perf_counter()
    plan.run(check_each_pass=True)
    plan.result()
    elapsed = time.perf_counter() - start
    plan.release()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1 << 20)
    parser.add_argument("--kernels", type=Path, default=ROOT / "solutions" / "reduction" / "kernels")
    options = parser.parse_args()

    with tempfile.TemporaryDirectory() as cache:
        checked = CpuBackend(checks=True, cache_dir=cache)
        unchecked = CpuBackend(checks=False, cache_dir=cache)
        print(f"{checked.device().name}; {options.size} elements, block size 256, one core")
        print(f"{'stage':<18}{'compile s':>10}{'checks on s':>13}{'checks off s':>14}{'grading s':>11}")
        total = 0.0
        for stage_id in REQUIRED_STAGE_IDS:
            stage = get_stage(stage_id)
            source = KernelSource((options.kernels / f"{stage_id}.cu").read_text())
            start = time.perf_counter()
            kernel = checked.compile(source, stage)
            compile_s = time.perf_counter() - start
            plain = unchecked.compile(source, stage)
            if stage.shape is Shape.SUM_1D:
                size: tuple[int, ...] = (options.size,)
            else:
                side = int(math.sqrt(options.size))
                size = (side, options.size // side)
            on = reduce_once(checked, kernel, size)
            off = reduce_once(unchecked, plain, size)
            # What grading costs: every correctness case with checks, after the compile.
            cases = [(n,) for n in SUM_SIZES] if stage.shape is Shape.SUM_1D else list(MAX2D_SHAPES)
            grading = compile_s + sum(reduce_once(checked, kernel, case) for case in cases)
            checked.findings()
            total += grading
            print(f"{stage_id:<18}{compile_s:>10.2f}{on:>13.3f}{off:>14.3f}{grading:>11.2f}")
        print(f"all seven stages graded (compile + every correctness size, checks on): {total:.1f} s")


if __name__ == "__main__":
    main()
