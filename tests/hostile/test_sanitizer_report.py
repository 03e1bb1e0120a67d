"""A hand-in against compute-sanitizer's report (autograder/sanitizer.py): the kernel prints lines that look
like the tool's own, into the same output the grader reads the report from.

The worker here runs on the CPU backend (the kernel's printf reaches the worker's output as on a GPU) and is
started through a real launcher, a shell in the sandbox, that prints one genuine report first, as the tool
does. Forged lines must not crash the reader or hide the genuine report. All they can add is findings against
the author's own stages: every kernel a sanitizer run sees is the same student's, so forging only costs points.
"""

from __future__ import annotations

from contextlib import nullcontext

from autograder.build import Builder
from autograder.isolation import Worker
from autograder.records import KernelSource
from autograder.references import reference_source
from autograder.sanitizer import PREFIX, REPORT_LINES, SANITIZER_CASES, parse_report, run_in, sanitize
from autograder.stages import Shape, get_stage
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


def test_a_kernel_is_accused_only_by_what_was_written_during_its_own_call() -> None:
    # Quiet kernels share a session, in a class one that serves many students: the report written while a kernel
    # ran is that kernel's. A kernel that prints gets a session of its own (its printf could reach the output
    # after its call), so the lines it forges can accuse only itself, never a classmate's identical kernel
    # through the class memo. Here racecheck is a launcher that writes one genuine report naming the shuffle
    # kernel when it starts, which it does during the first call it serves; the other tools report nothing.
    spliced = reference_source("sequential").text.replace(
        "    if (tid == 0) {\n", '    if (tid == 0) {\n        pri\\\nntf("hidden by a line splice\\n");\n', 1
    )
    racecheck = ("/bin/sh", "-c", f'echo "{PREFIX}{GENUINE}"; exec "$@"', "launcher")
    racecheck = ("/bin/sh", "-c", f'echo "{PREFIX}{GENUINE}"; exec "$@"', "launcher")
    sessions: dict[tuple[str, str], Worker] = {}
    asked: list[tuple[str, str]] = []

    def session(tool: str, _: tuple[str, ...], how: str) -> Worker:
        asked.append((tool, how))
        if how == "alone" or (tool, how) not in sessions:
            sessions[tool, how] = Worker("cpu", launcher=racecheck if tool == "racecheck" else ())
        return sessions[tool, how]

    with Worker("cpu") as worker:  # compiled, so the spliced printf is one the compiler takes
        builder = Builder(worker.device, worker.sandbox)
        builds = {
            "naive": builder.build(get_stage("naive"), KernelSource(forging_kernel())),
            "sequential": builder.build(get_stage("sequential"), KernelSource(spliced)),
            "shuffle": builder.build(get_stage("shuffle"), reference_source("shuffle")),
            "max2d": builder.build(get_stage("max2d"), reference_source("max2d")),
        }
        classmate = builder.build(get_stage("shuffle"), KernelSource(reference_source("shuffle").text + "// mine\n"))
    try:
        seen = sanitize(builds, "compute-sanitizer", session, {"max2d"}, 256, nullcontext)
        # The next student's shuffle kernel, of the same name, in the same shared sessions: nothing against it.
        later = sanitize({"shuffle": classmate}, "compute-sanitizer", session, set(), 256, nullcontext)
    finally:
        for each in sessions.values():
            each.close()
    def hows(tool: str) -> list[str]:  # the tools run at once, each over the stages in order
        return [how for asker, how in asked[:12] if asker == tool]

    assert hows("memcheck") == ["alone"] * 2 + ["shared"] * 2
    # max2d is not known to be memory-safe: racecheck and synccheck run it in a session of the student's own.
    assert hows("racecheck") == hows("synccheck") == ["alone", "alone", "shared", "student"]
    # The shuffle kernel ran first in the shared racecheck session, while the genuine report was written.
    assert [(f.kind, f.line) for f in seen["shuffle"].findings] == [("race_syncthreads", 3)]
    assert later["shuffle"].findings == ()
    assert seen["max2d"].findings == seen["sequential"].findings == ()
    # The forging kernel's own lines stand against it alone; those naming the shuffle kernel count for nothing.
    assert {f.kernel for f in seen["naive"].findings} == {"reduce_naive"}


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


def test_a_flood_of_reports_ends_the_session_and_is_read_only_in_part() -> None:
    # Every report is printed (PRINT_LIMIT), so a kernel built to make the tool print megabytes must neither stall
    # the grading process that reads them nor leave any for a later run, a classmate's, to read as its own.
    report = f"{PREFIX}Warning: Race reported between Read access at reduce_shuffle(int)+0x10 in kernel.cu:3"
    flood = ("/bin/sh", "-c", f'yes "{report}" | head -n 40000; exec "$@"', "launcher")  # about 4 MB
    with Worker("cpu") as worker:
        build = Builder(worker.device, worker.sandbox).build(get_stage("shuffle"), reference_source("shuffle"))
    session = Worker("cpu", launcher=flood)
    try:
        failed, lines = run_in(session, build, SANITIZER_CASES[Shape.SUM_1D], 256, nullcontext)
        assert failed is None and len(lines) == REPORT_LINES
        assert not session.alive  # ended: its next run starts a fresh one, with an output of its own
    finally:
        session.close()
    assert [(f.kind, f.line) for f in parse_report("racecheck", lines, {"shuffle": build})["shuffle"]] == [
        ("race_syncwarp", 3)
    ]
