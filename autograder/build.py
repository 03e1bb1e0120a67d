"""Compiling: every kernel becomes a Build in the grader process, by a compiler run inside the sandbox.

A Build is what a worker loads: the compiled bytes and what the compiler said. Workers never compile and
never write a cache; they receive the bytes of the builds they run. Builds are cached on disk by a hash of
everything that went into them; each cached file's SHA-256 is recorded when it is written and checked
before it is used (see the backends' build functions).
"""

from __future__ import annotations

import functools
import io
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import replace
from pathlib import Path
from typing import Any

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from autograder.errors import BackendUnavailable, CompileError
from autograder.policy import check_source
from autograder.records import Build, CompilerMessage, DeviceInfo, KernelSource
from autograder.references import reference_source
from autograder.sandbox import Sandbox
from autograder.schedule import cpu_slot
from autograder.stages import Stage, get_stage

BuildFunction = Callable[[Stage, KernelSource], Build]
KERNEL_FILES = {"gpu": "kernel.cubin", "cpu": "checked.so"}  # the file of a Build that holds the kernel


class Builder:
    """Builds kernels for one device in the sandbox, each distinct source's build made once per Builder (a GPU
    batch that is not used is followed by the stage's own compile), and each while it holds one of the machine's
    cores (autograder.schedule.cpu_slot), however many students compile at once.

    `options`: the backend's (the CPU backend's cache folder), and `analysis` for builds that only ever run
    small, fully checked launches (the CPU analysis of GPU stages), which need only the instrumented build."""

    def __init__(self, device: DeviceInfo, sandbox: Sandbox, options: dict[str, Any] | None = None) -> None:
        self.device = device
        self.sandbox = sandbox
        self._build, self._build_together = _build_functions(device, sandbox, options or {})
        self._builds: dict[tuple[str, str], Future[Build]] = {}
        self._lock = threading.Lock()

    def build(self, stage: Stage, source: KernelSource) -> Build:
        """The Build of `source` for `stage`. Raises CompileError (policy, compiler, or no kernel of the stage's
        name and signature in what it built) or KernelTimeout. A build another thread started is waited for."""
        future, mine = self._future(stage, source)
        if mine:
            self._make(stage, source, future)
        built = future.result()
        # The same text from another cell: the same bytes, this cell's lines in messages.
        return built if built.source == source else _relocated(built, source)

    def start(self, items: Sequence[tuple[Stage, KernelSource]], pool: Executor) -> None:
        """Begin building these stages in `pool`, so that each build is ready (or its error known) when `build`
        asks for it: together where the device builds several at once (on the GPU, in one nvcc run where they
        allow it: autograder.backends.gpu_batch), the rest each alone."""
        claimed = []
        for stage, source in items:
            future, mine = self._future(stage, source)
            if mine:
                claimed.append((stage, source, future))
        try:
            if self._build_together is not None and len(claimed) > 1:
                pool.submit(self._make_together, claimed, pool)
            else:
                for stage, source, future in claimed:
                    pool.submit(self._make, stage, source, future)
        except BaseException as error:  # a pool that cannot take them: no claimed build may be left unmade
            _settle([future for _, _, future in claimed], error)
            raise

    def _make_together(self, claimed: list[tuple[Stage, KernelSource, Future[Build]]], pool: Executor) -> None:
        try:
            checked = []
            with cpu_slot():  # one core, waited for once, for every stage's source policy and the batch
                for stage, source, future in claimed:
                    try:
                        check_source(source, self.sandbox, self.device)
                        checked.append((stage, source, future))
                    except BaseException as error:
                        future.set_exception(error)
                try:
                    together = self._build_together([(stage, source) for stage, source, _ in checked])
                except Exception:  # a batch that fails is never a stage's verdict: each stage is then built alone
                    together = {}
            for stage, source, future in checked:
                if stage.id in together:
                    future.set_result(together[stage.id])
                else:
                    try:
                        pool.submit(self._make, stage, source, future, checked=True)
                    except RuntimeError:  # the pool is closing (the student's grading ended early)
                        self._make(stage, source, future, checked=True)
        except BaseException as error:  # whatever went wrong, no claimed build is left for `build` to wait on
            _settle([future for _, _, future in claimed], error)
            raise

    def _future(self, stage: Stage, source: KernelSource) -> tuple[Future[Build], bool]:
        """The build's future, and whether the caller made it (and so must build it)."""
        key = (stage.id, source.text)
        with self._lock:
            future = self._builds.get(key)
            if future is not None:
                return future, False
            future = self._builds[key] = Future()
            return future, True

    def _make(self, stage: Stage, source: KernelSource, future: Future[Build], checked: bool = False) -> None:
        try:
            with cpu_slot():
                if not checked:
                    check_source(source, self.sandbox, self.device)
                built = self._build(stage, source)
                if _check_kernel(stage, built) == stage.kernel_name:
                    self._check_parameters(stage, source)
            future.set_result(built)
        except BaseException as error:
            future.set_exception(error)  # the same error for every later call: no source is built twice alone

    def _check_parameters(self, stage: Stage, source: KernelSource) -> None:
        """An `extern "C"` kernel's symbol names no parameter types, and a launch with the contract's would read
        others differently on each backend: the compiler checks them, in a build that only tells whether they fit."""
        try:
            self._build(stage, replace(source, text=source.text + stage.parameter_check()))
        except CompileError:
            raise _contract_error(stage, source, stage.wrong_parameters_message()) from None


def _settle(futures: list[Future[Build]], error: BaseException) -> None:
    """Give every build not yet made `error`, so that no `build` waits for it for ever."""
    for future in futures:
        if not future.done():
            future.set_exception(error)


def reference_build(device: DeviceInfo, sandbox: Sandbox, stage_id: str) -> Build:
    """The grader's reference kernel of a stage, built once a process for every student it grades: each
    student's timing compares with the references, and a student's Builder found them in the cache only after
    waiting for a core (cpu_slot), the source policy and reading the build's ELF file, half a second a student
    in a class."""
    return _reference_build(device, sandbox, stage_id, reference_source(stage_id).text)


@functools.cache
def _reference_build(device: DeviceInfo, sandbox: Sandbox, stage_id: str, text: str) -> Build:
    return Builder(device, sandbox).build(get_stage(stage_id), KernelSource(text))


def defined_symbols(binary: bytes) -> frozenset[str]:
    """The names an ELF file (a cubin, a shared object) defines, read with pyelftools; none where it cannot be
    read."""
    try:
        elf = ELFFile(io.BytesIO(binary))
        return frozenset(
            symbol.name
            for section in elf.iter_sections()
            if isinstance(section, SymbolTableSection)
            for symbol in section.iter_symbols()
            if symbol.name and symbol["st_shndx"] != "SHN_UNDEF"
        )
    except (ELFError, ValueError, KeyError):
        return frozenset()


def _check_kernel(stage: Stage, build: Build) -> str:
    """The first of the symbols every backend looks the stage's kernel up by (Stage.symbols) that the build
    defines; else a compile error on the kernel's line: a wrong name or parameter types is the stage's compile
    error, found here in the grader before any worker tries to load it."""
    defined = defined_symbols(build.file(KERNEL_FILES[build.backend]))
    found = next((symbol for symbol in stage.symbols if symbol in defined), None)
    if found is None:
        raise _contract_error(stage, build.source, stage.missing_kernel_message(defined))
    return found


def _contract_error(stage: Stage, source: KernelSource, message: str) -> CompileError:
    line = source.cell_line(_kernel_line(stage, source.text))
    return CompileError(message, (CompilerMessage("error", line, message),))


def _kernel_line(stage: Stage, text: str) -> int | None:
    """The source line that declares the stage's kernel, else the first `__global__` one."""
    lines = text.split("\n")  # lines as the compiler counts them (not at U+2028, say)
    for wanted in (rf"__global__.*\b{re.escape(stage.kernel_name)}\b", r"\b__global__\b"):
        found = next((number for number, line in enumerate(lines, 1) if re.search(wanted, line)), None)
        if found is not None:
            return found
    return None


def _relocated(build: Build, source: KernelSource) -> Build:
    """`build`, made of the same text as `source`, with its warnings on `source`'s cell lines."""
    lines = range(1, build.source.text.count("\n") + 2)
    kernel_lines = {}  # cell line of the build's source -> kernel line (the first, where several share one)
    for line in reversed(lines):
        kernel_lines[build.source.cell_line(line)] = line

    def moved(cell_line: int | None) -> int | None:
        return None if cell_line is None else source.cell_line(kernel_lines.get(cell_line, cell_line))

    return replace(build, source=source, warnings=tuple(replace(m, line=moved(m.line)) for m in build.warnings))


def _build_functions(
    device: DeviceInfo, sandbox: Sandbox, options: dict[str, Any]
) -> tuple[BuildFunction, Callable[[Sequence[tuple[Stage, KernelSource]]], dict[str, Build]] | None]:
    """How the device builds a stage, and how it builds several at once (those it can, by stage), where it does."""
    if device.backend == "gpu":
        from autograder.backends import gpu_batch
        from autograder.backends.gpu import NVCC_OPTIONS, build_cubin, find_nvcc

        nvcc = find_nvcc()
        if nvcc is None:
            raise BackendUnavailable("the GPU backend needs nvcc, the CUDA compiler, on the PATH or in CUDA_ROOT")
        major, minor = (device.compute_capability or "0.0").split(".")
        arch = f"sm_{major}{minor}"
        return (
            lambda stage, source: build_cubin(stage, source, nvcc, arch, sandbox),
            lambda items: gpu_batch.build_together(items, nvcc, arch, sandbox, NVCC_OPTIONS),
        )
    from autograder.backends.cpu.compiler import build_shared_objects, prepare_toolchain

    cache = options.get("cache_dir")
    fibers = dict(device.versions).get("fibers", "auto")
    toolchain = prepare_toolchain(fibers, Path(cache) if cache else None, options.get("compiler"))
    fast = not options.get("analysis")
    return lambda stage, source: build_shared_objects(toolchain, stage, source, sandbox, fast), None
