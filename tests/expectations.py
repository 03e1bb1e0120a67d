"""Reading the written verdicts of the example class and the known submissions, for the end-to-end tests."""

from __future__ import annotations

import tomllib
from pathlib import Path

from autograder.at_scale import blocks_run, grid_size
from autograder.grade import GradeOptions
from autograder.records import StageResult
from autograder.stages import get_stage
from autograder.verify import timing_case

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "submissions"
KNOWN = ROOT / "tests" / "known"


def unsampled_blocks(options: GradeOptions, stage_id: str) -> tuple[int, int]:
    """The widest run of blocks (first, last) of the timing size's first pass that the sampled blocks of a run with
    these options leave out (autograder.at_scale): a kernel wrong only there is wrong only in a timed call."""
    stage = get_stage(stage_id)
    (case,) = timing_case(stage, options.seed, options.rubric.timing.size_of(stage.shape))
    sampled = blocks_run(grid_size(stage, case.size, options.rubric.block_size), case.seed, 0)
    low, high = max(zip(sampled[:-1], sampled[1:], strict=True), key=lambda pair: pair[1] - pair[0])
    return int(low) + 1, int(high) - 1


def expected_class() -> dict:
    return tomllib.loads((EXAMPLES / "EXPECTED.toml").read_text())


def known_cases() -> list[dict]:
    return tomllib.loads((KNOWN / "cases.toml").read_text())["case"]


def acceptable_statuses(expected: dict, backend: str) -> set[str]:
    status = expected.get(f"status_{backend}", expected.get("status"))
    return set(status) if isinstance(status, list) else {status}


def mismatches(result: StageResult, expected: dict, backend: str) -> list[str]:
    """What differs between a stage's result and its written verdict; empty when it matches."""
    problems = []
    statuses = acceptable_statuses(expected, backend)
    if result.status.value not in statuses:
        problems.append(f"status {result.status.value}, expected {sorted(statuses)}: {result.message}")
    kinds = {finding.kind for finding in result.findings}
    # On the GPU, compute-sanitizer's findings join the CPU analysis's: `findings_gpu` says where they differ.
    written = expected.get("findings", [])
    wanted = set(expected.get("findings_gpu", written) if backend == "gpu" else written)
    if kinds != wanted:
        problems.append(f"findings {sorted(kinds)}, expected {sorted(wanted)}")
    perf = expected.get("perf") if backend == "gpu" else "not_measured"
    if perf and result.performance.verdict.value != perf:
        problems.append(f"speed {result.performance.verdict.value}, expected {perf}: {result.performance.reason}")
    return problems
