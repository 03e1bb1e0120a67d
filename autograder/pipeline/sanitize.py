"""Phase 4, on the GPU: compute-sanitizer's memcheck, racecheck and synccheck over every stage that ran
(autograder.sanitizer), their findings joined with the CPU analysis's. Where the tool is not installed, each
stage's message says so. In a class a kernel source is sanitized once: what the tools see depends on the
source alone, so it is kept in the class memo by source.

A stage the CPU analysis or the output guards already caught straying out of a buffer is not sanitized: its
verdict is decided (undefined behaviour, pipeline.verdict), its stray access is already named on its line, and
under memcheck each such kernel would end its session (memcheck stops a kernel at its first bad access), a
CUDA context to make again for every such student. A kernel that crashed is sanitized, in sessions of the
student's own: memcheck names the access the crash left unexplained."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import replace

from autograder import sanitizer
from autograder.memo import StageMemo, grader_version
from autograder.pipeline.run import StudentRun
from autograder.pipeline.work import StageWork, joined
from autograder.records import StageResult, Status
from autograder.verify import hint

RAN = (Status.CORRECT, Status.INCORRECT, Status.CRASHED)
UNSAFE_KINDS = ("out_of_bounds", "output_guard")  # findings of writes or reads that may stray out of a buffer


def sanitize_stages(run: StudentRun, works: list[StageWork]) -> None:
    ran = [item for item in works if item.ran_as in RAN and not strayed(item)]
    if not ran or not run.on_gpu:
        return
    tool = sanitizer.find_sanitizer()
    if tool is None:
        for item in ran:
            note = "compute-sanitizer is not installed here: the GPU's own checks did not run"
            item.result = replace(item.result, message=f"{item.result.message} ({note})")
        return
    keys = {
        item.stage.id: StageMemo.key(
            "sanitizer", item.stage.id, item.source.text, item.source.placement(), run.rubric.block_size,
            run.worker.device, run.options.sandbox, grader_version(),
        )
        for item in ran
    }
    seen = _sanitized(run, ran, tool, keys)
    for item in ran:
        result = item.result
        findings = joined(result.findings, seen[item.stage.id].findings)
        advice = hint(item.stage, result.cases, run.rubric.block_size, findings) if result.hint else None
        message = "; ".join((result.message, *seen[item.stage.id].notes))
        item.result = replace(result, findings=findings, hint=advice, message=message)


def strayed(item: StageWork) -> bool:
    """Whether a stage's kernel was caught reading or writing out of a buffer."""
    return any(f.kind in UNSAFE_KINDS for f in item.result.findings)


def unsafe(item: StageWork) -> bool:
    """Whether a stage's kernel is not known to be memory-safe: it crashed, hung, or may have written out of a
    buffer. A kernel seen only reading out of bounds is safe in this sense: a read changes no memory."""
    return item.ran_as in (Status.CRASHED, Status.TIMEOUT) or writes_astray(item.result)


def writes_astray(result: StageResult) -> bool:
    """Whether a stage's kernel was seen writing, or perhaps writing, out of a buffer."""
    return any(f.kind in UNSAFE_KINDS and not f.reads_only for f in result.findings)


def _sanitized(
    run: StudentRun, ran: list[StageWork], tool: str, keys: Mapping[str, str]
) -> dict[str, sanitizer.Sanitized]:
    """What the tools saw in each stage: from the memo where it was kept, else run now (and kept)."""
    memo = run.memo

    def kept() -> dict[str, sanitizer.Sanitized]:
        found = {item.stage.id: memo.get(keys[item.stage.id], sanitizer.Sanitized) for item in ran} if memo else {}
        return {stage_id: seen for stage_id, seen in found.items() if seen is not None}

    seen = kept()
    missing = [keys[item.stage.id] for item in ran if item.stage.id not in seen]
    with memo.claim(missing) if memo is not None and missing else nullcontext():
        seen = kept()  # a student graded at the same time may have run them while this one waited
        todo = [item for item in ran if item.stage.id not in seen]
        if not todo:
            return seen
        with run.shared_phase("sanitizer", todo):
            fresh = sanitizer.sanitize(
                {item.stage.id: item.build for item in todo},
                tool,
                run.workers.session,
                {item.stage.id for item in todo if unsafe(item)},
                run.rubric.block_size,
                lambda: run.gate(exclusive=False),
            )
        for stage_id, found in fresh.items():
            seen[stage_id] = found
            if memo is not None and not found.notes:  # a tool that could not finish is tried again
                memo.put(keys[stage_id], found)
    return seen
