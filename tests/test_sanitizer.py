# ruff: noqa: E501 (compute-sanitizer's report lines are quoted whole)
"""compute-sanitizer on the GPU (autograder.sanitizer): which checker sees what, and that its report is read as
data, never trusted blindly.

The GPU tests run the real tool over kernels of this file's own, in the sandbox, and say for each kind of
defect which checker is right: both, the CPU analysis only (a barrier that part of a block skips, a race
between blocks on global memory), or neither. The CPU tests check the report reading, with a real launcher.
"""

from __future__ import annotations

import re

import pytest

from autograder.build import Builder
from autograder.executors import StudentWorkers
from autograder.grade import GradeOptions, grade_stages
from autograder.isolation import Worker
from autograder.records import Build, KernelSource, SourceLocation
from autograder.references import reference_source
from autograder.sandbox import Sandbox
from autograder.sanitizer import (
    PREFIX,
    SANITIZER_CASES,
    find_sanitizer,
    launcher_of,
    parse_report,
    run_in,
    sanitize,
)
from autograder.schedule import gpu_gate
from autograder.stages import REQUIRED_STAGE_IDS, Shape, get_stage
from autograder.verify import forget

# --- kernels of this file's own: (stage, mutation of the reference) ----------------------------------------


def mutant(stage_id: str, old: str, new: str, count: int = 1) -> str:
    text = reference_source(stage_id).text
    assert old in text, f"{old!r} is not in the {stage_id} reference"
    return text.replace(old, new, count)


def barrier_in_branch(stage_id: str) -> str:
    """The tree's __syncthreads() moved inside `if (tid < s)`: only part of the block reaches it."""
    text = reference_source(stage_id).text
    fixed = re.sub(r"if \(tid < s\) \{\s*(sdata\[tid\] \+= sdata\[tid \+ s\];)\s*\}\s*__syncthreads\(\);",
                   r"if (tid < s) { \1 __syncthreads(); }", text, count=1)
    assert fixed != text
    return fixed


KERNELS = {
    # A race between warps: the barrier after the load is gone.
    "load_without_barrier": ("first_add", lambda: mutant("first_add", "sdata[tid] = sum;\n    __syncthreads();",
                                                         "sdata[tid] = sum;")),
    # A race within one warp: the unrolled last warp without __syncwarp (unsafe since sm_70).
    "warp_without_syncwarp": ("unrolled_warp", lambda: mutant("unrolled_warp", "__syncwarp();", "", 10)),
    # Global reads past n: no bounds check on the load.
    "load_without_bounds": ("anti_divergence", lambda: mutant("anti_divergence", "(i < n) ? g_in[i] : 0.0f",
                                                              "g_in[i]")),
    # A shared-memory write past the block's dynamic allocation.
    "shared_write_past_end": ("sequential", lambda: mutant("sequential", "__syncthreads();\n",
                                                           "__syncthreads();\n    if (tid == 0) sdata[blockDim.x + 7] = 0.0f;\n")),
    # A barrier that part of the block skips, and a race between blocks on global memory.
    "barrier_in_branch": ("sequential", lambda: barrier_in_branch("sequential")),
    "every_block_adds_into_first": ("first_add", lambda: mutant("first_add", "g_out[blockIdx.x] = sdata[0];",
                                                                 "g_out[0] += sdata[0];")),
}
# Which checker reports what (measured on an H200 with CUDA 13.0's compute-sanitizer): the kinds from the
# sanitizer, and the kinds from the CPU analysis of the same kernel.
SANITIZER_SEES = {
    "load_without_barrier": {"race_syncthreads"},
    "warp_without_syncwarp": {"race_syncwarp"},
    "load_without_bounds": {"out_of_bounds"},
    "shared_write_past_end": {"out_of_bounds"},
    "barrier_in_branch": set(),  # blind: the sum is right on an H200, and synccheck reports nothing
    "every_block_adds_into_first": set(),  # blind: racecheck watches shared memory only
}
CPU_SEES = {
    "load_without_barrier": {"race_syncthreads", "uninitialised_read"},  # the tree reads values not yet stored
    "warp_without_syncwarp": {"race_syncwarp"},
    "load_without_bounds": {"out_of_bounds"},
    "shared_write_past_end": {"out_of_bounds"},
    "barrier_in_branch": {"barrier_divergence"},
    "every_block_adds_into_first": {"race_interblock"},
}


# --- the report, read as data (no GPU) -------------------------------------------------------------------

# Report lines as compute-sanitizer 2025.3 printed them on the H200 (prefix removed), for the kernels above.
MEMCHECK = """COMPUTE-SANITIZER
Invalid __global__ read of size 4 bytes
    at reduce_sequential(const float *, float *, unsigned int)+0xc0 in kernel.cu:9
    by thread (232,0,0) in block (3,0,0)
    Access to 0x7f38d6a00fa0 is out of bounds
    and is 1 bytes after the nearest allocation at 0x7f38d6a00000 of size 4000 bytes
    Saved host backtrace up to driver entry point at kernel launch time
        Host Frame: launch in gpu.py:287

Program hit CUDA_ERROR_LAUNCH_FAILED (error 719) due to "unspecified launch failure" on CUDA API call to cuStreamSynchronize.

ERROR SUMMARY: 2 errors""".splitlines()
RACECHECK = """COMPUTE-SANITIZER
Error: Race reported between Read access at reduce_sequential(const float *, float *, unsigned int)+0x190 in kernel.cu:16
    and Write access at reduce_sequential(const float *, float *, unsigned int)+0x130 in kernel.cu:9 [512 hazards]
    and Write access at reduce_sequential(const float *, float *, unsigned int)+0x1b0 in kernel.cu:16 [508 hazards]

Warning: Race reported between Read access at reduce_unrolled_warp(const float *, float *, unsigned int)+0x310 in kernel.cu:48
    and Write access at reduce_unrolled_warp(const float *, float *, unsigned int)+0x360 in kernel.cu:46 [248 hazards]

RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)""".splitlines()


def located(stage_id: str, first_line: int) -> Build:
    """A build whose source starts on line `first_line` of its notebook cell."""
    source = KernelSource("x\n" * 60, SourceLocation("nb.ipynb", "reduce", 3, first_line))
    return Build("gpu", stage_id, source, (), ())


def test_memcheck_reports_become_out_of_bounds_findings_on_the_cells_line() -> None:
    found = parse_report("memcheck", MEMCHECK, {"sequential": located("sequential", 5)})
    (finding,) = found["sequential"]
    assert finding.kind == "out_of_bounds"
    assert finding.line == 13  # kernel.cu:9 in a cell whose source starts on its line 5
    assert finding.thread == "block (3,0,0) thread (232,0,0)"
    assert finding.message.startswith("compute-sanitizer memcheck: invalid __global__ read of size 4 bytes at line 13")
    assert "past the end of a 4000-byte buffer" in finding.message


def test_racecheck_errors_are_races_between_warps_and_warnings_races_within_one() -> None:
    builds = {"sequential": located("sequential", 1), "unrolled_warp": located("unrolled_warp", 1)}
    found = parse_report("racecheck", RACECHECK, builds)
    (between,) = found["sequential"]
    (within,) = found["unrolled_warp"]
    assert (between.kind, between.line) == ("race_syncthreads", 16)
    assert "a read at line 16 against a write at line 9 and a write at line 16 (1020 hazards" in between.message
    assert (within.kind, within.line) == ("race_syncwarp", 48)


def test_a_report_about_a_kernel_the_student_did_not_hand_in_is_not_theirs() -> None:
    assert parse_report("racecheck", RACECHECK, {"shuffle": located("shuffle", 1)}) == {}


def chatty_launcher(junk_bytes: int) -> tuple[str, ...]:
    """A real launcher in the sandbox: prints a flood, then a report line, then starts the worker."""
    script = (
        f'head -c {junk_bytes} /dev/zero | tr "\\0" "x"; echo; '
        f'echo "{PREFIX}Error: Race reported between Read access at reduce_shuffle(int)+0x10 in kernel.cu:3"; '
        'exec "$@"'
    )
    return ("/bin/sh", "-c", script, "launcher")


def test_report_lines_are_found_past_a_flood_of_other_output() -> None:
    # What a kernel prints cannot push the tool's report out of reach: the whole output is scanned.
    with Worker("cpu", launcher=chatty_launcher(3 << 20)) as worker:
        assert worker.device.backend == "cpu"  # the worker started through the launcher
        worker.shut_down()
        lines = worker.report_lines(PREFIX)
    assert lines == ["Error: Race reported between Read access at reduce_shuffle(int)+0x10 in kernel.cu:3"]
    found = parse_report("racecheck", lines, {"shuffle": located("shuffle", 1)})
    assert [f.kind for f in found["shuffle"]] == ["race_syncthreads"]


# --- the real tool on the GPU ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sanitizer_tool() -> str:
    tool = find_sanitizer()
    if tool is None:
        pytest.skip("compute-sanitizer is not installed")
    return tool


@pytest.fixture(scope="module")
def gpu_builder() -> Builder:
    with Worker("gpu") as worker:
        return Builder(worker.device, Sandbox(True))


def sanitized(builds: dict[str, Build], tool: str) -> dict:
    """What the tools see in `builds`, a student's, in sessions of its own."""
    workers = StudentWorkers("gpu", {}, Sandbox(True))
    try:
        return sanitize(builds, tool, workers.session, set(), 256, lambda: gpu_gate(0, exclusive=False))
    finally:
        workers.close()


@pytest.mark.gpu
def test_each_checker_sees_what_this_file_says_it_sees(sanitizer_tool: str, gpu_builder: Builder) -> None:
    builds = {}
    for name, (stage_id, make) in KERNELS.items():
        builds[name] = gpu_builder.build(get_stage(stage_id), KernelSource(make()))
    seen = {}
    for name, build in builds.items():  # one student per kernel: several kernels of one stage
        found = sanitized({build.stage_id: build}, sanitizer_tool)[build.stage_id]
        seen[name] = {f.kind for f in found.findings}
        assert all(f.message.startswith("compute-sanitizer ") for f in found.findings)
    assert seen == SANITIZER_SEES


@pytest.mark.gpu
def test_the_reference_kernels_are_clean_under_every_tool(sanitizer_tool: str, gpu_builder: Builder) -> None:
    builds = {s: gpu_builder.build(get_stage(s), reference_source(s)) for s in REQUIRED_STAGE_IDS}
    found = sanitized(builds, sanitizer_tool)
    assert {stage_id: seen for stage_id, seen in found.items() if seen.findings or seen.notes} == {}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(KERNELS))
def test_a_gpu_grade_joins_both_checkers_findings(sanitizer_tool: str, name: str) -> None:
    stage_id, make = KERNELS[name]
    options = GradeOptions(backend="gpu", measure_speed=False, case_seconds=10.0)
    (result,) = grade_stages({stage_id: KernelSource(make())}, only=[stage_id], options=options)
    kinds = {f.kind for f in result.findings}
    assert kinds == SANITIZER_SEES[name] | CPU_SEES[name], result.findings
    from_sanitizer = {f.kind for f in result.findings if f.message.startswith("compute-sanitizer")}
    # Where both see a defect on the same line, one finding stands for both.
    assert from_sanitizer <= SANITIZER_SEES[name]


@pytest.mark.parametrize("name", list(KERNELS))
def test_the_cpu_analysis_sees_what_this_file_says(name: str) -> None:
    stage_id, make = KERNELS[name]
    options = GradeOptions(backend="cpu", case_seconds=20.0)
    (result,) = grade_stages({stage_id: KernelSource(make())}, only=[stage_id], options=options)
    assert {f.kind for f in result.findings} == CPU_SEES[name], result.findings



def test_what_the_tools_saw_is_kept_in_the_class_memo_whole(tmp_path) -> None:
    from autograder.memo import StageMemo
    from autograder.sanitizer import Sanitized

    found = parse_report("racecheck", RACECHECK, {"sequential": located("sequential", 4)})["sequential"]
    memo = StageMemo(tmp_path)
    memo.put("k", Sanitized(tuple(found), ("compute-sanitizer synccheck could not finish",)))
    assert memo.get("k", Sanitized) == Sanitized(tuple(found), ("compute-sanitizer synccheck could not finish",))
    assert memo.get("missing", Sanitized) is None


def test_a_batched_kernel_s_report_reads_as_its_own() -> None:
    """A stage built in a student's nvcc batch (autograder.backends.gpu_batch) is reported in its namespace and its
    own file: the same stage, line and finding as when it is built alone."""
    batched = [
        line.replace("at reduce_sequential(", "at ag_sequential::reduce_sequential(").replace(
            "in kernel.cu:", "in kernel_sequential.cu:"
        )
        for line in MEMCHECK
    ]
    builds = {"sequential": located("sequential", 5)}
    assert parse_report("memcheck", batched, builds) == parse_report("memcheck", MEMCHECK, builds)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["warp_without_syncwarp", "load_without_barrier"])
def test_a_kept_session_reports_every_run_of_a_racy_kernel_not_only_its_first_ones(
    sanitizer_tool: str, gpu_builder: Builder, name: str
) -> None:
    # compute-sanitizer's print limit counts the reports of its whole process: a session kept for a class (one a
    # tool for all its processes) printed the first few racy kernels' reports, then nothing, and every later
    # student's races went unseen there. Each run here is a student's, as a shared session runs them.
    stage_id, make = KERNELS[name]
    build = gpu_builder.build(get_stage(stage_id), KernelSource(make()))
    session = Worker("gpu", {}, Sandbox(True), launcher=launcher_of(sanitizer_tool, "racecheck"))
    found = []
    try:
        for _ in range(15):
            failed, lines = run_in(session, build, SANITIZER_CASES[Shape.SUM_1D], 256, lambda: gpu_gate(0, False))
            assert failed is None
            found.append(sorted((f.kind, f.line) for f in parse_report("racecheck", lines, {stage_id: build})[stage_id]))
            session.call(forget, timeout=60.0)  # what a shared session does after every run
            session.clear_log()
    finally:
        session.close()
    assert found[0] and all(seen == found[0] for seen in found), found


def test_a_race_report_names_a_few_partners_and_counts_the_rest() -> None:
    partners = [f"    and Write access at reduce_sequential(const float *, float *, unsigned int)+0x{i:x}0 in kernel.cu:{i} [4 hazards]"
                for i in range(2, 12)]
    block = ["Error: Race reported between Read access at reduce_sequential(const float *, float *, unsigned int)+0x190 in kernel.cu:16",
             *partners]
    found = parse_report("racecheck", block + [""] + block, {"sequential": located("sequential", 1)})["sequential"]
    assert len(found) == 1  # the same race reported twice is one finding
    assert "at line 2 and a write at line 3 and a write at line 4 and 7 more" in found[0].message
