"""Calibration: the reference kernels' times and step speedups on one GPU model.

Required speedups come from here, not from a textbook table: the steps of one GPU do not hold on another.
The project ships the calibrations it measured (`autograder/calibrations/`); `autograder calibrate` measures
the GPU at hand. A calibration holds for the block size and input size it was measured at.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from autograder.backends.base import Backend
from autograder.errors import ConfigError
from autograder.references import reference_source
from autograder.stages import MAX2D_BASELINE, STAGES
from autograder.timing import TimedKernel, TimingSettings, time_interleaved

SHIPPED_DIR = Path(__file__).with_name("calibrations")
USER_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "autograder" / "calibrations"


@dataclass(frozen=True)
class StageCalibration:
    median_ms: float
    gbps: float
    step_speedup: float | None  # the reference's previous stage time / this stage's, timed interleaved


@dataclass(frozen=True)
class Calibration:
    gpu: str
    measured: str
    block_size: int
    n: int
    max2d_shape: tuple[int, int]
    versions: dict[str, str]
    stages: dict[str, StageCalibration]
    cub_gbps: float | None  # cupy.sum (CUB) on the same input size, where cupy is installed

    def step(self, stage_id: str) -> float | None:
        stage = self.stages.get(stage_id)
        return stage.step_speedup if stage else None


def slug(gpu_name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")


def calibration_path(gpu_name: str, directory: Path) -> Path:
    return directory / f"{slug(gpu_name)}.json"


def load_calibration(gpu_name: str, settings: TimingSettings, directories: tuple[Path, ...] = ()) -> Calibration | None:
    """The first calibration of this GPU model measured with these settings, looking in `directories`, then
    the user's cache, then the shipped ones. None when there is none."""
    for directory in (*directories, USER_DIR, SHIPPED_DIR):
        path = calibration_path(gpu_name, directory)
        if not path.exists():
            continue
        calibration = read_calibration(path)
        if (calibration.block_size, calibration.n, calibration.max2d_shape) == (
            settings.block_size,
            settings.n,
            tuple(settings.max2d_shape),
        ):
            return calibration
    return None


def read_calibration(path: Path) -> Calibration:
    try:
        data = json.loads(path.read_text())
        data["stages"] = {key: StageCalibration(**value) for key, value in data["stages"].items()}
        data["max2d_shape"] = tuple(data["max2d_shape"])
        return Calibration(**data)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"{path}: not a calibration file ({error})") from None


def write_calibration(calibration: Calibration, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(asdict(calibration), indent=2) + "\n")
    temporary.replace(path)
    return path


def measure(backend: Backend, settings: TimingSettings, seed: int) -> Calibration:
    """Time every reference stage interleaved with its previous stage. Runs in the worker process."""
    device = backend.device()
    stages: dict[str, StageCalibration] = {}
    for stage in STAGES:
        kernels = [TimedKernel(f"reference {stage.id}", stage.id, reference_source(stage.id))]
        if stage.previous:
            kernels.append(TimedKernel(f"reference {stage.previous}", stage.previous, reference_source(stage.previous)))
        timings = time_interleaved(backend, tuple(kernels), settings, seed)
        step = timings[1].median_ms / timings[0].median_ms if len(timings) > 1 else None
        stages[stage.id] = StageCalibration(timings[0].median_ms, timings[0].gbps, step)
        if stage.previous == MAX2D_BASELINE.id:
            stages[MAX2D_BASELINE.id] = StageCalibration(timings[1].median_ms, timings[1].gbps, None)
    return Calibration(
        gpu=device.name,
        measured=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        block_size=settings.block_size,
        n=settings.n,
        max2d_shape=tuple(settings.max2d_shape),
        versions=dict(device.versions),
        stages=stages,
        cub_gbps=cub_bandwidth(backend, settings.n),
    )


def cub_bandwidth(backend: Backend, n: int, repetitions: int = 30) -> float | None:
    """GB/s of `cupy.sum` (CUB) on n floats with the L2 flushed, the ceiling the open stage is ranked against."""
    try:
        import cupy
    except ImportError:
        return None
    data = cupy.random.random(n, dtype=cupy.float32)
    times = []
    for _ in range(repetitions + 3):
        backend.flush_l2()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        cupy.sum(data)
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return 4 * n / (float(np.median(times[3:])) * 1e-3) / 1e9


def describe(calibration: Calibration) -> str:
    """A small table of a calibration, for the terminal."""
    lines = [f"{calibration.gpu}: block size {calibration.block_size}, n = {calibration.n}"]
    for stage_id, stage in calibration.stages.items():
        step = f"{stage.step_speedup:.2f}x" if stage.step_speedup else "-"
        lines.append(f"  {stage_id:16} {stage.median_ms * 1e3:9.0f} us {stage.gbps:8.0f} GB/s  step {step}")
    if calibration.cub_gbps:
        lines.append(f"  CUB (cupy.sum)   {calibration.cub_gbps:8.0f} GB/s")
    return "\n".join(lines)
