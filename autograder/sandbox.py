"""The trust boundary: every native execution of student-derived code starts here.

A hand-in's kernel source is compiled by g++ or nvcc and run by a worker process. Each of those processes
is started by this module inside bubblewrap (an existing sandbox tool) with a seccomp filter and resource
limits. What a hand-in can do is what this file allows:

- **See**: the system's read-only folders (`SYSTEM_PATHS`), the Python installation and the grader's package
  (read-only), its own build folder (a compile) or nothing of the grader's at all (a worker). Never the home
  folder, the grader's checkout, `solutions/`, the submissions, the results or a writable cache.
- **Write**: a private, empty `/tmp` that vanishes with it, and its own build folder when compiling.
- **Reach**: nothing. No network (its own network namespace), its own PID namespace (it cannot see or signal
  the grader), and the seccomp filter below refuses the system calls that could leave the sandbox.
- **Outlive the grader**: no. It dies with its parent (`--die-with-parent`), and when the sandbox's first
  process dies the kernel ends every process in its PID namespace.
- **Use**: at most `Limits` of CPU time, memory, file size and open files, set by util-linux's `prlimit`, the
  first program of the process tree, which then starts bubblewrap (`_limited`); a compiler or tool runs at a
  lower CPU priority than the workers (`_in_background`).

A worker tightens this once it has started (`restrict_worker`): no new programs, no new processes, no sockets.

Where the sandbox cannot start (no bubblewrap, no user namespaces, no libseccomp, no prlimit), `require` raises
SandboxUnavailable with what to install; nothing falls back to running unsandboxed unless the caller asked
for that explicitly (`autograder grade --no-sandbox`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from autograder.errors import GraderError, KernelTimeout

SANDBOXED = "bubblewrap+seccomp"
UNSANDBOXED = "none (--no-sandbox)"

# Folders every sandboxed process may read. Symlinks among them (merged /usr) are recreated as symlinks.
SYSTEM_PATHS = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/opt/cuda",
)
PACKAGE_DIR = Path(__file__).resolve().parent
FIX = (
    "install bubblewrap, libseccomp and util-linux's prlimit (Debian/Ubuntu: scripts/install-system-packages.sh, "
    "or `apt-get install bubblewrap util-linux` and `pip install pyseccomp`; conda: `conda install -c conda-forge "
    "bubblewrap libseccomp`) on a kernel that allows user namespaces, or pass --no-sandbox to grade trusted code "
    "only"
)

# System calls no sandboxed process needs, each of which could reach past the sandbox or the grader.
DENIED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "pidfd_open",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsmount", "fsconfig",
    "unshare", "setns", "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon",
    "swapoff", "acct", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm",
    "open_by_handle_at", "name_to_handle_at", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "syslog", "quotactl", "lookup_dcookie", "vhangup", "personality", "uselib", "nfsservctl",
)
# What a worker gives up once it is running: it runs kernels, it starts nothing.
WORKER_DENIED_SYSCALLS = ("execve", "execveat", "fork", "vfork", "socketpair")
# Set for every sandboxed program and every worker, sandboxed or not. A math library's thread pool (numpy's BLAS,
# OpenMP) starts a thread a core at import, each spinning a while before it sleeps: 2.3 core-seconds a worker on
# a 16-core GPU machine, the largest share of a class's CPU (README, "Large classes"), and a worker runs kernels,
# not linear algebra. Dask sets the same in the grading processes; the sandbox's empty environment had lost it.
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class SandboxUnavailable(GraderError):
    """Student code was to run sandboxed, and the sandbox cannot start here."""


@dataclass(frozen=True)
class Limits:
    """Resource limits (setrlimit) of one sandboxed process tree."""

    cpu_seconds: int
    file_bytes: int
    address_space: int | None = None  # RLIMIT_AS: compilers. CUDA reserves far more address space than it uses
    data: int | None = None  # RLIMIT_DATA: workers (counts writable private memory, not CUDA's reservations)
    open_files: int = 1024


COMPILE_LIMITS = Limits(cpu_seconds=120, file_bytes=256 << 20, address_space=4 << 30)
WORKER_LIMITS = Limits(cpu_seconds=3600, file_bytes=64 << 20, data=16 << 30)


@dataclass(frozen=True)
class Sandbox:
    """Whether student-derived code runs sandboxed. `Sandbox(False)` is the TA's explicit --no-sandbox."""

    enabled: bool = True

    @property
    def label(self) -> str:
        """How a result was isolated, as recorded in it."""
        return SANDBOXED if self.enabled else UNSANDBOXED

    def require(self) -> None:
        """Raise SandboxUnavailable if the sandbox is wanted and cannot start."""
        if self.enabled:
            problem = _unavailable_reason()
            if problem:
                raise SandboxUnavailable(f"the sandbox for student code cannot start: {problem}; {FIX}")

    def command(
        self,
        argv: Sequence[str],
        *,
        writable: Path | None = None,
        readable: Sequence[Path] = (),
        gpu: bool = False,
        seccomp_fd: int | None = None,
    ) -> list[str]:
        """`argv` wrapped in bubblewrap: read-only system, `writable` (the working folder) read-write."""
        if not self.enabled:
            return list(argv)
        args = [
            _bwrap(), "--unshare-all", "--die-with-parent", "--new-session",
            "--uid", "65534", "--gid", "65534", "--hostname", "sandbox",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--clearenv",
            "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/tmp",
            "--setenv", "LANG", "C.UTF-8", "--setenv", "TMPDIR", "/tmp",
            # Only the package itself is bound of the folder that holds it (a checkout holds solutions/ too).
            "--setenv", "PYTHONPATH", str(PACKAGE_DIR.parent),
        ]
        for name, value in ONE_THREAD.items():
            args += ["--setenv", name, value]
        for path in (*SYSTEM_PATHS, *_python_paths(), *_tool_paths(), *map(str, readable)):
            args += _bind_args(path)
        if gpu:
            args += ["--ro-bind-try", "/sys", "/sys"]
            for node in sorted(Path("/dev").glob("nvidia*")):
                args += ["--dev-bind", str(node), str(node)]
            for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
                if name in os.environ:
                    args += ["--setenv", name, os.environ[name]]
        if writable is not None:
            args += ["--bind", str(writable), str(writable), "--chdir", str(writable)]
        else:
            args += ["--chdir", "/tmp"]
        args += ["--remount-ro", "/"]  # the folders made for the binds above: only /tmp and `writable` stay writable
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        return [*args, "--", *argv]

    def run_tool(
        self,
        argv: Sequence[str],
        workdir: Path,
        timeout: float,
        limits: Limits = COMPILE_LIMITS,
        readable: Sequence[Path] = (),
    ) -> subprocess.CompletedProcess[str]:
        """Run a compiler (or another tool over student-derived files) in `workdir`, the only folder it may
        write, within `timeout` seconds. Its whole process tree is killed on timeout. A tool that for most of its
        time neither ran nor waited for a core was held up by the machine (a stall in the kernel, say), not kept
        busy by a student's source: it runs once more, with twice the time, and only a second timeout is the
        answer. One that ran, or waited its turn on a loaded machine, is not tried again: a source made to keep
        the compiler busy costs its limit once, and the CPU time each process may take (`limits`, more than
        `timeout`) never decides in its place."""
        try:
            return self._run_tool(argv, workdir, timeout, limits, readable)
        except ToolTimeout as error:
            if error.active_seconds >= timeout / 2:
                raise
            first = error
        try:
            return self._run_tool(argv, workdir, 2 * timeout, limits, readable)
        except ToolTimeout:
            again = f"{first}; it had been held up, so it ran again with {2 * timeout:g} s, and ran past that too"
            raise ToolTimeout(again, 0.0) from None

    def _run_tool(
        self, argv: Sequence[str], workdir: Path, timeout: float, limits: Limits, readable: Sequence[Path]
    ) -> subprocess.CompletedProcess[str]:
        self.require()
        with self._filter() as seccomp_fd:
            command = self.command(argv, writable=workdir, readable=readable, seccomp_fd=seccomp_fd)
            process = subprocess.Popen(
                _in_background(_limited(command, limits)),
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
                pass_fds=() if seccomp_fd is None else (seccomp_fd,),
                start_new_session=True,
            )
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            active = active_seconds(processes_under(process.pid), waiting=True)
            kill_group(process)
            why = f"{Path(argv[0]).name} ran past its {timeout:g} s limit and was stopped"
            raise ToolTimeout(why, active) from None
        finally:
            kill_group(process)
        return subprocess.CompletedProcess(list(argv), process.returncode, out, err)

    def start_worker(
        self, argv: Sequence[str], *, log: Path, channel: socket.socket, gpu: bool, readable: Sequence[Path] = ()
    ) -> subprocess.Popen[bytes]:
        """Start a worker process that talks over `channel` and writes its output to `log`. From any thread: the
        process is started by the grader's starting thread (`_STARTER`), so it outlives the caller's thread."""
        self.require()
        return _STARTER.submit(self._start_worker, argv, log, channel, gpu, readable).result()

    def _start_worker(
        self, argv: Sequence[str], log: Path, channel: socket.socket, gpu: bool, readable: Sequence[Path]
    ) -> subprocess.Popen[bytes]:
        with self._filter() as seccomp_fd, open(log, "ab") as output:
            fds = (channel.fileno(),) if seccomp_fd is None else (channel.fileno(), seccomp_fd)
            return subprocess.Popen(
                _limited(self.command(argv, readable=readable, gpu=gpu, seccomp_fd=seccomp_fd), WORKER_LIMITS),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env={**os.environ, **ONE_THREAD},  # the sandbox's own environment where it is on (`command`)
                pass_fds=fds,
                start_new_session=True,
            )

    def _filter(self) -> AbstractContextManager[int | None]:
        return _seccomp_program(self.enabled)


# The thread that starts every worker. `--die-with-parent` ends a process when the *thread* that started it ends
# (the kernel's parent-death signal follows the thread, not the process), so a worker started ahead from a pool's
# thread, to serve later calls or later students, died with that thread and was started again: a second CUDA
# context, and a second interpreter, for a student. This thread lives as long as the grader.
_STARTER: ThreadPoolExecutor


def _new_starter() -> None:
    global _STARTER
    _STARTER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="autograder-starter")


_new_starter()
os.register_at_fork(after_in_child=_new_starter)  # a forked child has none of its parent's threads


@contextmanager
def _seccomp_program(enabled: bool) -> Iterator[int | None]:
    """The base seccomp program for bubblewrap's --seccomp, in a file of its own for each sandbox (bubblewrap
    reads it from the descriptor's offset, so two sandboxes never share one)."""
    if not enabled:
        yield None
        return
    program = os.memfd_create("autograder-seccomp")
    try:
        os.write(program, _base_program())
        os.lseek(program, 0, os.SEEK_SET)
        yield program
    finally:
        os.close(program)


@cache
def _base_program() -> bytes:
    """The base filter compiled to BPF: the same bytes for every sandbox, so compiled once a process."""
    with tempfile.TemporaryFile() as program:
        _base_filter().export_bpf(program)
        program.seek(0)
        return program.read()


def sandbox_available() -> bool:
    """Whether the sandbox can start here (for a student's own self-check, which may run without it)."""
    return _unavailable_reason() is None


def restrict_worker() -> None:
    """Called by a sandboxed worker once its backend is up: from now on it starts no program and no process."""
    seccomp = _seccomp()
    rules = _base_filter()
    for name in WORKER_DENIED_SYSCALLS:
        rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
    # A clone that is not a new thread is a new process; clone3 hides its flags, so glibc must fall back.
    rules.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, CLONE_THREAD, 0))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    rules.add_rule(seccomp.ERRNO(errno.EPERM), "socket")
    rules.load()


CLONE_THREAD = 0x00010000


def _base_filter():  # -> pyseccomp.SyscallFilter
    seccomp = _seccomp()
    rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        # A system call this libseccomp does not know cannot be made here either.
        with suppress(RuntimeError, ValueError, OSError):
            rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
    rules.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", seccomp.Arg(0, seccomp.NE, socket.AF_UNIX))
    return rules


class ToolTimeout(KernelTimeout):
    """A tool ran past its time, its process tree having run or waited for a core `active_seconds` of it. A tree
    that did neither for most of its time was stopped or blocked in the kernel: the machine held it up."""

    def __init__(self, message: str, active_seconds: float) -> None:
        super().__init__(message)
        self.active_seconds = active_seconds


def processes_under(root: int) -> list[int]:
    """`root` and every process started under it that is still there (/proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError, IndexError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])

    def under(pid: int) -> bool:
        while pid > 1 and pid != root:
            pid = parents.get(pid, 0)
        return pid == root

    return [pid for pid in parents if under(pid)]


def active_seconds(pids: Sequence[int], waiting: bool) -> float:
    """How long the processes `pids` ran on a core (with `waiting`, or waited for one) over their life (/proc: each
    thread's schedstat; where there is none, its CPU time), with the CPU time of the children they ended."""
    tick = os.sysconf("SC_CLK_TCK")
    active = 0.0
    for pid in pids:
        with suppress(OSError, IndexError, ValueError):
            ticks = [int(value) for value in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:15]]
            try:
                threads = [(task / "schedstat").read_text().split() for task in Path(f"/proc/{pid}/task").iterdir()]
                ran = sum(int(line[0]) + waiting * int(line[1]) for line in threads) / 1e9
            except (OSError, IndexError, ValueError):
                ran = (ticks[0] + ticks[1]) / tick  # utime and stime
            active += ran + (ticks[2] + ticks[3]) / tick  # and cutime and cstime
    return active


def kill_group(process: subprocess.Popen) -> None:
    """Kill a sandboxed process and everything it started (its own session), then reap it."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


def _limited(command: list[str], limits: Limits) -> list[str]:
    """`command` started by prlimit under `limits`, as soft and hard limit. prlimit sets them on itself and then
    runs `command` in its place, so the whole process tree is held to them. Setting them here rather than in a
    `preexec_fn` lets subprocess start the child with vfork: a preexec_fn makes it fork the whole grader, its
    memory and threads, for every sandbox."""
    options = []
    for option, kind, value in (
        ("--cpu", resource.RLIMIT_CPU, limits.cpu_seconds),
        ("--fsize", resource.RLIMIT_FSIZE, limits.file_bytes),
        ("--as", resource.RLIMIT_AS, limits.address_space),
        ("--data", resource.RLIMIT_DATA, limits.data),
        ("--nofile", resource.RLIMIT_NOFILE, limits.open_files),
        ("--core", resource.RLIMIT_CORE, 0),
    ):
        if value is not None:
            hard = resource.getrlimit(kind)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)  # only ever lowered
            options.append(f"{option}={value}:{value}")
    prlimit = _prlimit()
    if prlimit is None:  # sandboxed code is refused up front (`_unavailable_reason`); --no-sandbox code too, here
        raise SandboxUnavailable(
            "prlimit, which sets the resource limits of every compiler and worker, is not installed: install "
            "util-linux (Debian/Ubuntu: `apt-get install util-linux`)"
        )
    return [prlimit, *options, "--", *command]


TOOL_NICENESS = 10


def _in_background(command: list[str]) -> list[str]:
    """`command` at a lower CPU priority (coreutils' nice), for the compilers and tools: on a machine full of
    them, the processes that hold the GPU (a worker running a student's cases, a timing) get a core first, so
    their hold of the GPU, which others wait for, is not stretched by compiles that can wait."""
    nice = shutil.which("nice")
    return [nice, "-n", str(TOOL_NICENESS), *command] if nice else command


def _bind_args(path: str) -> list[str]:
    entry = Path(path)
    if entry.is_symlink() and entry.parent == Path("/"):
        return ["--symlink", os.readlink(entry), path]
    return ["--ro-bind-try", path, path]


@cache
def _python_paths() -> tuple[str, ...]:
    """The interpreter, its standard library and packages, and this package (wherever it is installed)."""
    paths = {sys.base_prefix, sys.prefix, sys.exec_prefix, str(Path(sys.executable).resolve().parent)}
    paths.add(str(PACKAGE_DIR))
    # Installed packages only: never a script's folder, the current folder or the checkout, which is on the
    # path when tests run and holds the reference solutions.
    paths.update(entry for entry in sys.path if Path(entry).name in ("site-packages", "dist-packages"))
    return tuple(sorted(p for p in paths if p and Path(p).exists() and not _inside_system(p)))


@cache
def _tool_paths() -> tuple[str, ...]:
    """Compilers outside the system folders (a CUDA toolkit in /usr/local is inside; a conda one is not)."""
    found = set()
    for tool in ("nvcc", os.environ.get("CXX", "g++"), "addr2line", "objdump", "nm"):
        located = shutil.which(tool)
        if located:
            prefix = Path(located).resolve().parent.parent
            if not _inside_system(str(prefix)):
                found.add(str(prefix))
    return tuple(sorted(found))


def _inside_system(path: str) -> bool:
    return any(path == root or path.startswith(root + "/") for root in ("/usr", "/lib", "/lib64", "/bin", "/sbin"))


def _bwrap() -> str:
    return os.environ.get("AUTOGRADER_BWRAP") or shutil.which("bwrap") or "bwrap"


@cache
def _prlimit() -> str | None:
    """util-linux's prlimit: an essential package of Debian and Ubuntu, there wherever bubblewrap is."""
    return shutil.which("prlimit")


def _seccomp():  # -> the pyseccomp (or seccomp) module
    try:
        import seccomp  # Debian's python3-seccomp
    except ImportError:
        import pyseccomp as seccomp  # PyPI's ctypes binding of the same library
    return seccomp


@cache
def _unavailable_reason() -> str | None:
    try:
        _seccomp()
    except (ImportError, OSError) as error:
        return f"no libseccomp binding ({error})"
    bwrap = _bwrap()
    if shutil.which(bwrap) is None:
        return "bubblewrap (bwrap) is not installed"
    if _prlimit() is None:
        return "prlimit (util-linux) is not installed"
    probe = subprocess.run(
        _limited(Sandbox().command(["true"]), COMPILE_LIMITS),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30,
    )
    if probe.returncode != 0:
        return f"bubblewrap failed: {probe.stderr.strip()[:300] or f'exit status {probe.returncode}'}"
    return None
