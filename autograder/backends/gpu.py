"""The GPU backend: PyCUDA on an NVIDIA GPU, the only backend whose timings count for points.

PyCUDA is imported when a GpuBackend is made, so the package imports where it is missing.

How it runs kernels:

- The device's primary context, retained and made current explicitly (no `pycuda.autoinit`), released by
  `close`.
- Kernels are compiled as C++ (no `extern "C"` wrapping, so students may write templates) and looked up by
  their mangled name, falling back to the plain name for a kernel the student declared `extern "C"`.
- Compiler output never reaches stderr: nvcc's diagnostics become CompilerMessage records. Compiled cubins
  are cached on disk together with their warnings, so a cached compile reports the same warnings as the
  first one (PyCUDA's own cache would drop them).
- Every copy, fill, launch and timing event goes to one stream, in order, with no host synchronisation
  between launches. `elapsed_each` holds that stream with a tiny kernel until the host has queued every
  timed call of a round, so even a small reduction is timed with no gaps while Python launches its passes,
  and the calls of a round run back to back.
- A freed buffer is kept for the next allocation of the same size, until the student ends (`reset`):
  cuMemAlloc and cuMemFree go through the driver's locks, shared by every process on the machine, and a
  student's correctness cases allocate and free the same few sizes hundreds of times. A kept buffer is
  handed out exactly as a fresh one would be (the same size, its contents undefined), and is filled by the
  grader before any kernel reads it (autograder.launch).
- After a kernel fault (an illegal address, say) the CUDA context is unusable. The backend then refuses
  every further call with the same KernelFault, and keeps its device objects until `close`, because freeing
  them in a broken context makes PyCUDA write warnings to stderr.
- A backend belongs to the thread that made it: its context is current in that thread only.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import numpy as np

from autograder import errors
from autograder.backends.base import Backend, Buffer, Kernel
from autograder.records import Build, CompilerMessage, DeviceInfo, KernelSource
from autograder.sandbox import Sandbox
from autograder.stages import Shape, Stage, get_stage

# Always passed to nvcc. -lineinfo maps SASS to source lines for compute-sanitizer and Nsight Compute and
# does not change the generated code. -fmad=false: a float multiply-add rounds twice, as on the CPU backend
# (g++ -ffp-contract=off), so a kernel cannot tell the GPU from the CPU analysis by a fused product
# (autograder/policy.py, _PLATFORM). A reduction only adds.
NVCC_OPTIONS: tuple[str, ...] = ("-lineinfo", "-fmad=false")

# PyCUDA writes the source to this file and runs nvcc in its folder, so diagnostics name it.
_DIAGNOSTIC = re.compile(
    r"^kernel\.cu\((?P<line>\d+)\): (?P<severity>error|warning|catastrophic error)[^:]*: (?P<text>.*)$"
)
_TOOL_DIAGNOSTIC = re.compile(
    r"^(?:ptxas|nvlink|nvcc)\b.*?\b(?P<severity>error|warning|fatal)\b\s*:?\s*(?P<text>.*)$", re.I
)

# Driver errors after which the context cannot be used again (CUDA calls them sticky).
_STICKY_ERRORS = {
    "illegal memory access": "the kernel read or wrote memory outside its buffers: check every index against n "
    "(and against the shared-memory size)",
    "misaligned address": "the kernel accessed memory at an address not aligned to the access size",
    "illegal instruction": "the kernel executed an illegal instruction",
    "unspecified launch failure": "the kernel crashed",
    "hardware stack error": "the kernel overflowed its stack (deep recursion?)",
    "device-side assert": "an assert() in the kernel failed",
    "exception on device": "the kernel raised an exception on the device",
    "timed out": "the kernel ran too long and the driver stopped it",
    "invalid program counter": "the kernel jumped to an invalid address",
}

_ARG_CODES = {Shape.SUM_1D: "PPI", Shape.MAX_2D: "PPII"}

# Holds the stream until the host has queued a round of timed calls, so each runs with no host gaps however
# small it is (nvbench's "blocking kernel"). It gives up after HOLD_LIMIT_NS, so a work that waits for the GPU
# itself stalls for that long instead of for ever.
_HOLD_SOURCE = r"""
extern "C" __global__ void autograder_hold(volatile unsigned int *release, unsigned long long limit_ns)
{
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        if (*release) {
            return;
        }
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < limit_ns);
}
"""
HOLD_LIMIT_NS = 200_000_000


@functools.cache
def hold_ptx(nvcc: str) -> bytes:
    """The timing helper as PTX for any GPU (the driver compiles it when it is loaded), NUL-terminated as the
    driver wants PTX. It is the grader's own code, compiled once per process outside the sandbox."""
    with tempfile.TemporaryDirectory(prefix="autograder-hold-") as directory:
        folder = Path(directory)
        (folder / "hold.cu").write_text(_HOLD_SOURCE)
        argv = [nvcc, "--ptx", "-o", "hold.ptx", "hold.cu"]
        result = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=NVCC_SECONDS)
        if result.returncode != 0:
            raise errors.BackendUnavailable(f"nvcc cannot compile the timing helper: {result.stderr.strip()[-500:]}")
        return (folder / "hold.ptx").read_bytes() + b"\0"


def cache_root() -> Path:
    """The grader's cache for GPU grading: `$AUTOGRADER_CACHE_DIR`, else `~/.cache/autograder`."""
    root = os.environ.get("AUTOGRADER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "autograder"
    )
    return Path(root)


def _cache_dir() -> Path:
    return cache_root() / "cubin"


def parse_nvcc_output(output: str, source: KernelSource, severity: str | None = None) -> tuple[CompilerMessage, ...]:
    """nvcc's diagnostics as records, with lines mapped to the notebook cell.

    `severity` overrides what a line says: everything a successful compile printed is a warning.
    Lines that are not diagnostics (the echoed source line and its caret, remarks) are dropped; the whole
    output stays in CompileError.log.
    """
    messages: list[CompilerMessage] = []
    for raw in output.splitlines():
        line = raw.strip()
        match = _DIAGNOSTIC.match(line)
        if match:
            kind = "error" if "error" in match["severity"] else "warning"
            messages.append(CompilerMessage(severity or kind, source.cell_line(int(match["line"])), match["text"]))
            continue
        match = _TOOL_DIAGNOSTIC.match(line)
        if match:
            kind = "warning" if match["severity"].lower() == "warning" else "error"
            messages.append(CompilerMessage(severity or kind, None, line))
    return tuple(messages)


class GpuBackend(Backend):
    """Kernels compiled by nvcc and run by PyCUDA on one NVIDIA GPU."""

    name = "gpu"

    def __init__(
        self,
        device_index: int = 0,
        *,
        nvcc: str | None = None,
        options: tuple[str, ...] = NVCC_OPTIONS,
        sandbox: bool = True,
        hold: bytes | None = None,
    ) -> None:
        """`hold`: the timing helper's PTX (`hold_ptx`), compiled by the grader; a backend without it compiles
        it now, which a fresh sandboxed worker per student would repeat."""
        try:
            import pycuda
            import pycuda.driver as cuda
        except ImportError as error:
            raise errors.BackendUnavailable(
                f"the GPU backend needs PyCUDA, which cannot be imported here ({error}). Install it with "
                "`pip install pycuda` on a machine with an NVIDIA driver and the CUDA toolkit, or use the CPU "
                "backend."
            ) from error
        self._pycuda = pycuda
        self._cuda = cuda
        self._nvcc = nvcc or find_nvcc()
        if self._nvcc is None:
            raise errors.BackendUnavailable(
                "the GPU backend needs nvcc, the CUDA compiler: put the CUDA toolkit's bin folder on the PATH "
                "or set CUDA_ROOT"
            )
        try:
            cuda.init()
            count = cuda.Device.count()
        except cuda.Error as error:
            raise errors.BackendUnavailable(f"no usable CUDA driver here: {error}") from error
        if device_index >= count:
            raise errors.BackendUnavailable(
                f"CUDA device {device_index} asked for, but this machine has {count} CUDA device(s)"
            )
        self._device = cuda.Device(device_index)
        try:
            # The device's primary context, the one the CUDA runtime uses: cupy and torch (CUB's figure in a
            # calibration, the benchmark) then share it instead of making their own current under ours, which
            # would leave our stream and kernels "invalid resource handles". Host memory is always mapped in it
            # (unified addressing), as the hold kernel needs.
            self._context = self._device.retain_primary_context()
            self._context.push()
        except cuda.Error as error:
            raise errors.BackendUnavailable(
                f"cannot create a CUDA context on {self._device.name()}: {error}"
            ) from error
        major, minor = self._device.compute_capability()
        self._arch = f"sm_{major}{minor}"
        self._options = tuple(options)
        self._sandbox = sandbox
        # The grader's own timing helper, ready now: a worker compiles nothing once it runs student code.
        self._hold_image = hold or hold_ptx(self._nvcc)
        nvcc_version(self._nvcc)  # asked now (and kept): once it runs student code, a worker starts no program
        self._stream = cuda.Stream()
        self._events: list[tuple[Any, Any]] = []  # (start, end) pairs, as many as the largest timed round
        self._l2_bytes = int(self._device.get_attribute(cuda.device_attribute.L2_CACHE_SIZE))
        self._flush_buffer: Any = None
        self._flush_count = 0
        # Everything the context owns, kept until `close` (see the module's docstring).
        self._allocations: dict[int, Any] = {}
        self._spare: dict[int, list[Any]] = {}  # freed buffers by size in bytes, for the next alloc of that size
        self._spare_bytes = 0
        self._modules: list[Any] = []
        self._hold: tuple[Any, Any, int] | None = None  # (kernel function, release flag, its device pointer)
        self._fault: errors.KernelFault | None = None
        self._closed = False
        self._info: DeviceInfo | None = None

    # --- compiling ---------------------------------------------------------------------------------------

    def compile(self, source: KernelSource, stage: Stage) -> Kernel:
        return self.load(build_cubin(stage, source, self._nvcc, self._arch, Sandbox(self._sandbox), self._options))

    def load(self, build: Build) -> Kernel:
        self._usable()
        stage = get_stage(build.stage_id)
        cubin = build.file("kernel.cubin")
        with self._driver_call("loading the compiled kernel"):
            module = self._cuda.module_from_buffer(cubin)
        self._modules.append(module)
        function = None
        for symbol in build.details.get("symbols") or stage.symbols:  # a batch's stage: in its namespace
            try:
                function = module.get_function(symbol)
                break
            except self._cuda.Error:
                continue
        if function is None:
            from autograder.build import defined_symbols  # the grader's module: a worker needs it only here

            raise errors.CompileError(stage.missing_kernel_message(defined_symbols(cubin)), (), "")
        function.prepare(_ARG_CODES[stage.shape])
        return Kernel(stage=stage, source=build.source, handle=function, warnings=build.warnings)

    def _nvcc_version(self) -> str:
        return nvcc_version(self._nvcc)

    # --- memory ------------------------------------------------------------------------------------------

    def alloc(self, count: int, guard: int = 0) -> Buffer:
        self._usable()
        size = max(1, count + guard) * 4
        if self._spare.get(size):
            allocation = self._spare[size].pop()
            self._spare_bytes -= size
        else:
            try:
                allocation = self._cuda.mem_alloc(size)
            except self._cuda.MemoryError as error:
                raise errors.BackendUnavailable(
                    f"cannot allocate {size / 2**20:.1f} MiB on {self._device.name()}: {error}"
                ) from error
        self._allocations[int(allocation)] = allocation
        return Buffer(count=count, guard=guard, handle=allocation)

    def write(self, buffer: Buffer, host: np.ndarray, offset: int = 0) -> None:
        data = np.ascontiguousarray(host, dtype=np.float32).ravel()
        _check_range(buffer, offset, data.size)
        if data.size == 0:
            return
        self._usable()
        with self._driver_call("copying data to the GPU"):
            self._cuda.memcpy_htod_async(int(buffer.handle) + offset * 4, data, self._stream)
            # The copy reads `data`, which is ours and may go away: wait for it.
            self._stream.synchronize()

    def download(self, buffer: Buffer, count: int | None = None) -> np.ndarray:
        count = buffer.physical_count if count is None else count
        _check_range(buffer, 0, count)
        host = np.empty(count, dtype=np.float32)
        if count == 0:
            return host
        self._usable()
        with self._driver_call("copying results back from the GPU"):
            self._cuda.memcpy_dtoh_async(host, int(buffer.handle), self._stream)
            self._stream.synchronize()
        return host

    def fill(self, buffer: Buffer, value: float, start: int = 0, count: int | None = None) -> None:
        count = buffer.physical_count - start if count is None else count
        _check_range(buffer, start, count)
        if count == 0:
            return
        self._usable()
        bits = int(np.array(value, dtype=np.float32).view(np.uint32))
        with self._driver_call("filling a GPU buffer"):
            self._cuda.memset_d32_async(int(buffer.handle) + start * 4, bits, count, self._stream)

    def copy(self, source: Buffer, target: Buffer, count: int, start: int = 0, to: int = 0) -> None:
        _check_range(source, start, count)
        _check_range(target, to, count)
        if count == 0:
            return
        self._usable()
        with self._driver_call("copying on the GPU"):
            self._cuda.memcpy_dtod_async(int(target.handle) + to * 4, int(source.handle) + start * 4, count * 4,
                                         self._stream)

    def free(self, buffer: Buffer) -> None:
        if self._fault is not None or self._closed:
            return  # kept until close: see the module's docstring
        allocation = self._allocations.pop(int(buffer.handle), None)
        if allocation is None:
            return
        size = max(1, buffer.physical_count) * 4
        if self._spare_bytes + size > SPARE_BYTES:
            allocation.free()
            return
        self._spare.setdefault(size, []).append(allocation)
        self._spare_bytes += size

    # --- running -----------------------------------------------------------------------------------------

    def launch(
        self,
        kernel: Kernel,
        grid: tuple[int, int],
        block: tuple[int, int],
        shared_bytes: int,
        args: tuple[Buffer | int, ...],
    ) -> None:
        self._usable()
        values = [int(a.handle) if isinstance(a, Buffer) else np.uint32(a) for a in args]
        with self._driver_call(f"launching {kernel.stage.kernel_name} with grid {grid} and block {block}"):
            kernel.handle.prepared_async_call(
                (int(grid[0]), int(grid[1])),
                (int(block[0]), int(block[1]), 1),
                self._stream,
                *values,
                shared_size=int(shared_bytes),
            )

    def synchronize(self) -> None:
        self._usable()
        with self._driver_call("running the kernel"):
            self._stream.synchronize()

    def flush_l2(self) -> None:
        """Overwrite twice the L2 cache's size, so no data of an earlier call stays cached."""
        self._usable()
        words = 2 * self._l2_bytes // 4
        if self._flush_buffer is None:
            with self._driver_call("allocating the L2 flush buffer"):
                self._flush_buffer = self._cuda.mem_alloc(words * 4)
        self._flush_count += 1
        with self._driver_call("flushing the L2 cache"):
            self._cuda.memset_d32_async(int(self._flush_buffer), self._flush_count, words, self._stream)

    def elapsed_each(self, calls: Sequence[tuple[Callable[[], None], Callable[[], None]]]) -> list[float]:
        """Time each call's `timed` part, all of them queued behind one hold of the stream, released once the
        host has queued the last: the GPU runs them back to back, each time its own, with no gaps while the
        host launches the next pass or the next call. The callables must only queue work: one that waits for
        the GPU stalls until the hold gives up (HOLD_LIMIT_NS); the stall is not in any time.
        """
        self._usable()
        while len(self._events) < len(calls):
            with self._driver_call("making timing events"):
                self._events.append((self._cuda.Event(), self._cuda.Event()))
        events = self._events[: len(calls)]
        function, release, pointer = self._hold_kernel()
        release[0] = 0
        try:
            with self._driver_call("timing"):
                function.prepared_async_call((1, 1), (1, 1, 1), self._stream, pointer, np.uint64(HOLD_LIMIT_NS))
            for (untimed, timed), (start, end) in zip(calls, events, strict=True):
                untimed()
                with self._driver_call("timing"):
                    start.record(self._stream)
                timed()
                with self._driver_call("timing"):
                    end.record(self._stream)
        finally:
            release[0] = 1
        with self._driver_call("running the timed kernels"):
            events[-1][1].synchronize()
            return [float(start.time_till(end)) for start, end in events]

    def _hold_kernel(self) -> tuple[Any, Any, int]:
        if self._hold is None:
            with self._driver_call("loading the timing helper"):
                module = self._cuda.module_from_buffer(self._hold_image)
                function = module.get_function("autograder_hold").prepare("PQ")
                release = self._cuda.pagelocked_zeros((1,), np.uint32, mem_flags=self._cuda.host_alloc_flags.DEVICEMAP)
                pointer = int(release.base.get_device_pointer())
            self._modules.append(module)
            self._hold = (function, release, pointer)
        return self._hold

    # --- the device --------------------------------------------------------------------------------------

    def device(self) -> DeviceInfo:
        if self._info is None:
            cuda = self._cuda
            major, minor = self._device.compute_capability()
            versions = [
                ("cuda_driver", _cuda_version(cuda.get_driver_version())),
                ("cuda_runtime", ".".join(str(part) for part in cuda.get_version()[:2])),
                ("pycuda", self._pycuda.VERSION_TEXT),
                ("nvcc", self._nvcc_version()),
            ]
            driver = _nvidia_driver_version()
            if driver:
                versions.insert(0, ("nvidia_driver", driver))
            pageable = self._device.get_attribute(cuda.device_attribute.PAGEABLE_MEMORY_ACCESS)
            self._info = DeviceInfo(
                backend=self.name,
                name=self._device.name(),
                compute_capability=f"{major}.{minor}",
                l2_bytes=self._l2_bytes,
                versions=tuple(versions),
                host_memory_access=bool(pageable),
            )
        return self._info

    def reset(self) -> None:
        """Wait for the last student's kernels, then free its buffers and unload its modules (the timing helper's
        too: it is loaded again from the grader's PTX when next needed). The context stays, with its stream,
        events and L2 flush buffer, whose contents no timing depends on."""
        self._usable()
        with self._driver_call("finishing the last student's kernels"):
            self._cuda.Context.synchronize()
        for allocation in self._owned():
            with self._driver_call("freeing the last student's buffers"):
                allocation.free()
        self._forget_buffers()
        self._modules.clear()
        self._hold = None
        gc.collect()  # a module is unloaded when the last object that holds it goes

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        cuda = self._cuda
        if self._fault is None:
            with suppress(cuda.Error):
                self._stream.synchronize()
            for allocation in self._owned():
                with suppress(cuda.Error):
                    allocation.free()
            if self._flush_buffer is not None:
                with suppress(cuda.Error):
                    self._flush_buffer.free()
        # detach() pops the context when it is the current one, and pushes and pops it otherwise, so a second
        # backend's context on top of the stack is left alone.
        with suppress(cuda.Error):
            self._context.detach()
        # Dropped only now: objects of a detached context are let go without touching the driver.
        self._forget_buffers()
        self._modules.clear()
        self._flush_buffer = None
        self._hold = None

    def _owned(self) -> list[Any]:
        """Every buffer the context holds: in use, and kept for reuse."""
        return [*self._allocations.values(), *(a for kept in self._spare.values() for a in kept)]

    def _forget_buffers(self) -> None:
        self._allocations.clear()
        self._spare.clear()
        self._spare_bytes = 0

    # --- errors ------------------------------------------------------------------------------------------

    def _usable(self) -> None:
        if self._closed:
            raise errors.KernelFault("the GPU backend was closed and cannot be used again")
        if self._fault is not None:
            raise self._fault

    @contextmanager
    def _driver_call(self, doing: str) -> Iterator[None]:
        """Turn a CUDA driver error into a KernelFault that says what happened and what it means."""
        try:
            yield
        except self._cuda.Error as error:
            if isinstance(error, self._cuda.CompileError):
                raise
            text = str(error)
            explanation = next((why for key, why in _STICKY_ERRORS.items() if key in text.lower()), None)
            if explanation is None:
                raise errors.KernelFault(f"CUDA error while {doing}: {text}") from error
            self._fault = errors.KernelFault(
                f"{explanation} (CUDA error while {doing}: {text}). The GPU context cannot be used after this "
                "error: the process must be restarted before it runs anything else on the GPU."
            )
            raise self._fault from error


def build_cubin(
    stage: Stage, source: KernelSource, nvcc: str, arch: str, sandbox: Sandbox, options: tuple[str, ...] = NVCC_OPTIONS
) -> Build:
    """Compile `source` to a cubin with nvcc inside the sandbox. Raises CompileError with nvcc's messages."""
    cubin, log = nvcc_cubin(source, nvcc, arch, sandbox, options)
    warnings_found = parse_nvcc_output(log, source, severity="warning")
    return Build("gpu", stage.id, source, warnings_found, (("kernel.cubin", cubin),))


def nvcc_cubin(
    source: KernelSource, nvcc: str, arch: str, sandbox: Sandbox, options: tuple[str, ...]
) -> tuple[bytes, str]:
    """The cubin and nvcc's log, from the cache where possible.

    They are cached under a hash of everything that went into them, with the cubin's SHA-256, which is
    checked before a cached cubin is used.
    """
    fingerprint = [source.text, list(options), arch, nvcc_version(nvcc)]
    key = hashlib.sha256(json.dumps(fingerprint).encode("utf-8")).hexdigest()
    cache = _cache_dir()
    entry = cache / f"{key}.json"
    cubin_path = cache / f"{key}.cubin"
    try:
        recorded = json.loads(entry.read_text())
        cubin = cubin_path.read_bytes()
        if hashlib.sha256(cubin).hexdigest() == recorded["sha256"]:
            return cubin, recorded["log"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    with tempfile.TemporaryDirectory(prefix="autograder-nvcc-") as directory:
        folder = Path(directory)
        (folder / "kernel.cu").write_text(source.text)
        argv = [nvcc, "--cubin", f"-arch={arch}", *options, "-o", "kernel.cubin", "kernel.cu"]
        result = sandbox.run_tool(argv, folder, NVCC_SECONDS)
        log = "\n".join(part for part in (result.stdout, result.stderr) if part.strip())
        if result.returncode != 0:
            messages = parse_nvcc_output(log, source)
            if not any(m.severity == "error" for m in messages):
                messages = (*messages, CompilerMessage("error", None, log.strip()[-2000:] or "nvcc failed"))
            first = next(m for m in messages if m.severity == "error")
            where = f"line {first.line}: " if first.line is not None else ""
            raise errors.CompileError(f"the kernel does not compile ({where}{first.text})", messages, log)
        cubin = (folder / "kernel.cubin").read_bytes()
    _write_atomically(cubin_path, cubin)
    _write_atomically(entry, json.dumps({"sha256": hashlib.sha256(cubin).hexdigest(), "log": log}).encode())
    return cubin, log


NVCC_SECONDS = 120.0
SPARE_BYTES = 1 << 30  # freed buffers kept for reuse, at most (beyond it a freed buffer is freed)


@functools.cache
def nvcc_version(nvcc: str) -> str:
    output = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"release [\d.]+, V([\d.]+)", output)
    return match[1] if match else (output.strip().splitlines() or ["unknown"])[-1]


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_ROOT"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
            return os.path.join(root, "bin", "nvcc")
    return None


def _check_range(buffer: Buffer, start: int, count: int) -> None:
    if start < 0 or count < 0 or start + count > buffer.physical_count:
        raise ValueError(
            f"values {start}..{start + count} are outside the buffer's {buffer.physical_count} "
            f"({buffer.count} + {buffer.guard} guard)"
        )


def _write_atomically(path: Path, data: bytes) -> None:
    """Write a cache file so that a parallel worker never reads half of it; a cache that cannot be written
    only costs a recompile."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except OSError:
        pass


def _cuda_version(number: int) -> str:
    return f"{number // 1000}.{number % 1000 // 10}"


def _nvidia_driver_version() -> str | None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", text)
    return match[1] if match else None
