"""A hand-in against compute-sanitizer's report (autograder/sanitizer.py): the kernel prints lines that look
like the tool's own, into the same output the grader reads the report from.

The worker here runs on the CPU backend (the kernel's printf reaches the worker's output as on a GPU) and is
started through a real launcher, a shell in the sandbox, that prints one genuine report first, as the tool
does. Forged lines must not crash the reader or hide the genuine report. All they can add is findings against
the author's own stages: every kernel a sanitizer run sees is the same student's, so forging only costs points.
"""

from __future__ import annotations

from autograder.build import Builder
from autograder.isolation import Worker
from autograder.records import KernelSource
from autograder.references import reference_source
from autograder.sanitizer import PREFIX, parse_report, sessions
from autograder.stages import get_stage
from autograder.verify import Case, run_case

GENUINE = "Error: Race reported between Read access at reduce_shuffle(const float *)+0x10 in kernel.cu:3"
FORGED = (
    "COMPUTE-SANITIZER",  # a banner, which ends the report before it
    "Error: Race reported between Read access at reduce_naive(x)+0x1 in kernel.cu:",  # no line number
    "    and",  # a partner line with nothing after it
    "Invalid __global__ read of size 4 bytes",  # a report that names no kernel
    "    at reduce_shuffle(const float *)+0x10 in kernel.cu:99999999999999999999",  # another stage's kernel
    "Error: Race reported between Write access at reduce_naive(const float *)+0x20 in kernel.cu:7",
    "ERROR SUMMARY: 0 errors",
)


def forging_kernel() -> str:
    prints = "".join(f'        printf("{PREFIX}{line}\\n");\n' for line in FORGED)
    text = reference_source("naive").text
    marker = "    if (tid == 0) {\n"
    assert marker in text
    return text.replace(marker, marker + prints, 1)


def test_forged_report_lines_cannot_hide_the_tools_report_or_accuse_another_kernel() -> None:
    launcher = ("/bin/sh", "-c", f'echo "{PREFIX}{GENUINE}"; exec "$@"', "launcher")
    with Worker("cpu", launcher=launcher) as worker:
        naive = Builder(worker.device, worker.sandbox).build(get_stage("naive"), KernelSource(forging_kernel()))
        worker.call(run_case, naive, Case((1000,), "integers", 1), 256, timeout=60)
        worker.shut_down()
        lines = worker.report_lines(PREFIX)
    assert lines[0] == GENUINE and "ERROR SUMMARY: 0 errors" in lines  # the kernel's printf did reach the output
    shuffle = Builder(worker.device, worker.sandbox).build(get_stage("shuffle"), reference_source("shuffle"))
    for tool in ("memcheck", "racecheck", "synccheck"):
        found = parse_report(tool, lines, {"naive": naive, "shuffle": shuffle})  # never raises
        if tool == "racecheck":
            # The genuine report stands, whatever was printed after it.
            assert [(f.kind, f.line) for f in found["shuffle"]] == [("race_syncthreads", 3)]
            assert {(f.kernel, f.line) for f in found["naive"]} == {("reduce_naive", None), ("reduce_naive", 7)}


def test_a_kernel_that_prints_is_sanitized_alone_so_it_can_accuse_only_itself() -> None:
    # Above, a printing naive kernel accused the shuffle stage in a shared report. Were they sanitized together,
    # a classmate with the same (reference) shuffle would read that finding from the class memo.
    spliced = reference_source("sequential").text.replace(
        "    if (tid == 0) {\n", '    if (tid == 0) {\n        pri\\\nntf("hidden by a line splice\\n");\n', 1
    )
    with Worker("cpu") as worker:  # compiled, so the spliced printf is one the compiler takes
        builder = Builder(worker.device, worker.sandbox)
        builds = {
            "naive": builder.build(get_stage("naive"), KernelSource(forging_kernel())),
            "sequential": builder.build(get_stage("sequential"), KernelSource(spliced)),
            "first_add": builder.build(get_stage("first_add"), reference_source("first_add")),
            "shuffle": builder.build(get_stage("shuffle"), reference_source("shuffle")),
        }
    assert [sorted(session) for session in sessions(builds)] == [["first_add", "shuffle"], ["naive"], ["sequential"]]


def test_a_flood_of_forged_report_lines_cannot_push_the_tools_report_out_of_reach() -> None:
    # 50,000 lines that look like the tool's but name no kernel (a kernel's printf can print that many in one
    # launch), then the tool's real report, then the worker.
    flood = f'yes "{PREFIX}Error: x" | head -n 50000; echo "{PREFIX}{GENUINE}"; exec "$@"'
    with Worker("cpu", launcher=("/bin/sh", "-c", flood, "launcher")) as worker:
        assert worker.device.backend == "cpu"  # the worker started through the launcher
        worker.shut_down()
        lines = worker.report_lines(PREFIX)
    shuffle = Builder(worker.device, worker.sandbox).build(get_stage("shuffle"), reference_source("shuffle"))
    found = parse_report("racecheck", lines, {"shuffle": shuffle})
    assert [(f.kind, f.line) for f in found["shuffle"]] == [("race_syncthreads", 3)]
