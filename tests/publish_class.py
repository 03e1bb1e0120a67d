"""A small class of student results, built as records, for the leaderboard, feedback and export tests.

The numbers follow PRODUCT.md's H200 measurements at 2^26 floats. The class has full marks (ada), a tie on
score broken by speed (dennis, slower than ada), a compile error (grace), a race finding and a failed max2d
(linus), CPU-backend results without timings (barbara, ken) and open-stage entries (ada, dennis).
"""

from __future__ import annotations

import json
from pathlib import Path

from autograder.records import (
    CaseResult,
    CompilerMessage,
    DeviceInfo,
    Finding,
    Performance,
    PerfVerdict,
    StageResult,
    Status,
    StudentResult,
    Timing,
    to_dict,
)
from autograder.rubric import load_rubric, score
from autograder.stages import STAGES, get_stage

BYTES = 4 * (1 << 26)
H200 = DeviceInfo("gpu", "NVIDIA H200", "9.0", 60 * 1024 * 1024, (("pycuda", "2026.1"), ("cuda", "13.0")))
CPU = DeviceInfo("cpu", "CPU backend (g++ 12.2, boost.context)")
# Reference medians in ms at 2^26 floats (max2d at 8192 x 8192, the same bytes).
REFERENCE_MS = {"naive": 0.649, "anti_divergence": 0.408, "sequential": 0.316, "first_add": 0.173,
                "unrolled_warp": 0.134, "shuffle": 0.128, "max2d": 0.118, "max2d_baseline": 0.25, "open": 0.061}
REQUIRED = {"anti_divergence": 1.4, "sequential": 1.15, "first_add": 1.5, "unrolled_warp": 1.15, "shuffle": 1.03,
            "max2d": 1.5, "open": None}
RUBRIC = load_rubric()  # the default rubric: the points come from the grader's own arithmetic
# The students of the class, with names that must never appear in a pseudonymous page.
STUDENTS = ("ada", "barbara", "dennis", "grace", "ken", "linus")


def timing(label: str, ms: float) -> Timing:
    return Timing(label, ms, 0.002, 25, BYTES / (ms * 1e6))


def cases(stage_id: str, failing: tuple[int, ...] = ()) -> tuple[CaseResult, ...]:
    sizes = (1, 257, 65535, 1_000_003)
    if get_stage(stage_id).shape.value == "max_2d":
        return tuple(CaseResult(f"{n}x3 random", (n, 3), "random", 1.0, 1.0 if n not in failing else 0.5,
                                n not in failing) for n in sizes)
    return tuple(CaseResult(f"n={n} integers", (n,), "integers", float(n), float(n) if n not in failing else n - 1.0,
                            n not in failing) for n in sizes)


def gpu_stage(stage_id: str, factor: float, previous_ms: float | None,
              findings: tuple[Finding, ...] = ()) -> StageResult:
    """A correct stage timed on the GPU at `factor` times the reference's time."""
    stage = get_stage(stage_id)
    ms = REFERENCE_MS[stage_id] * factor
    timings = [timing("yours", ms), timing(f"reference {stage_id}", REFERENCE_MS[stage_id])]
    baseline = None
    speedup = None
    if previous_ms is not None:
        baseline = f"your {stage.previous}" if stage.previous != "max2d_baseline" else "reference max2d_baseline"
        timings.insert(1, timing(baseline, previous_ms))
        speedup = previous_ms / ms
    required = REQUIRED.get(stage_id)
    fast = required is None or speedup is None or speedup >= required
    performance = Performance(
        PerfVerdict.FAST_ENOUGH if fast else PerfVerdict.TOO_SLOW,
        "as fast as required" if fast else "slower than required",
        tuple(timings), speedup, baseline, required, factor, 1.25,
    )
    checked = cases(stage_id)
    return StageResult(
        stage=stage_id,
        status=Status.CORRECT,
        message="Correct on every case." if not findings else "Correct, but the race checker found a race.",
        hint=None if not findings else "Put __syncwarp() between the steps of the unrolled warp.",
        cases=checked,
        findings=findings,
        performance=performance,
        points=score(RUBRIC, stage_id, Status.CORRECT, len(checked), len(checked), findings, performance, True),
    )


def gpu_student(student: str, factors: dict[str, float], overrides: dict[str, StageResult] | None = None,
                seed: int = 1234) -> StudentResult:
    stages = []
    previous_ms: dict[str, float] = {"max2d_baseline": REFERENCE_MS["max2d_baseline"]}
    overrides = overrides or {}
    for stage in STAGES:
        if stage.id in overrides:
            record = overrides[stage.id]
            yours = [t.median_ms for t in record.performance.timings if t.label == "yours"]
            if yours:
                previous_ms[stage.id] = yours[0]
            stages.append(record)
            continue
        if stage.id not in factors:
            continue
        record = gpu_stage(stage.id, factors[stage.id], previous_ms.get(stage.previous or ""))
        previous_ms[stage.id] = REFERENCE_MS[stage.id] * factors[stage.id]
        stages.append(record)
    return StudentResult(student, f"submissions/{student}/reduction.ipynb", seed, "2026-11-21T10:00:00Z", H200,
                         RUBRIC.path, tuple(stages))


def failed_stage(stage_id: str, status: Status, message: str, hint: str | None = None,
                 checked: tuple[CaseResult, ...] = (), **extra: object) -> StageResult:
    performance = Performance(PerfVerdict.NOT_MEASURED, "the stage is not correct")
    points = score(RUBRIC, stage_id, status, sum(c.passed for c in checked), len(checked), (), performance, True)
    return StageResult(stage_id, status, message, hint, cases=checked, performance=performance, points=points,
                       **extra)  # type: ignore[arg-type]


def cpu_stage(stage_id: str, status: Status = Status.CORRECT) -> StageResult:
    correct = status is Status.CORRECT
    checked = cases(stage_id) if correct else ()
    performance = Performance(PerfVerdict.NOT_MEASURED, "the CPU backend does not time kernels")
    return StageResult(
        stage_id, status, "Correct on every case." if correct else "The stage was not attempted.",
        cases=checked, performance=performance,
        points=score(RUBRIC, stage_id, status, len(checked), len(checked), (), performance, False),
    )


def make_class() -> list[StudentResult]:
    all_fast = {s.id: 1.0 for s in STAGES}
    ada = gpu_student("ada", {**all_fast, "open": 1.05})
    dennis = gpu_student("dennis", {**all_fast, "shuffle": 1.01, "open": 1.4})
    compile_error = failed_stage(
        "unrolled_warp", Status.COMPILE_ERROR, "The kernel did not compile: see the error on line 12 of the cell.",
        "Check the semicolons and braces around line 12.",
        compiler=(CompilerMessage("error", 12, "expected a \";\""),),
    )
    grace = gpu_student("grace", {s.id: 1.0 for s in STAGES if not s.optional},
                        {"unrolled_warp": compile_error, "shuffle": gpu_stage("shuffle", 1.0, None)})
    race = Finding("race_syncwarp", "lanes 0 and 16 touch sdata[16] with no __syncwarp() between", 14,
                   "block (3,0,0) thread (16,0,0)", "reduce_unrolled_warp")
    max2d_failed = failed_stage(
        "max2d", Status.INCORRECT, "Wrong maximum for 3 of 4 shapes, the smallest 257x3.",
        "Odd sides: the last row and column have no partner; clamp the index instead of skipping it.",
        checked=cases("max2d", failing=(257, 65535, 1_000_003)),
    )
    linus = gpu_student("linus", {s.id: 1.1 for s in STAGES if not s.optional}, {
        "unrolled_warp": gpu_stage("unrolled_warp", 1.1, REFERENCE_MS["first_add"] * 1.1, findings=(race,)),
        "max2d": max2d_failed,
    })
    barbara = StudentResult("barbara", "submissions/barbara/reduction.ipynb", 99, "2026-11-21T10:05:00Z", CPU,
                            RUBRIC.path, tuple(cpu_stage(s.id) for s in STAGES))
    ken = StudentResult("ken", "submissions/ken/reduction.ipynb", 99, "2026-11-21T10:06:00Z", CPU,
                        RUBRIC.path,
                        tuple(cpu_stage(s.id, Status.CORRECT if s.number <= 3 else Status.NOT_ATTEMPTED)
                              for s in STAGES if not s.optional))
    return [ada, barbara, dennis, grace, ken, linus]


def write_results(folder: Path, results: list[StudentResult]) -> Path:
    """The results as `autograder grade` writes them: one `<student>.json` per student."""
    folder.mkdir(parents=True, exist_ok=True)
    for result in results:
        (folder / f"{result.student}.json").write_text(json.dumps(to_dict(result), indent=2), encoding="utf-8")
    return folder
