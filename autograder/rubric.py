"""The rubric file and the arithmetic of points: pure functions over the records."""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from autograder.errors import ConfigError
from autograder.records import (
    FINDING_KINDS,
    Finding,
    Performance,
    PerfVerdict,
    Points,
    Status,
    TechniqueCheck,
    Timing,
)
from autograder.stages import STAGE_IDS
from autograder.timing import TimingSettings

DEFAULT_RUBRIC = Path(__file__).with_name("rubric.toml")
BLOCK_SIZES = (64, 128, 256, 512, 1024)
UNDEFINED_VERDICTS = ("incorrect", "penalty")


@dataclass(frozen=True)
class StagePoints:
    correctness: float
    performance: float


@dataclass(frozen=True)
class Rubric:
    path: str
    block_size: int
    timing: TimingSettings
    gain_fraction: float
    max_time_vs_reference: float
    speedup_tolerance: float  # how far a speedup may fall short of the required one: the machine's drift
    penalties: dict[str, float]
    stages: dict[str, StagePoints]
    sha256: str = ""  # of the file's bytes as read
    technique_absent: float = 0.5  # the share of a stage's points lost when its technique is absent
    # A correct stage with a finding that leaves its result undefined by CUDA: "incorrect" (one verdict on
    # every backend), or "penalty" (correct, less the [penalties] share; the verdict may then differ by backend).
    undefined: str = "incorrect"

    @property
    def label(self) -> str:
        """The rubric as results name it: its file name and a short hash of its content, never a host path."""
        return f"{Path(self.path).name}@{self.sha256[:8]}"

    def required_speedup(self, reference_step: float | None) -> float | None:
        """The speedup a stage needs over its previous stage, from the reference's calibrated step."""
        if reference_step is None:
            return None
        return 1.0 + self.gain_fraction * (reference_step - 1.0)


def load_rubric(path: Path | str | None = None) -> Rubric:
    """The rubric at `path` (the default rubric when None). Raises ConfigError naming what is wrong."""
    path = Path(path) if path else DEFAULT_RUBRIC
    try:
        content = path.read_bytes()
        data = tomllib.loads(content.decode())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such rubric file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: not valid TOML ({error})") from None
    try:
        return replace(_parse(path, data), sha256=hashlib.sha256(content).hexdigest())
    except (KeyError, TypeError, ValueError) as error:
        raise ConfigError(f"{path}: {error}") from None


def _parse(path: Path, data: dict) -> Rubric:
    block_size = int(data["block_size"])
    if block_size not in BLOCK_SIZES:
        raise ValueError(f"block_size must be one of {BLOCK_SIZES}, not {block_size}")
    timing_data = data.get("timing", {})
    timing = TimingSettings(
        **{key: value for key, value in timing_data.items() if key != "max2d_shape"},
        max2d_shape=tuple(timing_data.get("max2d_shape", TimingSettings.max2d_shape)),
        block_size=block_size,
    )
    penalties = {kind: float(share) for kind, share in data.get("penalties", {}).items()}
    unknown = set(penalties) - set(FINDING_KINDS)
    if unknown:
        raise ValueError(f"unknown finding kinds in [penalties]: {', '.join(sorted(unknown))}")
    stages = {
        stage_id: StagePoints(float(points["correctness"]), float(points["performance"]))
        for stage_id, points in data["stages"].items()
    }
    unknown = set(stages) - set(STAGE_IDS)
    if unknown:
        raise ValueError(f"unknown stages in [stages]: {', '.join(sorted(unknown))}; the stages are {STAGE_IDS}")
    missing = set(STAGE_IDS) - set(stages)
    if missing:
        raise ValueError(f"[stages] has no points for {', '.join(sorted(missing))}")
    speed = data.get("speed", {})
    technique_absent = float(data.get("technique", {}).get("absent", 0.5))
    if not 0.0 <= technique_absent <= 1.0:
        raise ValueError(f"[technique] absent must be a share from 0 to 1, not {technique_absent}")
    undefined = str(data.get("undefined_behaviour", {}).get("verdict", "incorrect"))
    if undefined not in UNDEFINED_VERDICTS:
        raise ValueError(f"[undefined_behaviour] verdict must be one of {UNDEFINED_VERDICTS}, not {undefined!r}")
    return Rubric(
        path=str(path),
        block_size=block_size,
        timing=timing,
        gain_fraction=float(speed.get("gain_fraction", 0.5)),
        max_time_vs_reference=float(speed.get("max_time_vs_reference", 1.25)),
        speedup_tolerance=float(speed.get("speedup_tolerance", 0.02)),
        penalties=penalties,
        stages=stages,
        technique_absent=technique_absent,
        undefined=undefined,
    )


def score(
    rubric: Rubric,
    stage_id: str,
    status: Status,
    passed_cases: int,
    total_cases: int,
    findings: tuple[Finding, ...],
    performance: Performance,
    performance_measured: bool,
    technique: tuple[TechniqueCheck, ...] = (),
) -> Points:
    """A stage's points, with the rubric's reasoning line by line. A failed technique check (autograder.technique)
    costs the rubric's share of the points earned."""
    available = rubric.stages[stage_id]
    correct = status is Status.CORRECT
    correctness = available.correctness if correct else 0.0
    lines = [
        f"correctness {correctness:g}/{available.correctness:g}: "
        + (f"{passed_cases} of {total_cases} cases right" if total_cases else status.value.replace("_", " "))
    ]
    max_performance = 0.0
    performance_points = 0.0
    if performance_measured:
        max_performance = available.performance
        fast = performance.verdict is PerfVerdict.FAST_ENOUGH
        performance_points = available.performance if correct and fast else 0.0
        lines.append(f"performance {performance_points:g}/{available.performance:g}: {performance.reason}")
    elif available.performance:
        lines.append(f"performance not counted: {performance.reason}")
    share = min(1.0, sum(rubric.penalties.get(kind, 0.0) for kind in {f.kind for f in findings}))
    penalty = round(share * correctness, 6)
    if penalty:
        kinds = ", ".join(sorted({f.kind for f in findings if rubric.penalties.get(f.kind)}))
        lines.append(f"penalty -{penalty:g}: {kinds}")
    absent = [check.name for check in technique if check.passed is False]
    lost = round(rubric.technique_absent * (correctness + performance_points), 6) if absent else 0.0
    if lost:
        lines.append(f"technique -{lost:g}: the stage's technique is absent ({', '.join(absent)})")
    return Points(
        correctness, performance_points, penalty, available.correctness, max_performance, tuple(lines), lost
    )


def judge_speed(
    rubric: Rubric, timings: tuple[Timing, ...], baseline: str | None, reference_step: float | None
) -> Performance:
    """The speed verdict from timings measured together: yours first, then the baseline (when the stage has
    one), then the reference kernel of the same stage."""
    yours, reference = timings[0], timings[-1]
    speedup = timings[1].median_ms / yours.median_ms if baseline else None
    required = rubric.required_speedup(reference_step) if baseline else None
    versus = yours.median_ms / reference.median_ms
    allowed = rubric.max_time_vs_reference
    fast_enough = versus <= allowed
    parts = []
    if speedup is not None and required is not None:
        fast_enough = fast_enough and speedup >= required - rubric.speedup_tolerance
        parts.append(f"{speedup:.2f}x over {baseline} (needs {required:.2f}x)")
    parts.append(f"{versus:.2f}x the reference's time (at most {allowed:.2f}x)")
    return Performance(
        verdict=PerfVerdict.FAST_ENOUGH if fast_enough else PerfVerdict.TOO_SLOW,
        reason="; ".join(parts),
        timings=timings,
        speedup=speedup,
        baseline=baseline,
        required_speedup=required,
        time_vs_reference=versus,
        allowed_time_vs_reference=allowed,
        reference_step=reference_step if baseline else None,
    )
