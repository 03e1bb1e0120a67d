"""The numbers the leaderboard, the feedback and the exports show of a stage, read from its record.

One place decides which timing is the student's and which the reference's, what "verified" means and what
the bandwidth ceilings are, so the three outputs never disagree about a number.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from autograder.calibration import SHIPPED_DIR, USER_DIR, calibration_path, read_calibration
from autograder.publish.plots import StageSeries
from autograder.records import PerfVerdict, StageResult, Status, StudentResult, Timing
from autograder.stages import STAGES, Shape, Stage

YOURS = "yours"
REFERENCE_PREFIX = "reference"

# Datasheet memory bandwidth in GB/s, the ceiling a reduction cannot beat. Only GPUs whose figure the project
# has checked are listed; others can be given with --peak-gbps.
DATASHEET_PEAK_GBPS: dict[str, float] = {
    "H200": 4800.0,  # PRODUCT.md: 4.8 TB/s datasheet
}


@dataclass(frozen=True)
class StageFigures:
    """One student's stage as the published pages show it; None wherever nothing was measured."""

    stage: Stage
    result: StageResult | None  # None when the result file has no record of the stage at all
    yours: Timing | None
    reference: Timing | None

    @property
    def status(self) -> Status:
        return self.result.status if self.result else Status.NOT_ATTEMPTED

    @property
    def verified(self) -> bool:
        """Correct on every case and free of findings: only such a kernel can top a ranking on speed."""
        return self.result is not None and self.status is Status.CORRECT and not self.result.findings

    @property
    def measured(self) -> bool:
        return self.yours is not None

    @property
    def speedup(self) -> float | None:
        return self.result.performance.speedup if self.result else None

    @property
    def points(self) -> float | None:
        return self.result.points.total if self.result and self.result.points else None

    @property
    def max_points(self) -> float | None:
        return self.result.points.max_points if self.result and self.result.points else None

    @property
    def speed_vs_reference(self) -> float | None:
        """Reference time / your time: above 1 the student's kernel beat the reference kernel."""
        if self.yours and self.reference and self.yours.median_ms > 0:
            return self.reference.median_ms / self.yours.median_ms
        ratio = self.result.performance.time_vs_reference if self.result else None
        return 1.0 / ratio if ratio else None

    @property
    def state(self) -> str:
        """A word or two for a table cell where there is no number: why nothing was measured."""
        if self.status is not Status.CORRECT:
            return self.status.value.replace("_", " ")
        if self.result and self.result.performance.verdict is PerfVerdict.NOT_MEASURED:
            return "not measured"
        return "no timing"


def stage_figures(result: StudentResult, stage: Stage) -> StageFigures:
    record = next((s for s in result.stages if s.stage == stage.id), None)
    if record is None:
        return StageFigures(stage, None, None, None)
    timings = record.performance.timings
    yours = next((t for t in timings if t.label == YOURS), None)
    return StageFigures(stage, record, yours, _reference_timing(record, timings))


def all_figures(result: StudentResult) -> list[StageFigures]:
    """The student's stages in catalogue order, optional ones included."""
    return [stage_figures(result, stage) for stage in STAGES]


def best_verified(result: StudentResult) -> StageFigures | None:
    """The student's fastest verified 1-D kernel, by bandwidth.

    Bandwidth rather than time, so that results timed at different sizes still compare; at one size the two
    orders are the same. max2d is left out: it is a different problem with its own baseline.
    """
    candidates = [f for f in all_figures(result) if f.verified and f.yours and f.stage.shape is Shape.SUM_1D]
    return max(candidates, key=lambda f: f.yours.gbps if f.yours else 0.0, default=None)


def _reference_timing(record: StageResult, timings: Iterable[Timing]) -> Timing | None:
    """The reference kernel of this very stage, timed in the same run.

    The labels are "reference <stage id>"; a reference of the previous stage may be there too, as the baseline
    of the speedup, so a lone "reference ..." label counts only when it is not the baseline.
    """
    references = [t for t in timings if t.label.startswith(REFERENCE_PREFIX)]
    exact = [t for t in references if t.label in (f"{REFERENCE_PREFIX} {record.stage}", REFERENCE_PREFIX)]
    if exact:
        return exact[0]
    others = [t for t in references if t.label != record.performance.baseline]
    return others[0] if len(others) == 1 else None


def speed_series(
    per_student: Sequence[Sequence[StageFigures]], stages: Sequence[Stage]
) -> tuple[list[StageSeries], list[StageSeries]]:
    """Per stage of `stages`: the correct, measured kernels' speedups with the rubric's requirement and the reference's
    own step; and their speed against the reference kernel with the slowest allowed ratio. `per_student` holds
    each student's `all_figures`; one student gives the series of a feedback page."""
    steps, versus = [], []
    by_id = [{f.stage.id: f for f in figures} for figures in per_student]
    for stage in stages:
        column = [figures[stage.id] for figures in by_id if stage.id in figures]
        good = [f for f in column if f.status is Status.CORRECT and f.measured]
        speedups = [f.speedup for f in good if f.speedup is not None]
        required = _median([f.result.performance.required_speedup for f in column if f.result])
        allowed = _median([f.result.performance.allowed_time_vs_reference for f in column if f.result])
        steps.append(StageSeries(stage.id, speedups, required, _reference_step(by_id, stage)))
        versus.append(StageSeries(stage.id, [v for f in good if (v := f.speed_vs_reference) is not None],
                                  1.0 / allowed if allowed else None))
    return steps, versus


def _reference_step(by_id: Sequence[dict[str, StageFigures]], stage: Stage) -> float | None:
    """The reference kernels' own step, previous over this stage's time, where both were timed for a student."""
    ratios = []
    for figures in by_id:
        this, previous = figures.get(stage.id), figures.get(stage.previous or "")
        if this and previous and this.reference and previous.reference and this.reference.median_ms > 0:
            ratios.append(previous.reference.median_ms / this.reference.median_ms)
    return statistics.median(ratios) if ratios else None


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


@dataclass(frozen=True)
class Ceilings:
    """Per GPU model: CUB's bandwidth (`cupy.sum`, from the calibration) and the datasheet peak, in GB/s."""

    cub_gbps: dict[str, float]
    peak_gbps: dict[str, float]

    def cub_for(self, device: str) -> float | None:
        return _lookup(self.cub_gbps, device)

    def peak_for(self, device: str) -> float | None:
        return _lookup(self.peak_gbps, device) or _lookup(DATASHEET_PEAK_GBPS, device)


def load_ceilings(
    calibrations: Iterable[Path] = (),
    cub_gbps: float | None = None,
    peak_gbps: float | None = None,
    devices: Iterable[str] = (),
) -> Ceilings:
    """The bandwidth figures of the class's GPU models (`devices`).

    CUB's comes from the calibration files given, or else from each device's calibration in the user's cache
    or the shipped ones (`autograder calibrate` measures it where cupy is installed). The peak comes from the
    datasheet table. A figure given on the command line applies to every device, above the files.
    """
    devices = sorted(set(devices))
    found = [read_calibration(Path(path)) for path in calibrations]
    if not found:
        for device in devices:
            for folder in (USER_DIR, SHIPPED_DIR):
                path = calibration_path(device, folder)
                if path.exists():
                    found.append(read_calibration(path))
    cub: dict[str, float] = {}
    for calibration in found:
        if calibration.cub_gbps and calibration.gpu not in cub:
            cub[calibration.gpu] = calibration.cub_gbps
    peak: dict[str, float] = {}
    for device in devices:
        if cub_gbps is not None:
            cub[device] = cub_gbps
        if peak_gbps is not None:
            peak[device] = peak_gbps
    return Ceilings(cub, peak)


def _lookup(table: dict[str, float], device: str) -> float | None:
    """A figure for `device`: its exact name, else a table key that is a word of the name ("H200")."""
    if device in table:
        return table[device]
    words = device.replace("-", " ").split()
    matches = [value for key, value in table.items() if key in words]
    return matches[0] if len(matches) == 1 else None


def fmt_number(value: float | None, digits: int = 3) -> str:
    """A number for a table: `digits` significant figures, no scientific notation for ordinary sizes."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(0, digits - 1 - magnitude)
    return f"{value:.{decimals}f}"


def case_value(value: float | None) -> str:
    """A correctness case's value to float32's precision (9 digits tell any two float32 apart), not float64's."""
    return "" if value is None else f"{value:.9g}"
