"""The GPU's own checker: compute-sanitizer's memcheck, racecheck and synccheck over a small input of every
stage, in the same sandbox as every worker.

Each tool runs every stage of the student once on a small input (`SANITIZER_CASES`), in buffers without guard
tails so that memcheck sees any access past the end, in sandboxed workers started under `compute-sanitizer
--tool T`: in a class, sessions that serve many students one after another (`sanitize` says which kernels may
share one). What the tool printed is data: only its own report lines (`=========`) are read, each error becomes
a Finding of the same kinds the CPU analysis reports, attributed to the stage whose call it was written during,
and to a line of the notebook cell by the cubin's line table (`-lineinfo`).

What each checker sees (measured on an H200, CUDA 13.0; tests/test_sanitizer.py):
- memcheck: global and shared accesses outside an allocation (`out_of_bounds`). The CPU analysis sees the
  same, and also a read past `n` that stays inside the guard tail of a graded run.
- racecheck: shared-memory races. "Error" hazards between warps (`race_syncthreads`); "Warning" hazards
  within a warp, such as an unrolled last warp without `__syncwarp` (`race_syncwarp`).
- synccheck: invalid barrier use. It does NOT report a `__syncthreads()` that part of a block skips when the
  skipping threads have exited or never reach another barrier (the textbook `if (tid < s) { ...;
  __syncthreads(); }`): it gives the right sum on an H200 and 0 errors, while the CPU analysis reports
  `barrier_divergence`.
- None of them sees races between blocks on global memory (`g_out[0] = ...` from every block); the CPU
  analysis reports `race_interblock`.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Callable, Mapping, Set
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autograder.errors import KernelFault, KernelTimeout
from autograder.isolation import Worker
from autograder.pipeline.work import collect
from autograder.records import Build, Finding
from autograder.stages import Shape, get_stage
from autograder.verify import Case, sanitized_run

if TYPE_CHECKING:
    from autograder.sessions import RemoteSession

TOOLS = ("memcheck", "racecheck", "synccheck")
# Small inputs: several blocks, the last one partial, so bounds and every round of the tree are exercised.
SANITIZER_CASES = {Shape.SUM_1D: Case((1000,), "random", 7), Shape.MAX_2D: Case((37, 29), "random", 7)}
SECONDS_PER_RUN = 120.0
# compute-sanitizer's --print-limit counts the reports of its whole process, not of a run: with a limit of 20, a
# session kept for a class printed a few racy kernels' reports and then none, and every later student's kernel was
# sanitized blind (and a student's first racy stage silenced its later ones). 0 is no limit: what one run reports
# is bounded by its small input (SANITIZER_CASES) and the worker's output limit, and a shared session's output is
# emptied after every run (autograder.sessions).
PRINT_LIMIT = 0
# What one run may report. The first REPORT_LINES lines are read, which name every line a kernel races or strays on
# (a racy unrolled warp prints 40); a run that wrote more than REPORT_BYTES (a kernel built to flood the report)
# ends its session, whose report is then read once its process has ended, so that no part of it can land in a
# later run's lines, a classmate's.
REPORT_LINES = 2000
REPORT_BYTES = 1 << 20
PREFIX = "========= "
PARTNERS = 3  # accesses a race report names beside the first


@dataclass(frozen=True)
class Sanitized:
    """What the tools saw in one stage's kernel, and a note for each tool that could not finish on it."""

    findings: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()


def find_sanitizer() -> str | None:
    """compute-sanitizer on the PATH, or beside nvcc in the CUDA toolkit; None where it is not installed."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    nvcc = shutil.which("nvcc")
    if nvcc:
        beside = Path(nvcc).resolve().parent.parent / "compute-sanitizer" / "compute-sanitizer"
        if os.access(beside, os.X_OK):
            return str(beside)
    return None


# (tool, launcher, how it is shared) -> a worker, or a session the class's processes share (autograder.sessions)
Session = Callable[[str, tuple[str, ...], str], "Worker | RemoteSession"]


def sanitize(
    builds: Mapping[str, Build],
    sanitizer: str,
    session: Session,
    unsafe: Set[str],
    block_size: int,
    gate: Callable[[], AbstractContextManager[None]],
) -> dict[str, Sanitized]:
    """Run each tool over every stage's build (stage id -> GPU build), each run inside `gate()`: the GPU shared
    as correctness runs share it (never while it times). Never raises for what a kernel does.

    Each kernel runs in the session `session(tool, launcher, how)` gives, `how` being one of SHARING:
    - "shared": a session that other students' kernels use too (autograder.executors; on a local cluster one a
      tool and GPU for all its processes, autograder.sessions), for a kernel that cannot
      print and is known to be memory-safe; memcheck takes every kernel that cannot print, since it stops a
      kernel at its first access outside an allocation. Its report is read as soon as its call returns, and
      only what was written during the call counts for the kernel: the tool has printed a kernel's report by
      then (measured on an H200, also right after memcheck stopped a kernel).
    - "student": a session of this student's alone, for a kernel in `unsafe` (it crashed on another checker, or
      memcheck here caught it outside an allocation): racecheck and synccheck do not stop its stray writes,
      which must not land in a session that serves later students. So does every kernel of a student after one
      of its kernels could not finish in a shared session (`_sharing`).
    - "alone": a session of the kernel's own, for a kernel that can print: its printf reaches the same output
      as the tool's report, and not always before its call returns, so its report is read once its process has
      ended, and a printed report line can only accuse the kernel that printed it (never another stage, nor,
      through the class memo, a classmate's identical kernel).

    The tools run at once, each over the stages in order: racecheck and synccheck run a stage once memcheck has
    run it, since a kernel memcheck catches is not memory-safe for them. A student's phase then takes about one
    tool's runs, not three tools' one after another; its verdicts are the same in any order of the runs, as
    each run's report is read on its own and joined in TOOLS order.
    """
    unsafe = set(unsafe)
    stopped = threading.Event()  # a kernel of this student could not finish in a shared session
    memchecked = {stage_id: threading.Event() for stage_id in builds}
    failed_tool = threading.Event()  # a tool raised: the phase fails, and no other tool runs another kernel

    def each_stage(tool: str) -> dict[str, tuple[list[Finding], str | None]]:
        launcher = launcher_of(sanitizer, tool)
        seen_by_stage: dict[str, tuple[list[Finding], str | None]] = {}
        for stage_id, build in builds.items():
            if tool != "memcheck":
                memchecked[stage_id].wait()  # set early where memcheck raised: then failed_tool is set
            if failed_tool.is_set():
                break
            how = _sharing(tool, build, stage_id in unsafe, stopped.is_set())
            where = session(tool, launcher, how)
            case = SANITIZER_CASES[get_stage(stage_id).shape]
            if isinstance(where, Worker):
                failed, lines = run_in(where, build, case, block_size, gate)
            else:  # a session of the class's, in the process that runs it (autograder.sessions)
                failed, lines = where.run(build, case, block_size, gate)
            seen = parse_report(tool, lines, {stage_id: build}).get(stage_id, [])
            note = f"compute-sanitizer {tool} could not finish on this kernel ({failed[:160]})" if failed else None
            seen_by_stage[stage_id] = seen, None if seen else note
            if failed and not seen and how == "shared":  # a hang, not memcheck's stop
                stopped.set()
            if tool == "memcheck":  # what the other tools wait for, after all it decides
                if failed or seen:
                    unsafe.add(stage_id)
                memchecked[stage_id].set()
        return seen_by_stage

    def tool_run(tool: str) -> dict[str, tuple[list[Finding], str | None]]:
        try:
            return each_stage(tool)
        except BaseException:
            failed_tool.set()
            raise
        finally:
            if tool == "memcheck":
                for event in memchecked.values():
                    event.set()  # the other tools wait no longer: they stop where memcheck raised

    with ThreadPoolExecutor(max_workers=len(TOOLS), thread_name_prefix="sanitizer") as pool:
        futures = [pool.submit(tool_run, tool) for tool in TOOLS]
        by_tool = [future.result() for future in futures]
    return {
        stage_id: Sanitized(
            tuple(finding for seen in by_tool if stage_id in seen for finding in seen[stage_id][0]),
            tuple(seen[stage_id][1] for seen in by_tool if stage_id in seen and seen[stage_id][1]),
        )
        for stage_id in builds
    }


def run_in(
    worker: Worker, build: Build, case: Case, block_size: int, gate: Callable[[], AbstractContextManager[None]]
) -> tuple[str | None, list[str]]:
    """Run a kernel once in a session: why it could not finish (None where it did), and the tool's report lines
    written during the run, no earlier ones. A kernel that can print ends its session, so that all its output,
    and the tool's report, is written before the lines are read."""
    start = worker.log_size()
    failed = None
    try:
        worker.start()  # outside the gate: a session starting takes seconds, which a timing must not wait
        with gate():
            worker.call(sanitized_run, build, case, block_size, timeout=SECONDS_PER_RUN)
    except (KernelTimeout, KernelFault) as error:
        # memcheck stops a kernel at its first bad access: the fault is expected, the report says why.
        failed = str(error).splitlines()[0]
    if can_print(build) or worker.log_size() - start > REPORT_BYTES:
        worker.shut_down(wait=60.0)
    return failed, worker.report_lines(PREFIX, start, REPORT_LINES)


def launcher_of(sanitizer: str, tool: str) -> tuple[str, ...]:
    """How a worker is started under `tool`: the program and options before the worker's own command."""
    return (sanitizer, "--tool", tool, "--print-limit", str(PRINT_LIMIT), "--check-exit-code", "no")


def _sharing(tool: str, build: Build, unsafe: bool, stopped: bool) -> str:
    """How a kernel's session is shared. Once one of its student's kernels `stopped` a shared session, finishing
    with no report from the tool (a hang, up to SECONDS_PER_RUN, holds up every student waiting for the session;
    memcheck stopping a kernel at a bad access reports it), the student's other kernels run in sessions of its
    own: a student can hold up each of the class's sessions once at most (racecheck's and synccheck's at the
    same time, as they run at once), not once a stage and tool. A hang under memcheck sends the stage to the
    student's own sessions of the other tools, which run a stage after memcheck."""
    if can_print(build):
        return "alone"
    return "student" if stopped or (unsafe and tool != "memcheck") else "shared"


def can_print(build: Build) -> bool:
    """Whether a kernel may print: its source names printf (once lines ended by a backslash are joined, as the
    compiler joins them), or its binary calls the device's vprintf."""
    joined = re.sub(r"\\[ \t\r]*\n", "", build.source.text)
    return "printf" in joined or any(b"vprintf" in data for _, data in build.files)


# "at reduce_sequential(const float *, float *, unsigned int)+0xc0 in kernel.cu:9"
_AT = re.compile(r"\bat (?P<function>.+?)\+0x[0-9a-f]+ in (?P<file>[^\s:]+)(?::(?P<line>\d+))?")
_THREAD = re.compile(r"by thread \((?P<thread>[\d,]+)\) in block \((?P<block>[\d,]+)\)")
_RACE = re.compile(
    r"^(?P<severity>Error|Warning): Race reported between (?P<first>\w+) access at (?P<at>.+)$"
)
_HAZARDS = re.compile(r"\[(\d+) hazards?\]")
_BEYOND = re.compile(r"bytes? (?P<side>after|before) the nearest allocation at \S+ of size (?P<size>\d+)")
# Lines that are not a report of their own: banners, summaries and the host API errors a report causes.
_NOT_REPORTS = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "Program hit", "Target application")


def parse_report(tool: str, lines: list[str], builds: Mapping[str, Build]) -> dict[str, list[Finding]]:
    """The findings in one tool's report lines (without the prefix), by stage."""
    names = {get_stage(stage_id).kernel_name: stage_id for stage_id in builds}
    found: dict[str, dict[tuple, Finding]] = {}
    for block in _blocks(lines):
        stage_id = _stage_of(block, names)
        if stage_id is None:
            continue  # a report about no kernel of this student's (the grader's own code, say)
        finding = _finding(tool, block, get_stage(stage_id).kernel_name, builds[stage_id].source.cell_line)
        if finding is not None:  # one a kind and line, as the stage keeps them
            collect(found.setdefault(stage_id, {}), (finding,))
    return {stage_id: list(seen.values()) for stage_id, seen in found.items()}


def _blocks(lines: list[str]) -> list[list[str]]:
    """Reports: a header line (no indent), then its indented lines, up to the next line without an indent."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in lines:
        if not line.strip():
            continue
        if line.startswith(" "):
            if current is not None:
                current.append(line.strip())
        elif line.startswith(_NOT_REPORTS):
            current = None  # a banner or a summary ends the report before it
        else:
            current = [line]
            blocks.append(current)
    return blocks


def _stage_of(block: list[str], names: Mapping[str, str]) -> str | None:
    """The stage whose kernel the report is in, from the first `at` frame that names one."""
    for match in filter(None, map(_AT.search, block)):
        for name, stage_id in names.items():
            if re.search(rf"\b{re.escape(name)}\b", match.group("function")):
                return stage_id
    return None


def _source_line(text: str) -> int | None:
    match = _AT.search(text)
    return int(match.group("line")) if match and match.group("line") else None


def _finding(
    tool: str, block: list[str], kernel: str, cell_line: Callable[[int | None], int | None]
) -> Finding | None:
    """One report (its header line, then the lines under it) as a Finding; its lines are the notebook cell's."""
    header = block[0]
    thread_match = next((m for m in map(_THREAD.search, block) if m), None)
    thread = f"block ({thread_match['block']}) thread ({thread_match['thread']})" if thread_match else None
    line = cell_line(_source_line(header) or next(filter(None, map(_source_line, block)), None))
    at_line = f" at line {line}" if line else ""
    if tool == "memcheck":
        message = f"compute-sanitizer memcheck: {header[0].lower()}{header[1:]}{at_line}"
        beyond = next((m for m in map(_BEYOND.search, block) if m), None)
        if beyond is not None:
            end = "past the end" if beyond["side"] == "after" else "before the start"
            message += f", {end} of a {beyond['size']}-byte buffer"
        return Finding("out_of_bounds", message, line, thread, kernel)
    if tool == "racecheck":
        race = _RACE.match(header)
        if race is None:
            return None
        partners = [
            f"a {text.split()[1].lower()}" + (f" at line {cell_line(_source_line(text))}" if _source_line(text) else "")
            for text in block[1:]
            if text.startswith("and ")
        ]
        more = len(partners) - PARTNERS
        partners = " and ".join(partners[:PARTNERS]) + (f" and {more} more" if more > 0 else "")
        hazards = sum(int(n) for n in _HAZARDS.findall(" ".join(block)))
        within_warp = race["severity"] == "Warning"
        kind = "race_syncwarp" if within_warp else "race_syncthreads"
        scope = "between lanes of one warp" if within_warp else "between warps"
        message = (
            f"compute-sanitizer racecheck: shared-memory race {scope}, a {race['first'].lower()}{at_line} against "
            f"{partners or 'another access'} ({hazards} hazards on a small input)"
        )
        return Finding(kind, message, line, thread, kernel)
    if tool == "synccheck":
        return Finding("barrier_divergence", f"compute-sanitizer synccheck: {header}{at_line}", line, thread, kernel)
    return None
