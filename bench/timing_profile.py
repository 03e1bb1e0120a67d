"""Where a stage's timing goes: host work per timed call against the GPU's own time, and one group per stage
against one group per shape (what grading does since the pipeline change), side by side in one run.

    python3 bench/timing_profile.py [--repeat 3] [--profile]

Runs the reference kernels on this machine's GPU in this process (trusted code only). For each way of
grouping it prints the wall time, the number of timed calls, the GPU time inside them (the sum of the samples)
and the host's time per call outside the GPU's; with --profile, the functions that took the host's time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

from autograder.backends.gpu import GpuBackend
from autograder.references import reference_source
from autograder.stages import Shape, get_stage
from autograder.timing import TimedKernel, TimingSettings, prepare_timing, time_interleaved

ONE_D = ("anti_divergence", "sequential", "first_add", "unrolled_warp", "shuffle", "open")


def per_stage(backend: GpuBackend, settings: TimingSettings, seed: int) -> list:
    """As grading timed before: each stage with its previous stage and its reference, a group each."""
    timings = []
    for stage_id in (*ONE_D, "max2d"):
        stage = get_stage(stage_id)
        kernels = (
            TimedKernel("yours", stage_id, reference_source(stage_id)),
            TimedKernel("baseline", stage.previous, reference_source(stage.previous)),
            TimedKernel("reference", stage_id, reference_source(stage_id)),
        )
        timings += time_interleaved(backend, kernels, settings, seed)
    return timings


def per_shape(backend: GpuBackend, settings: TimingSettings, seed: int) -> list:
    """One group per shape: every stage's kernel and its reference (a student's own kernels and the
    references they are compared with), each kernel once."""
    timings = []
    for shape in (Shape.SUM_1D, Shape.MAX_2D):
        ids = [s for s in ("naive", *ONE_D, "max2d_baseline", "max2d") if get_stage(s).shape is shape]
        kernels = [TimedKernel(f"yours {s}", s, reference_source(s)) for s in ids]
        kernels += [TimedKernel(f"reference {s}", s, reference_source(s)) for s in ids]
        timings += time_interleaved(backend, tuple(kernels), settings, seed)
    return timings


def measure(name, fn, backend, settings, seed, profile: bool) -> dict:
    profiler = cProfile.Profile() if profile else None
    started = time.perf_counter()
    if profiler:
        profiler.enable()
    timings = fn(backend, settings, seed)
    if profiler:
        profiler.disable()
    wall = time.perf_counter() - started
    calls = sum(t.repetitions + settings.warmup for t in timings)
    gpu = sum(t.median_ms * (t.repetitions + settings.warmup) for t in timings) / 1e3
    if profiler:
        print(f"\n--- {name}: the host's functions by own time")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(14)
    return {"wall": wall, "calls": calls, "gpu": gpu, "kernels": len(timings)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    backend = GpuBackend()
    settings = TimingSettings()
    seed = 20261123
    started = time.perf_counter()
    prepare_timing(backend, (*ONE_D, "naive", "max2d_baseline", "max2d"), settings, seed)
    print(f"drawing both timing inputs and their references: {time.perf_counter() - started:.2f} s "
          "(once per worker; outside the GPU's exclusive time)")
    results: dict[str, list[dict]] = {"a group per stage": [], "a group per shape": []}
    for round_number in range(args.repeat):
        for name, fn in (("a group per stage", per_stage), ("a group per shape", per_shape)):
            profile = args.profile and round_number == args.repeat - 1
            results[name].append(measure(name, fn, backend, settings, seed, profile))
    print(f"\n{'grouping':<20} {'wall s':>8} {'calls':>6} {'GPU s':>7} {'host ms/call':>13} (medians of {args.repeat})")
    for name, runs in results.items():
        wall = statistics.median(r["wall"] for r in runs)
        calls = statistics.median(r["calls"] for r in runs)
        gpu = statistics.median(r["gpu"] for r in runs)
        print(f"{name:<20} {wall:8.2f} {calls:6.0f} {gpu:7.2f} {1e3 * (wall - gpu) / calls:13.2f}")
    backend.close()


if __name__ == "__main__":
    main()
