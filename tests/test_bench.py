"""The benchmarks are not tests, but they must keep running: a small run of the CPU one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.batch import ClassRun
from autograder.records import DeviceInfo, StageResult, Status, StudentResult
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


def test_the_worker_start_benchmark_starts_workers_at_once() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "worker_starts.py"), "--counts", "1,3", "--backends", "cpu"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    assert [(line[0], line[1]) for line in lines] == [("cpu", "1"), ("cpu", "3")]
    first, last = float(lines[1][5]), float(lines[1][-2])
    assert 0 < first <= last


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_nvcc_benchmark_compiles_the_stages_both_ways_to_the_same_code() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "nvcc_batch.py"), "--rounds", "1"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("7 stages, 7 nvcc runs: ") and lines[1].startswith("7 stages, one nvcc run: ")
    assert len(lines) == 9 and all(line.endswith("PTX the same but for names") for line in lines[2:])


def test_process_accounting_counts_every_program_that_ends_inside_it(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from class_throughput import Accounting
    finally:
        sys.path.remove(str(ROOT / "bench"))
    probe = tmp_path / "ag-acct-probe"  # accounting sees the whole machine: a name no other program has
    shutil.copy(shutil.which("true") or "/bin/true", probe)
    with Accounting() as accounting:
        for _ in range(3):
            subprocess.run([str(probe)], check=True)
        subprocess.run([sys.executable, "-c", "sum(range(10**7))"], check=True)
    if not accounting.on:
        pytest.skip("process accounting needs root")
    seconds, count = accounting.programs()
    assert count["ag-acct-probe"] == 3
    assert 0.05 < seconds[Path(sys.executable).name[:15]] < 60  # the name it was started by


def test_the_class_bench_says_why_a_stage_graded_differently_in_two_runs(capsys: pytest.CaptureFixture) -> None:
    # On two GPUs a class gave two correct stages 'timeout', and the bench showed only the statuses: the message,
    # which names the limit that ran out and where, is what finds the cause.
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from class_throughput import compare
    finally:
        sys.path.remove(str(ROOT / "bench"))

    def graded(status: Status, message: str) -> ClassRun:
        stage = StageResult("max2d", status, message)
        student = StudentResult("ann", "ann.ipynb", 1, "", DeviceInfo("gpu", "GPU"), "rubric", (stage,))
        return ClassRun((student,), (), ROOT)

    timed_out = "timed out: the kernel ran past its 42 s limit"
    compare("distinct: grades on 2 GPUs", graded(Status.TIMEOUT, timed_out), graded(Status.CORRECT, "correct"), "")
    compare("distinct: grades again", graded(Status.CORRECT, "right"), graded(Status.CORRECT, "right again"), "")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "distinct: grades on 2 GPUs DIFFER from "
    assert out[2:4] == [f"    max2d here: {timed_out}", "    max2d there: correct"]
    assert out[4:] == ["distinct: grades again equal "]  # the same grades, whatever each message says


def test_a_build_for_the_cpu_analysis_starts_four_sandboxes_at_most() -> None:
    # Compile, link, inspect (nm three times and objdump, in one sandbox) and addr2line: every sandbox takes the
    # kernel's locks over namespaces while it starts, and a class of hundreds starts thousands.
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "build_sandboxes.py"), "--rounds", "1"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    runs = int(done.stdout.split(", ")[-1].split()[0])
    assert 0 < runs <= 4 * len(REQUIRED_STAGE_IDS), done.stdout
