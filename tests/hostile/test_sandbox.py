"""Attacks on the grading host from kernel code, each a test that fails if the attack works.

Two layers are attacked. The source policy (autograder/policy.py) refuses most of these kernels before any
compiler sees them; the tests here that build with `build_shared_objects` skip the policy on purpose, so they
show what the sandbox itself stops when a kernel gets past the policy: static initialisers that run when the
worker loads the kernel, then calls into libc. A final test grades a class of attack hand-ins end to end and
checks that a clean student's result is the same as when graded alone.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import nbformat
import pytest
from escapes import try_to_escape, try_to_reach

from autograder import timing
from autograder.backends.cpu.compiler import _found_library, build_shared_objects, prepare_toolchain
from autograder.batch import grade_class
from autograder.errors import CompileError, KernelFault, KernelTimeout
from autograder.grade import GradeOptions
from autograder.isolation import Worker
from autograder.notebook import kernel_cell
from autograder.records import KernelSource, Status
from autograder.references import reference_source
from autograder.sandbox import COMPILE_LIMITS, TOOL_NICENESS, WORKER_LIMITS, Limits, Sandbox
from autograder.sessions import SessionHost
from autograder.stages import get_stage
from autograder.timing import publish_input
from autograder.verify import correctness_cases, make_input, run_case
from autograder.wire import encode_reply

NAIVE = get_stage("naive")
ROOT = Path(__file__).resolve().parents[2]
REFERENCE = reference_source("naive").text


def attack_kernel(prelude: str, output_expression: str = "0") -> str:
    """The reference naive kernel plus host code that runs when the worker loads the kernel library, and an
    output that adds `output_expression` (a global the attack set) to each block's partial sum."""
    store = "g_out[blockIdx.x] = sdata[0];"
    kernel = REFERENCE.replace(store, f"g_out[blockIdx.x] = sdata[0] + ({output_expression});")
    headers = "".join(f"#include <{name}>\n" for name in ("cstdio", "cstdlib", "unistd.h", "fcntl.h", "sys/time.h"))
    return f"{headers}{prelude}\n{kernel}"


def run_in_sandbox(text: str) -> tuple[float, float]:
    """Build `text` without the source policy, run it in a sandboxed worker: (value, expected)."""
    toolchain = prepare_toolchain()
    build = build_shared_objects(toolchain, NAIVE, KernelSource(text), Sandbox())
    case = correctness_cases(NAIVE, seed=7)[2]  # n=2 integers: exact
    expected = float(make_input(case).astype("float64").sum())
    with Worker("cpu") as worker:
        value, _, _ = worker.call(run_case, build, case, 256, timeout=60)
    return value, expected


def test_a_sandboxed_worker_runs_the_graders_runtime_wherever_the_grader_found_its_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On the GPU machine Boost's archive comes from a folder on LIBRARY_PATH, which a sandboxed worker neither sees
    # nor is told of. A worker that looked for the runtime itself found the library elsewhere, so named another
    # runtime, and tried to build it in a cache it sees read-only: no CPU worker started, no stage was graded.
    archive = Path(subprocess.run(["g++", "-print-file-name=libboost_context.a"], capture_output=True, text=True)
                   .stdout.strip())
    if not archive.is_absolute():
        pytest.skip("needs Boost.Context's static archive")
    library = tmp_path / "lib"
    library.mkdir()
    shutil.copy(archive, library)
    monkeypatch.setenv("LIBRARY_PATH", str(library))
    _found_library.cache_clear()
    try:
        case = correctness_cases(NAIVE, seed=7)[2]
        toolchain = prepare_toolchain("boost.context", tmp_path / "cache")
        build = build_shared_objects(toolchain, NAIVE, KernelSource(REFERENCE), Sandbox())
        with Worker("cpu", {"cache_dir": str(tmp_path / "cache"), "fibers": "boost.context"}) as worker:
            assert worker.device.name.startswith("CPU backend")
            value, _, _ = worker.call(run_case, build, case, 256, timeout=60)
        assert value == float(make_input(case).astype("float64").sum())
    finally:
        _found_library.cache_clear()  # the folder goes with tmp_path


def test_a_static_initialiser_cannot_write_files(tmp_path: Path) -> None:
    marker = tmp_path / "written"
    prelude = f"""
static int attack() {{
    FILE *f = fopen("{marker}", "w");
    if (!f) return 0;
    fputs("pwned", f);
    fclose(f);
    return 1000;
}}
static int attacked = attack();
"""
    value, expected = run_in_sandbox(attack_kernel(prelude, "attacked"))
    assert value == expected
    assert not marker.exists()


def test_a_running_worker_can_start_no_program_no_process_and_no_socket(tmp_path: Path) -> None:
    marker = tmp_path / "touched"
    with Worker("cpu", readable=(Path(__file__).parent,)) as worker:
        outcomes = worker.call(try_to_escape, str(marker), timeout=60)
    assert not marker.exists()
    assert outcomes["system"] != "allowed: 0"  # os.system reports a failed fork as a non-zero status
    for name in ("spawn", "fork", "socket", "socketpair"):
        assert outcomes[name].startswith("refused"), (name, outcomes[name])


def test_kernel_code_cannot_read_host_files(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("S")
    solution = ROOT / "solutions" / "reduction" / "kernels" / "shuffle.cu"
    prelude = f"""
static int leak(const char *path) {{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int c = fgetc(f);
    fclose(f);
    return c > 0 ? c : 1;
}}
static int leaked = leak("{secret}") + leak("{solution}") + leak("/root/.bashrc") + leak("{ROOT}/README.md");
"""
    value, expected = run_in_sandbox(attack_kernel(prelude, "leaked"))
    assert value == expected  # every fopen failed: nothing of the host reached the result


def test_kernel_code_cannot_touch_the_build_cache() -> None:
    runtime = prepare_toolchain().runtime
    before = hashlib.sha256(runtime.read_bytes()).hexdigest()
    prelude = f"""
static int escapes() {{
    int found = 0;
    if (open("{runtime}", O_WRONLY) >= 0) found += 100;
    if (open("{runtime.parent}/planted.so", O_WRONLY | O_CREAT, 0644) >= 0) found += 1000;
    return found;
}}
static int escaped = escapes();
"""
    value, expected = run_in_sandbox(attack_kernel(prelude, "escaped"))
    assert value == expected
    assert not (runtime.parent / "planted.so").exists()
    assert hashlib.sha256(runtime.read_bytes()).hexdigest() == before


def test_kernel_code_cannot_plant_a_timing_input_for_later_students(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The published timing input is trusted by its record: a kernel that could rewrite both would hand every later
    # student's timing values of its choosing (a sum it has learnt), and every grading process would believe them.
    monkeypatch.setenv("AUTOGRADER_CACHE_DIR", str(tmp_path))  # the worker is bound this cache's inputs folder
    published = publish_input(20261126, (4096,))
    assert published is not None
    path = published.path
    record = path.with_suffix(".json")
    before = (path.read_bytes(), record.read_text(), path.stat().st_mtime_ns)
    prelude = f"""
static int plants() {{
    int found = 0;
    if (open("{path}", O_WRONLY | O_TRUNC) >= 0) found += 10;
    if (open("{record}", O_WRONLY | O_TRUNC) >= 0) found += 100;
    if (open("{path.parent}/20261126-8192.json", O_WRONLY | O_CREAT, 0644) >= 0) found += 1000;
    if (rename("{path}", "{path.parent}/moved.npy") == 0) found += 10000;
    if (utimes("{path}", 0) == 0) found += 100000;  /* its stamp, which a worker trusts it by */
    return found;
}}
static int planted = plants();
"""
    value, expected = run_in_sandbox(attack_kernel(prelude, "planted"))
    assert value == expected  # every write failed
    assert (path.read_bytes(), record.read_text(), path.stat().st_mtime_ns) == before
    assert sorted(p.name for p in path.parent.iterdir()) == [".publishing", record.name, path.name]
    timing._PUBLISHED.clear()  # the next grading process still finds the grader's own input
    assert publish_input(20261126, (4096,)) == published


class _Pwn:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_forged_reply_frame_is_refused_and_never_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(("ok", _Pwn(marker)))
    frame = len(payload).to_bytes(4, "big") + payload
    data = ", ".join(str(b) for b in frame)
    prelude = f"""
static int forge() {{
    static const unsigned char frame[] = {{{data}}};
    for (int fd = 3; fd < 64; ++fd) write(fd, frame, sizeof frame);
    return 0;
}}
static int forged = forge();
"""
    with pytest.raises(KernelFault, match="invalid reply"):
        run_in_sandbox(attack_kernel(prelude))
    assert not marker.exists()


@pytest.mark.parametrize(
    "value", ["ab", (1.0,), (float("nan"), ("not a finding",)), (), (1.0, (), 2.0), (1.0, ()), (1.0, (), ["pass"])]
)
def test_a_forged_reply_of_valid_json_but_the_wrong_shape_is_a_fault_not_a_grader_failure(value) -> None:
    # Well-formed replies that the grader would unpack as (value, findings, wrong) and crash on, were only the records
    # in them checked.
    payload = encode_reply("ok", value)
    frame = len(payload).to_bytes(4, "big") + payload
    data = ", ".join(str(b) for b in frame)
    prelude = f"""
static int forge() {{
    static const unsigned char frame[] = {{{data}}};
    for (int fd = 3; fd < 64; ++fd) write(fd, frame, sizeof frame);
    return 0;
}}
static int forged = forge();
"""
    with pytest.raises(KernelFault, match="invalid reply to run_case"):
        run_in_sandbox(attack_kernel(prelude))


def test_the_runtime_api_and_process_functions_cannot_be_linked() -> None:
    # The names are built by token pasting, which a look at the source alone would not see.
    for name in ("ag_clear_findings", "system", "dlsym"):
        head, tail = name[:2], name[2:]
        declare = f'extern "C" void PASTE({head}, {tail})();\n' if name.startswith("ag_") else ""
        prelude = (
            f"#include <dlfcn.h>\n#define PASTE(a, b) a##b\n{declare}"
            f"static void *volatile p = (void *)&PASTE({head}, {tail});"
        )
        text = attack_kernel(prelude, "p ? 0.0f : 0.0f")
        with pytest.raises(CompileError, match=f"`{name}`"):
            build_shared_objects(prepare_toolchain(), NAIVE, KernelSource(text), Sandbox())


def test_a_compiler_that_eats_memory_or_hangs_is_stopped_with_its_whole_process_tree(tmp_path: Path) -> None:
    (tmp_path / "k.cu").write_text('#include "/dev/zero"\n')
    started = time.monotonic()
    result = Sandbox().run_tool(["g++", "-x", "c++", "-c", "k.cu"], tmp_path, timeout=60)
    assert result.returncode != 0 and time.monotonic() - started < 60
    with pytest.raises(KernelTimeout):
        Sandbox().run_tool(["sh", "-c", "sleep 97 & sleep 98 & wait"], tmp_path, timeout=1)
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", "sleep 9[78]"], capture_output=True, text=True).stdout
    assert left == ""


def test_a_tool_held_up_by_a_stalled_machine_runs_again_and_a_busy_one_does_not(tmp_path: Path) -> None:
    # A stall of the machine holds a compiler up as long as a loop in it does: a compile that runs past its limit
    # mostly idle runs once more with twice the time, and only a second timeout is the answer (a compile timeout
    # is a student's verdict). Here the machine stalls the tool's processes once, for good (SIGSTOP).
    marker = f"stall-{os.getpid()}-{time.monotonic_ns()}"
    stopped: list[int] = []

    def stall_once() -> None:
        deadline = time.monotonic() + 30
        while not stopped and time.monotonic() < deadline:
            found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
            if found:
                os.killpg(os.getpgid(int(found[0])), signal.SIGSTOP)
                stopped.append(int(found[0]))

    staller = threading.Thread(target=stall_once)
    staller.start()
    script = f"x={marker}; i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; echo done"
    result = Sandbox().run_tool(["sh", "-c", script], tmp_path, timeout=2)
    staller.join()
    assert stopped and result.returncode == 0 and result.stdout.strip() == "done"
    # A tool busy past its limit is not tried again (it would be given its CPU limit, which is longer); one
    # that waits idle is, and then it is a timeout.
    # Busy on a loaded machine too: four such tools at once on this project's two cores each run a third of the
    # time and wait for a core the rest, and none is tried again.
    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        busy = list(pool.map(lambda _: _timed_out(["sh", "-c", "while :; do :; done"], tmp_path, 2), range(4)))
    assert all("ran again" not in why for why in busy) and time.monotonic() - started < 10, busy
    with pytest.raises(KernelTimeout, match="1 s limit.*held up, so it ran again with 2 s, and ran past that too"):
        Sandbox().run_tool(["sh", "-c", "sleep 30"], tmp_path, timeout=1)


def _timed_out(argv: list[str], folder: Path, timeout: float) -> str:
    """Why `argv` was stopped at its time limit."""
    with pytest.raises(KernelTimeout) as caught:
        Sandbox().run_tool(argv, folder, timeout=timeout)
    return str(caught.value)


def _hard_limits(text: str) -> dict[str, str]:
    """The hard limits in a /proc/<pid>/limits text, by name: {"Max cpu time": "120", ...}."""
    return {match[1]: match[2] for match in re.finditer(r"^(Max [a-z ]+?) {2,}\S+ +(\S+)", text, re.MULTILINE)}


def _expected(limits: Limits) -> dict[str, str]:
    def shown(value: int | None) -> str:
        return "unlimited" if value is None else str(value)

    return {
        "Max cpu time": shown(limits.cpu_seconds), "Max file size": shown(limits.file_bytes),
        "Max address space": shown(limits.address_space), "Max data size": shown(limits.data),
        "Max open files": shown(limits.open_files), "Max core file size": "0",
    }


def test_a_compiler_and_a_worker_run_under_their_limits(tmp_path: Path) -> None:
    result = Sandbox().run_tool(["cat", "/proc/self/limits"], tmp_path, timeout=30)
    assert _hard_limits(result.stdout).items() >= _expected(COMPILE_LIMITS).items(), result.stdout + result.stderr
    log = tmp_path / "worker.log"
    ours, theirs = socket.socketpair()
    with ours, theirs:
        worker = Sandbox().start_worker(["cat", "/proc/self/limits"], log=log, channel=theirs, gpu=False)
        assert worker.wait(timeout=30) == 0
    assert _hard_limits(log.read_text()).items() >= _expected(WORKER_LIMITS).items(), log.read_text()


def test_a_compiler_cannot_take_back_the_priority_the_workers_have_over_it(tmp_path: Path) -> None:
    # Compilers run niced so that the workers holding the GPU get a core first; a process in the sandbox has
    # no right to raise its priority again (as root outside the sandbox, the same command does).
    result = Sandbox().run_tool(["sh", "-c", "renice -n 0 -p $$; nice"], tmp_path, timeout=30)
    assert int(result.stdout.split()[-1]) == min(os.nice(0) + TOOL_NICENESS, 19), result.stdout + result.stderr


def test_a_tool_past_its_cpu_or_file_size_limit_is_stopped(tmp_path: Path) -> None:
    tight = Limits(cpu_seconds=1, file_bytes=1 << 20)
    started = time.monotonic()
    spin = Sandbox().run_tool(["sh", "-c", "while :; do :; done"], tmp_path, timeout=30, limits=tight)
    assert spin.returncode != 0 and time.monotonic() - started < 20
    write = Sandbox().run_tool(["sh", "-c", "head -c 4M /dev/zero > big"], tmp_path, timeout=30, limits=tight)
    assert write.returncode != 0
    assert (tmp_path / "big").stat().st_size == 1 << 20


def test_a_worker_sees_no_home_no_checkout_no_host_tmp_and_no_network() -> None:
    with tempfile.NamedTemporaryFile(prefix="host-secret-") as secret:
        probe = (
            "import os, socket\n"
            f"print(os.path.exists({str(ROOT / 'solutions')!r}), os.path.exists(os.path.expanduser('~root/.bashrc')),"
            f" os.path.exists({secret.name!r}))\n"
            "try:\n socket.create_connection(('127.0.0.1', 22), timeout=1); print('net')\n"
            "except OSError: print('no net')\n"
        )
        result = subprocess.run(Sandbox().command([sys.executable, "-c", probe]), capture_output=True, text=True)
    assert result.stdout.split() == ["False", "False", "False", "no", "net"], result.stderr


@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_a_class_of_attacks_leaves_a_clean_students_result_unchanged(backend: str, tmp_path: Path) -> None:
    def notebook(path: Path, kernel: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nbformat.v4.new_notebook(cells=[kernel_cell("naive", kernel)]), path)

    marker = tmp_path / "marker"
    attacks = {
        "constructor": f'__attribute__((constructor)) static void boom() {{ system("touch {marker}"); }}\n{REFERENCE}',
        "include": f'#include "{ROOT}/solutions/reduction/kernels/shuffle.cu"\n{REFERENCE}',
        "runtime": 'extern "C" void ag_clear_findings();\n' + REFERENCE,
        "asm": REFERENCE.replace("unsigned int tid = threadIdx.x;", 'unsigned int tid = threadIdx.x; asm("nop");'),
    }
    alone, crowd = tmp_path / "alone", tmp_path / "crowd"
    notebook(alone / "zoe.ipynb", REFERENCE)
    notebook(crowd / "zoe.ipynb", REFERENCE)
    for name, kernel in attacks.items():
        notebook(crowd / f"{name}.ipynb", kernel)
    options = replace(GradeOptions(backend=backend, measure_speed=False, seed=11), quick=True)
    clean = grade_class(alone, tmp_path / "out-alone", options)
    graded = grade_class(crowd, tmp_path / "out-crowd", options)
    assert not marker.exists()
    by_student = {result.student: result for result in graded.results}
    for name in attacks:
        naive = by_student[name].stages[0]
        assert naive.status is Status.COMPILE_ERROR, (name, naive.message)
        assert naive.points.total == 0
    assert _grades(by_student["zoe"]) == _grades(clean.results[0])
    assert by_student["zoe"].isolation == "bubblewrap+seccomp"
    assert by_student["zoe"].device.backend == backend


def _grades(result) -> list:
    return [(s.stage, s.status, s.points, s.findings, tuple(c.passed for c in s.cases)) for s in result.stages]


def test_a_tampered_cache_artefact_is_never_loaded(tmp_path: Path) -> None:
    toolchain = prepare_toolchain(cache=tmp_path / "cache")
    first = build_shared_objects(toolchain, NAIVE, KernelSource(REFERENCE), Sandbox())
    (planted,) = (tmp_path / "cache").glob("k-*-fast.so")
    planted.write_bytes(b"\x7fELF planted by someone else")
    again = build_shared_objects(toolchain, NAIVE, KernelSource(REFERENCE), Sandbox())
    # Its hash did not match the manifest: it was built anew (a build records its temporary folder, so the
    # bytes differ from the first build's), and the cache holds the new build again.
    assert b"planted" not in again.file("fast.so") and len(again.file("fast.so")) > len(first.file("fast.so")) // 2
    assert planted.read_bytes() == again.file("fast.so")


def test_a_compiler_cannot_read_host_files_through_an_include(tmp_path: Path) -> None:
    secret = tmp_path / "secret.h"
    secret.write_text("#error SECRET-CONTENT\n")
    folder = tmp_path / "build"
    folder.mkdir()
    (folder / "k.cu").write_text(f'#include "{secret}"\n#include "/etc/passwd"\n#include "{ROOT}/README.md"\n')
    result = Sandbox().run_tool(["g++", "-x", "c++", "-E", "k.cu"], folder, timeout=60)
    assert result.returncode != 0
    assert "SECRET-CONTENT" not in result.stdout + result.stderr
    assert result.stderr.count("No such file or directory") >= 1


def test_a_static_initialiser_cannot_take_the_hosts_memory() -> None:
    # (mmap: malloc and new are refused at the link-time check, compiler.FORBIDDEN_IMPORT)
    prelude = """
#include <sys/mman.h>
static int hoard() {
    char *p = (char *)mmap(0, 64ULL << 30, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);  /* 64 GiB */
    if (p == (char *)MAP_FAILED) return 0;
    for (unsigned long long i = 0; i < (64ULL << 30); i += 4096) p[i] = 1;
    return 1000;
}
static int hoarded = hoard();
"""
    value, expected = run_in_sandbox(attack_kernel(prelude, "hoarded"))
    assert value == expected


def test_a_kernel_cannot_reach_the_classs_compute_sanitizer_sessions() -> None:
    # The class's sessions (autograder.sessions) take requests over a Unix socket of the grader's: a kernel that
    # got hold of libc, in a worker, neither sees it nor connects to it.
    with SessionHost(lambda tool, gpu: Worker("cpu"), ("memcheck",), (0,)) as host:
        with Worker("cpu", readable=(Path(__file__).parent,)) as worker:
            seen, reached = worker.call(try_to_reach, host.address.path, timeout=60)
        assert Path(host.address.path).exists()  # it is there, outside the sandbox
    assert not seen and reached.startswith("refused"), reached


def test_a_kernel_that_allocates_is_refused() -> None:
    """Memory from malloc or new is watched by no check: state kept there between launches would go unseen, and a
    kernel could use up the worker's address space until the checks cannot be made (review)."""
    store = "g_out[blockIdx.x] = sdata[0];"
    for allocation in ("malloc(64)", "new float[16]"):
        kept = f"{{ volatile float *p = (volatile float *){allocation}; p[0] = sdata[0]; {store} }}"
        code = REFERENCE.replace(store, kept)
        assert code != REFERENCE
        with pytest.raises(CompileError, match="which kernel code may not use"):
            build_shared_objects(prepare_toolchain(), NAIVE, KernelSource(code), Sandbox())
