"""The CPU backend: the student's unchanged CUDA C, compiled by g++, run as fibers, every access checked.

See `runtime/ag_runtime.cpp` for the scheduler and the race checker, and `compiler.py` for the builds. This
module is the Backend interface on top: buffers, launches, findings with notebook lines, and metrics.

Launches run synchronously in this process. Student code can crash or loop forever, so the grader runs this
backend inside `autograder.isolation.Worker`.
"""

from __future__ import annotations

import ctypes
import itertools
import mmap
import os
import re
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from autograder.backends.base import Backend, Buffer, Kernel
from autograder.backends.cpu.compiler import Toolchain, build_shared_objects, prepare_toolchain
from autograder.errors import BackendUnavailable, CompileError, KernelFault
from autograder.records import (
    FINDING_KINDS,
    Build,
    DeviceInfo,
    Finding,
    KernelMetrics,
    KernelSource,
    LineMetric,
    merged,
)
from autograder.sandbox import Sandbox
from autograder.stages import Stage, get_stage

SCHEDULES = ("run_until_blocked", "lockstep", "reversed", "random")
# The runtime's finding codes (ag_runtime.cpp's Kind), in order.
RUNTIME_KINDS = (*FINDING_KINDS[:7], "barrier_divergence", "kept_state")
# Launches with more threads than this check their first and last SAMPLE_BLOCKS blocks, and SAMPLE_BLOCKS more
# between them drawn from the run's secret seed; the other blocks run the plain build. Every race and bounds error
# of the reference-style kernels shows in the first and last ones; the drawn ones find what a kernel keeps to the
# blocks between (runtime/ag_runtime.cpp, spot_blocks).
FULL_CHECK_THREADS = 1 << 20
SAMPLE_BLOCKS = 64
METRICS_BLOCKS = 4  # blocks per launch that feed the bank-conflict and divergence metrics


# The runtime's per-kernel counts (ag_counts), in its order: KernelMetrics fields.
_COUNTS = ("blocks", "barriers", "diverged_steps", "shuffles", "lone_shared_requests", "global_load_requests",
           "global_load_sectors", "global_load_words", "busiest_thread_shared", "shared_atomics")

# Kernel ids are unique in the process, because every backend with the same fibers shares one runtime.
_KERNEL_IDS = itertools.count(1)


class _Launch(ctypes.Structure):
    _fields_ = [
        ("checked", ctypes.c_void_p),
        ("fast", ctypes.c_void_p),
        ("args", ctypes.POINTER(ctypes.c_void_p)),
        ("nargs", ctypes.c_int),
        ("grid", ctypes.c_uint * 2),
        ("block", ctypes.c_uint * 2),
        ("shared_bytes", ctypes.c_ulonglong),
        ("kernel_id", ctypes.c_int),
        ("schedule", ctypes.c_int),
        ("seed", ctypes.c_ulonglong),
        ("measure_seed", ctypes.c_ulonglong),
    ]


class _Finding(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int),
        ("line", ctypes.c_int),
        ("pc", ctypes.c_uint),
        ("kernel_id", ctypes.c_int),
        ("writes", ctypes.c_int),
        ("thread", ctypes.c_char * 64),
        ("message", ctypes.c_char * 512),
    ]


class _Metric(ctypes.Structure):
    _fields_ = [
        ("kernel_id", ctypes.c_int),
        ("pc", ctypes.c_uint),
        ("requests", ctypes.c_ulonglong),
        ("transactions", ctypes.c_ulonglong),
    ]


@dataclass
class _CompiledKernel:
    """What `Kernel.handle` holds on the CPU backend."""

    id: int
    name: str
    source: KernelSource
    checked: ctypes.CDLL
    fast: ctypes.CDLL
    parameter_names: tuple[str, ...]
    dynamic_shared_names: tuple[str, ...]
    device_variables: tuple[str, ...]  # the symbols of its __device__ variables (compiler.device_variables)
    unchecked_imports: tuple[str, ...]  # functions it calls that may write where no check looks
    lines: dict[int, int] = field(default_factory=dict)  # call-site offset -> kernel-source line

    def source_lines(self, offsets: list[int]) -> dict[int, int | None]:
        return {offset: self.lines.get(offset) for offset in offsets}


def _open_library(path: Path) -> ctypes.CDLL:
    """A build's shared object, loaded; a KernelFault that names no host path where the loader refuses it (a
    `__device__` array of 64 GiB maps no zero-fill pages): the kernel's verdict, not the grader's failure."""
    try:
        return ctypes.CDLL(str(path))
    except OSError as error:
        reason = str(error).rsplit(": ", 1)[-1]
        if not _TOO_LARGE.search(reason):  # a library or a folder of the grader's own: its failure, not the kernel's
            raise
        raise KernelFault(
            f"the kernel could not be loaded ({reason}): are its __device__ or static arrays larger than memory?"
        ) from None


# What the loader says of a library whose data it cannot map (glibc's words).
_TOO_LARGE = re.compile(r"map zero-fill pages|failed to map segment|Cannot allocate memory|File too large")


def _bind_kernel(library: ctypes.CDLL, stage: Stage, binary: bytes) -> None:
    """Point the library's launcher at the kernel, found by the names a GPU finds it by, or refuse it alike."""
    for symbol in stage.symbols:
        try:
            address = ctypes.cast(library[symbol], ctypes.c_void_p).value
        except AttributeError:
            continue
        ctypes.c_void_p.in_dll(library, "__ag_kernel").value = address
        return
    from autograder.build import defined_symbols  # the grader's module: a worker needs it only here

    raise CompileError(stage.missing_kernel_message(defined_symbols(binary)), (), "")


_PROT_NONE = 0  # mmap has PROT_READ and PROT_WRITE, not this
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _protect(address: int, length: int, protection: int) -> None:
    """mprotect: `length` bytes from `address` (both whole pages) get `protection`."""
    if length > 0 and _LIBC.mprotect(address, length, protection) != 0:
        raise OSError(ctypes.get_errno(), f"mprotect: {os.strerror(ctypes.get_errno())}")


class CpuBackend(Backend):
    """Runs CUDA C kernels on the CPU, one block after another, with race, bounds and deadlock checks.

    schedule: the order fibers run in: "run_until_blocked" (default: each thread runs until a barrier or a
        warp collective), "lockstep" (threads take turns at every shared-memory access, as a warp does on old
        GPUs), "reversed" or "random" (seeded by `seed`). The race report does not depend on it; the output
        of racy code does.
    checks: run the instrumented build and report findings. Without checks every launch runs the plain build.
    fibers: "auto" (Boost.Context where it is installed, else ucontext), "boost.context" or "ucontext";
        the environment variable AUTOGRADER_CPU_FIBERS sets the default.
    cache_dir: where builds are cached (default `$XDG_CACHE_HOME/autograder/cpu`).
    sandbox: run g++ inside the sandbox (autograder.sandbox) when this backend compiles for itself.
    compiler: the C++ compiler (default `$CXX`, else g++).
    toolchain: one the grader prepared (a sandboxed worker is told the grader's, and looks for nothing itself:
        it sees the cache read-only, and may find the libraries elsewhere or not at all); the three above
        are then not used.
    """

    name = "cpu"

    def __init__(
        self,
        schedule: str = "run_until_blocked",
        seed: int = 0,
        checks: bool = True,
        fibers: str | None = None,
        cache_dir: str | Path | None = None,
        sandbox: bool = True,
        compiler: str | None = None,
        toolchain: Toolchain | None = None,
    ) -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, not {schedule!r}")
        self.schedule = schedule
        self.checks = checks
        fibers = fibers or os.environ.get("AUTOGRADER_CPU_FIBERS", "auto")
        self.toolchain: Toolchain = toolchain or prepare_toolchain(
            fibers, Path(cache_dir) if cache_dir else None, compiler
        )
        # RTLD_GLOBAL is not needed: each kernel library names the runtime as a dependency.
        self._runtime = ctypes.CDLL(str(self.toolchain.runtime))
        self._declare_runtime()
        self._runtime.ag_configure(METRICS_BLOCKS, FULL_CHECK_THREADS, SAMPLE_BLOCKS)
        self.seed = seed
        self._launches = 0
        self._kernels: dict[int, _CompiledKernel] = {}
        self._findings: dict[tuple[str, int | None, str | None], Finding] = {}
        self._views: dict[int, np.ndarray] = {}
        self.sandbox = Sandbox(sandbox)
        # Loaded kernels are written here (a worker's private /tmp when sandboxed), never into the cache. Removed by
        # `close`, or when the backend is let go or its process exits without closing it (a test's, a script's).
        self._folder = tempfile.mkdtemp(prefix="autograder-cpu-")
        self._remove_folder = weakref.finalize(self, shutil.rmtree, self._folder, ignore_errors=True)

    @property
    def fibers(self) -> str:
        return self._runtime.ag_fibers().decode()

    def _declare_runtime(self) -> None:
        rt = self._runtime
        rt.ag_fibers.restype = ctypes.c_char_p
        rt.ag_error.restype = ctypes.c_char_p
        rt.ag_configure.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_int]
        rt.ag_alloc.restype = ctypes.c_void_p
        rt.ag_alloc.argtypes = [ctypes.c_ulonglong, ctypes.c_ulonglong]
        rt.ag_free.argtypes = [ctypes.c_void_p]
        rt.ag_run_only.argtypes = [ctypes.POINTER(ctypes.c_longlong), ctypes.c_longlong, ctypes.c_int]
        rt.ag_launch.argtypes = [ctypes.POINTER(_Launch)]
        rt.ag_watch_variables.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        rt.ag_finding.restype = ctypes.POINTER(_Finding)
        rt.ag_finding.argtypes = [ctypes.c_int]
        rt.ag_metrics.argtypes = [ctypes.c_int, ctypes.POINTER(_Metric), ctypes.c_int]
        counter = ctypes.POINTER(ctypes.c_ulonglong)
        rt.ag_divergence.argtypes = [ctypes.c_int, counter, counter]
        rt.ag_counts.argtypes = [ctypes.c_int, counter]

    def device(self) -> DeviceInfo:
        return DeviceInfo(
            backend="cpu",
            name=f"CPU backend (g++ {self.toolchain.version}, {self.fibers})",
            versions=(("g++", self.toolchain.version), ("fibers", self.fibers)),
        )

    # -- compiling ------------------------------------------------------------------------------------------

    def compile(self, source: KernelSource, stage: Stage) -> Kernel:
        return self.load(build_shared_objects(self.toolchain, stage, source, self.sandbox))

    def load(self, build: Build) -> Kernel:
        stage = get_stage(build.stage_id)
        folder = Path(tempfile.mkdtemp(prefix="kernel-", dir=self._folder))
        libraries = {}
        for name, data in build.files:  # checked.so, and fast.so unless the checked build serves as both
            path = folder / name
            path.write_bytes(data)
            libraries[name] = _open_library(path)
            _bind_kernel(libraries[name], stage, data)
        kernel_id = next(_KERNEL_IDS)
        details = build.details
        compiled = _CompiledKernel(
            id=kernel_id,
            name=stage.kernel_name,
            source=build.source,
            checked=libraries["checked.so"],
            fast=libraries.get("fast.so", libraries["checked.so"]),
            parameter_names=tuple(details["parameter_names"]),
            dynamic_shared_names=tuple(details["dynamic_shared_names"]),
            device_variables=tuple(details["device_variables"]),
            lines=dict(details["lines"]),
            unchecked_imports=tuple(details["unchecked_imports"]),
        )
        if compiled.device_variables:  # checked as the grader's buffers are, in every launch of the checked build
            entry = ctypes.cast(compiled.checked["__ag_entry"], ctypes.c_void_p).value
            self._runtime.ag_watch_variables(entry, "\n".join(compiled.device_variables).encode())
        self._kernels[kernel_id] = compiled
        return Kernel(stage=stage, source=build.source, handle=compiled, warnings=build.warnings)

    # -- memory ---------------------------------------------------------------------------------------------

    def alloc(self, count: int, guard: int = 0) -> Buffer:
        address = self._runtime.ag_alloc(count, guard)
        if not address:
            raise MemoryError(f"the CPU backend could not map {count + guard} floats")
        view = np.ctypeslib.as_array((ctypes.c_float * (count + guard)).from_address(address))
        self._views[address] = view
        return Buffer(count=count, guard=guard, handle=address)

    def _view(self, buffer: Buffer) -> np.ndarray:
        return self._views[buffer.handle]

    def write(self, buffer: Buffer, host: np.ndarray, offset: int = 0) -> None:
        data = np.asarray(host, dtype=np.float32).ravel()
        self._view(buffer)[offset : offset + data.size] = data

    def download(self, buffer: Buffer, count: int | None = None) -> np.ndarray:
        view = self._view(buffer)
        return view[: buffer.physical_count if count is None else count].copy()

    def fill(self, buffer: Buffer, value: float, start: int = 0, count: int | None = None) -> None:
        end = buffer.physical_count if count is None else start + count
        self._view(buffer)[start:end] = value

    def copy(self, source: Buffer, target: Buffer, count: int, start: int = 0, to: int = 0) -> None:
        self._view(target)[to : to + count] = self._view(source)[start : start + count]

    def free(self, buffer: Buffer) -> None:
        if self._views.pop(buffer.handle, None) is not None:
            self._runtime.ag_free(buffer.handle)

    # -- running --------------------------------------------------------------------------------------------

    def launch(
        self,
        kernel: Kernel,
        grid: tuple[int, int],
        block: tuple[int, int],
        shared_bytes: int,
        args: tuple[Buffer | int, ...],
    ) -> None:
        compiled: _CompiledKernel = kernel.handle
        # Every argument gets 8 bytes of storage: the runtime reads each one as a pointer to find the buffers.
        storage = [ctypes.c_uint64(a.handle if isinstance(a, Buffer) else int(a)) for a in args]
        pointers = (ctypes.c_void_p * len(args))(*(ctypes.addressof(s) for s in storage))
        checked_entry = ctypes.cast(compiled.checked["__ag_entry"], ctypes.c_void_p).value
        fast_entry = ctypes.cast(compiled.fast["__ag_entry"], ctypes.c_void_p).value
        launch = _Launch(
            checked=checked_entry if self.checks else None,
            # Each build has its own copy of a __device__ variable, so such a kernel runs one build throughout.
            fast=None if self.checks and compiled.device_variables else fast_entry,
            args=pointers,
            nargs=len(args),
            grid=(ctypes.c_uint * 2)(*grid),
            block=(ctypes.c_uint * 2)(*block),
            shared_bytes=shared_bytes,
            kernel_id=compiled.id,
            schedule=SCHEDULES.index(self.schedule),
            # Each launch its own random order, reproducible from the backend's seed.
            seed=(self.seed * 1_000_003 + self._launches) & 0xFFFFFFFFFFFFFFFF,
            # The blocks measured: from the backend's seed and the launch's shape, never from what ran before it.
            measure_seed=hash((self.seed, *grid, *block, shared_bytes)) & 0xFFFFFFFFFFFFFFFF,
        )
        self._launches += 1
        status = self._runtime.ag_launch(ctypes.byref(launch))
        if status == -2:  # the machine's doing, not the kernel's: a grader failure, never a pass unchecked
            why = self._runtime.ag_error().decode()
            self._runtime.ag_clear_findings()  # what it saw belongs to no verdict: none is given
            self._findings.clear()
            raise BackendUnavailable(f"the CPU backend could not check {compiled.name}: {why}")
        if status < 0:
            raise KernelFault(f"{compiled.name}: {self._runtime.ag_error().decode()}")
        new = self._collect_findings()
        if status == 1:
            # The fault carries the deadlock; findings() keeps only what no exception reported.
            deadlocks = tuple(f for f in new if f.kind == "deadlock")
            for finding in deadlocks:
                self._findings.pop((finding.kind, finding.line, finding.kernel), None)
            raise KernelFault(f"{compiled.name} deadlocked: {deadlocks[0].message if deadlocks else ''}", deadlocks)

    def expose(self, buffer: Buffer, ranges: Sequence[tuple[int, int]]) -> None:
        page = mmap.PAGESIZE
        guarded = buffer.count * 4 // page * page  # the page that holds the guard tail's start stays as it is
        _protect(buffer.handle, guarded, _PROT_NONE)
        for first, last in ranges:
            start = first * 4 // page * page
            _protect(buffer.handle + start, min(guarded, -(-last * 4 // page) * page) - start,
                     mmap.PROT_READ | mmap.PROT_WRITE)

    def run_only(self, blocks: Sequence[int], measured: bool = True) -> None:
        chosen = (ctypes.c_longlong * len(blocks))(*(int(b) for b in blocks))
        self._runtime.ag_run_only(chosen, len(blocks), int(measured))

    def synchronize(self) -> None:
        """Launches run synchronously; there is nothing to wait for."""

    def elapsed_each(self, calls: Sequence[tuple[Callable[[], None], Callable[[], None]]]) -> list[float]:
        times = []
        for untimed, timed in calls:
            untimed()
            start = time.perf_counter()
            timed()
            times.append((time.perf_counter() - start) * 1000.0)
        return times

    # -- findings and metrics -------------------------------------------------------------------------------

    def _collect_findings(self) -> list[Finding]:
        raw = [self._runtime.ag_finding(i).contents for i in range(self._runtime.ag_finding_count())]
        records = [(r.kind, r.line, r.pc, r.kernel_id, r.writes, r.thread.decode(), r.message.decode()) for r in raw]
        self._runtime.ag_clear_findings()
        new = []
        for kind, line, pc, kernel_id, writes, thread, message in records:
            compiled = self._kernels[kernel_id]
            offsets = [int(x, 16) for x in re.findall(r"\{pc:([0-9a-f]+)\}", message)]
            if pc:
                offsets.append(pc)
            lines = compiled.source_lines(offsets)
            source_line = lines.get(pc) if pc else (line or None)
            finding = Finding(
                kind=RUNTIME_KINDS[kind],
                message=self._fill_placeholders(message, compiled, lines),
                line=compiled.source.cell_line(source_line),
                thread=thread or None,
                kernel=compiled.name,
                # Only where every write could be seen: a call to memcpy, say, writes past every check.
                reads_only=RUNTIME_KINDS[kind] == "out_of_bounds" and not writes and not compiled.unchecked_imports,
            )
            key = (finding.kind, finding.line, finding.kernel)
            first = self._findings.get(key)
            self._findings[key] = finding if first is None else merged(finding, first)  # the first, or a write
            new.append(finding)
        return new

    @staticmethod
    def _fill_placeholders(message: str, compiled: _CompiledKernel, lines: dict[int, int | None]) -> str:
        def line_text(source_line: int | None) -> str:
            cell_line = compiled.source.cell_line(source_line)
            return f"line {cell_line}" if cell_line is not None else "an unknown line"

        def substitute(match: re.Match[str]) -> str:
            what, value = match.group(1), match.group(2)
            if what == "pc":
                return line_text(lines.get(int(value, 16)))
            if what == "line":
                return line_text(int(value))
            if what == "arg":
                index = int(value)
                names = compiled.parameter_names
                return names[index] if 0 <= index < len(names) else f"argument {index}"
            return "/".join(compiled.dynamic_shared_names) or "extern __shared__ memory"

        return re.sub(r"\{(pc|line|arg|dyn)(?::([0-9a-f]+))?\}", substitute, message)

    def findings(self) -> tuple[Finding, ...]:
        found = tuple(self._findings.values())
        self._findings.clear()
        return found

    def metrics(self, kernel: Kernel) -> KernelMetrics | None:
        compiled: _CompiledKernel = kernel.handle
        count = self._runtime.ag_metrics(compiled.id, None, 0)
        records = (_Metric * count)()
        self._runtime.ag_metrics(compiled.id, records, count)
        per_pc = [(m.pc, m.requests, m.transactions) for m in records]
        lines = compiled.source_lines([pc for pc, _, _ in per_pc])
        per_line: dict[int | None, list[int]] = {}
        for pc, requests, transactions in per_pc:
            totals = per_line.setdefault(lines[pc], [0, 0])
            totals[0] += requests
            totals[1] += transactions
        text = compiled.source.text.split("\n")  # lines as the compiler counts them (not at U+2028, say)
        line_metrics = tuple(
            LineMetric(
                line=compiled.source.cell_line(line),
                text=text[line - 1].strip() if line is not None and 0 < line <= len(text) else "",
                shared_requests=requests,
                shared_transactions=transactions,
            )
            for line, (requests, transactions) in sorted(per_line.items(), key=lambda item: item[0] or 0)
        )
        steps, diverged = ctypes.c_ulonglong(), ctypes.c_ulonglong()
        self._runtime.ag_divergence(compiled.id, ctypes.byref(steps), ctypes.byref(diverged))
        if not line_metrics and not steps.value:
            return None
        counts = (ctypes.c_ulonglong * len(_COUNTS))()
        self._runtime.ag_counts(compiled.id, counts)
        return KernelMetrics(
            lines=line_metrics,
            divergence=diverged.value / steps.value if steps.value else 0.0,
            **dict(zip(_COUNTS, counts, strict=True)),
        )

    def close(self) -> None:
        for address in list(self._views):
            self._runtime.ag_free(address)
        self._views.clear()
        self._remove_folder()
