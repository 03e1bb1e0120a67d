"""The small interface every backend implements: compile, allocate, launch, time.

Nothing above a backend knows which one it has. The launch rules of the contract (pass after pass until one
value remains, poisoned and guarded output buffers) live in `autograder.launch`, on top of this interface.

All buffers hold float32. Kernel arguments are Buffers and Python ints (passed as `unsigned int`).

A buffer has `count` values the kernel may use, followed by `guard` values it must not touch. The grader fills
the guard tail and checks it; a backend that sees every access (the CPU backend) reports any access to it as
out of bounds. Offsets and counts of `write`, `fill` and `download` address the whole `count + guard` range.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autograder.errors import GraderError
from autograder.records import Build, DeviceInfo, Finding, KernelMetrics, KernelSource
from autograder.stages import Stage


@dataclass
class Buffer:
    """A device buffer of `count` float32 values and a `guard` tail. `handle` is the backend's own object."""

    count: int
    guard: int
    handle: Any

    @property
    def physical_count(self) -> int:
        return self.count + self.guard


@dataclass
class Kernel:
    """A compiled kernel ready to launch. `handle` is the backend's own object."""

    stage: Stage
    source: KernelSource
    handle: Any
    warnings: tuple = field(default=())  # CompilerMessage records of a successful compile


class Backend(ABC):
    """One way of running CUDA C kernels."""

    name: str  # "gpu" or "cpu"; only the GPU's timings count for points (see grade.py)

    @abstractmethod
    def device(self) -> DeviceInfo:
        """What this backend runs on, with the versions that matter for reproducing a result."""

    @abstractmethod
    def compile(self, source: KernelSource, stage: Stage) -> Kernel:
        """Compile `source` (in the sandbox) and load it: trusted, in-process use (tests, benchmarks).

        Raises CompileError with the compiler's messages as data, never printed. Messages name the notebook
        cell's lines (through `source.cell_line`).
        """

    @abstractmethod
    def load(self, build: Build) -> Kernel:
        """Load a kernel the grader compiled (autograder.build) and find the stage's kernel in it.

        This is all a worker does with student code before running it: it never compiles.
        """

    @abstractmethod
    def alloc(self, count: int, guard: int = 0) -> Buffer:
        """An uninitialised buffer of `count` float32 values followed by a `guard` tail."""

    @abstractmethod
    def write(self, buffer: Buffer, host: np.ndarray, offset: int = 0) -> None:
        """Copy the float32 array `host` (flattened) into `buffer`, starting at value `offset`."""

    @abstractmethod
    def download(self, buffer: Buffer, count: int | None = None) -> np.ndarray:
        """The first `count` values of `buffer` (all `count + guard` when None) as a float32 array."""

    @abstractmethod
    def fill(self, buffer: Buffer, value: float, start: int = 0, count: int | None = None) -> None:
        """Set `count` values of `buffer` from `start` (to the end when None) to `value`."""

    @abstractmethod
    def copy(self, source: Buffer, target: Buffer, count: int, start: int = 0, to: int = 0) -> None:
        """Copy `count` values of `source` from `start` into `target` from `to`, after the launches so far."""

    @abstractmethod
    def free(self, buffer: Buffer) -> None:
        """Release `buffer`."""

    @abstractmethod
    def launch(
        self,
        kernel: Kernel,
        grid: tuple[int, int],
        block: tuple[int, int],
        shared_bytes: int,
        args: tuple[Buffer | int, ...],
    ) -> None:
        """Launch `kernel`. It may run asynchronously: `synchronize` waits for it.

        Raises KernelFault when the launch fails (a deadlock on the CPU, a bad configuration on the GPU).
        """

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for every launch so far. Raises KernelFault if one failed (an illegal address, say)."""

    def upload(self, host: np.ndarray) -> Buffer:
        """A new buffer holding a copy of the float32 array `host`."""
        buffer = self.alloc(host.size)
        self.write(buffer, host)
        return buffer

    def flush_l2(self) -> None:
        """Evict the device's L2 cache before a timed call. Nothing to do where there is no L2 to flush."""
        return None

    @abstractmethod
    def elapsed_each(self, calls: Sequence[tuple[Callable[[], None], Callable[[], None]]]) -> list[float]:
        """For each (untimed, timed) pair in turn, run `untimed`, then `timed` between a pair of timing events;
        wait once for them all, and return each pair's milliseconds between its events. Both must only queue
        work (launches, fills), never wait for it."""

    def elapsed_ms(self, work: Callable[[], None]) -> float:
        """Run `work` between a pair of timing events, wait for it, and return the milliseconds between them."""
        return self.elapsed_each([(_nothing, work)])[0]

    def run_only(self, blocks: Sequence[int], measured: bool = True) -> None:
        """Run only these blocks (linear numbers) of the launches that follow, each checked, and measured where
        `measured`; none: every block again. Only a backend that runs blocks one at a time can (the CPU backend:
        autograder.at_scale)."""
        raise GraderError(f"the {self.name} backend runs every block of a launch")

    def expose(self, buffer: Buffer, ranges: Sequence[tuple[int, int]]) -> None:
        """Leave only these ranges of `buffer`'s values (from, to; rounded out to whole pages) readable and
        writable until it is freed: any other access before its guard tail faults. Only a backend whose buffers
        are the worker's own memory can (the CPU backend: autograder.at_scale)."""
        raise GraderError(f"the {self.name} backend cannot protect part of a buffer")

    def findings(self) -> tuple[Finding, ...]:
        """Defects seen by the launches since the last call, deduplicated; the list is then cleared.

        Lines are notebook cell lines. A backend that cannot see races or bounds returns nothing.
        """
        return ()

    def metrics(self, kernel: Kernel) -> KernelMetrics | None:
        """Bank-conflict and divergence metrics of `kernel`'s launches so far, where the backend measures them."""
        return None

    def reset(self) -> None:
        """Drop everything the last student's kernels used (their modules and every buffer), keeping only the
        device, so that the backend can serve another student (autograder.executors). Raises KernelFault where
        the device is not in a state to be used again, GraderError where the backend cannot be reused at all."""
        raise GraderError(f"the {self.name} backend cannot serve another student: start a fresh worker")

    def close(self) -> None:
        """Release the device. The backend is not used again."""
        return None


def _nothing() -> None:
    return None
