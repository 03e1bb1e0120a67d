"""Compiling: every kernel becomes a Build in the grader process, by a compiler run inside the sandbox.

A Build is what a worker loads: the compiled bytes and what the compiler said. Workers never compile and
never write a cache; they receive the bytes of the builds they run. Builds are cached on disk by a hash of
everything that went into them; each cached file's SHA-256 is recorded when it is written and checked
before it is used (see the backends' build functions).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from autograder.errors import BackendUnavailable
from autograder.policy import check_source
from autograder.records import Build, DeviceInfo, KernelSource
from autograder.sandbox import Sandbox
from autograder.stages import Stage

BuildFunction = Callable[[Stage, KernelSource], Build]


class Builder:
    """Builds kernels for one device in the sandbox, each distinct source once per process."""

    def __init__(self, device: DeviceInfo, sandbox: Sandbox, options: dict[str, Any] | None = None) -> None:
        self.device = device
        self.sandbox = sandbox
        self._build = _build_function(device, sandbox, options or {})
        self._built: dict[tuple[str, str], Build] = {}

    def build(self, stage: Stage, source: KernelSource) -> Build:
        """The Build of `source` for `stage`. Raises CompileError (policy or compiler) or KernelTimeout."""
        key = (stage.id, source.text)
        if key not in self._built:
            check_source(source)
            self._built[key] = self._build(stage, source)
        built = self._built[key]
        # The same text from another cell: the same bytes, this cell's lines in messages.
        return built if built.source == source else _relocated(built, source)


def _relocated(build: Build, source: KernelSource) -> Build:
    offset = (source.cell_line(1) or 1) - (build.source.cell_line(1) or 1)
    warnings = tuple(replace(m, line=m.line + offset if m.line is not None else None) for m in build.warnings)
    return replace(build, source=source, warnings=warnings)


def _build_function(device: DeviceInfo, sandbox: Sandbox, options: dict[str, Any]) -> BuildFunction:
    if device.backend == "gpu":
        from autograder.backends.gpu import build_cubin, find_nvcc

        nvcc = find_nvcc()
        if nvcc is None:
            raise BackendUnavailable("the GPU backend needs nvcc, the CUDA compiler, on the PATH or in CUDA_ROOT")
        major, minor = (device.compute_capability or "0.0").split(".")
        arch = f"sm_{major}{minor}"
        return lambda stage, source: build_cubin(stage, source, nvcc, arch, sandbox)
    from autograder.backends.cpu.compiler import build_shared_objects, prepare_toolchain

    cache = options.get("cache_dir")
    fibers = dict(device.versions).get("fibers", "auto")
    toolchain = prepare_toolchain(fibers, Path(cache) if cache else None, options.get("compiler"))
    return lambda stage, source: build_shared_objects(toolchain, stage, source, sandbox)
