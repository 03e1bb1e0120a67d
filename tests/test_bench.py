"""The benchmarks are not tests, but they must keep running: a small run of the CPU one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from autograder.stages import REQUIRED_STAGE_IDS

ROOT = Path(__file__).resolve().parents[1]


def test_the_cpu_benchmark_prints_every_stage() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "cpu_backend.py"), "--size", "4096"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    for stage_id in REQUIRED_STAGE_IDS:
        assert any(line.startswith(stage_id) for line in done.stdout.splitlines()), stage_id
    assert "all seven stages graded" in done.stdout
