"""Benchmark of the reference stages on the GPU: median time, GB/s and step speedup, side by side in one run.

Not a test: it prints figures. Each stage is timed interleaved with its previous stage, L2 flushed before every
call, exactly as the grader times a hand-in. Where cupy and torch are installed it adds CUB (`cupy.sum`) and
`torch.sum` on the same input size, timed the same way, and each stage's bandwidth as a share of CUB's.

    python bench/stages.py [--n 67108864] [--block-size 256]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import numpy as np

from autograder.calibration import cub_bandwidth
from autograder.isolation import Worker
from autograder.references import reference_source
from autograder.stages import STAGES
from autograder.timing import TimedKernel, TimingSettings, time_interleaved


def stage_figures(backend, settings: TimingSettings) -> list[tuple[str, float, float, float | None]]:
    """(stage, median us, GB/s, step speedup) for every reference stage. Runs in the worker."""
    rows = []
    for stage in STAGES:
        kernels = [TimedKernel(stage.id, stage.id, reference_source(stage.id))]
        if stage.previous:
            kernels.append(TimedKernel(stage.previous, stage.previous, reference_source(stage.previous)))
        timings = time_interleaved(backend, tuple(kernels), settings, seed=1)
        step = timings[1].median_ms / timings[0].median_ms if len(timings) > 1 else None
        rows.append((stage.id, timings[0].median_ms * 1e3, timings[0].gbps, step))
    return rows


def library_figures(backend, n: int) -> dict[str, float]:
    """GB/s of CUB (cupy.sum) and torch.sum on n floats, where installed. Runs in the worker."""
    figures = {}
    cub = cub_bandwidth(backend, n)
    if cub:
        figures["CUB (cupy.sum)"] = cub
    try:
        import torch
    except ImportError:
        return figures
    data = torch.rand(n, device="cuda", dtype=torch.float32)
    times = []
    for _ in range(33):
        backend.flush_l2()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.sum(data)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    figures["torch.sum"] = 4 * n / (float(np.median(times[3:])) * 1e-3) / 1e9
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1 << 26)
    parser.add_argument("--block-size", type=int, default=256)
    args = parser.parse_args()
    settings = replace(TimingSettings(), n=args.n, block_size=args.block_size)
    with Worker("gpu") as worker:
        print(f"{worker.device.name}, n = {args.n}, block size {args.block_size}, max2d {settings.max2d_shape}")
        rows = worker.call(stage_figures, settings, timeout=1800)
        libraries = worker.call(library_figures, args.n, timeout=600)
    cub = libraries.get("CUB (cupy.sum)")
    print(f"{'stage':16} {'median':>10} {'GB/s':>8} {'step':>6} {'of CUB':>7}")
    for stage_id, micros, gbps, step in rows:
        share = f"{gbps / cub:6.0%}" if cub and stage_id != "max2d" else "     -"
        print(f"{stage_id:16} {micros:8.0f}us {gbps:8.0f} {step or float('nan'):6.2f} {share:>7}")
    for name, gbps in libraries.items():
        print(f"{name:16} {'':>10} {gbps:8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
