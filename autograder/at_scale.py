"""The timing size, checked: the kernel the GPU times, at the size it is timed at, on sampled blocks.

Every correctness case is far smaller than the timing size (2^26 values for a sum, 8192 x 8192 for max2d: the
rubric's), so a kernel could choose other code there (`if (n >= 1 << 25)`) and be timed on code that no check
saw, vouched for by its final value alone. So the CPU backend also runs each pass at the timing size, but only
some of its blocks: the first and last EDGE, and DRAWN more between them drawn from the run's secret seed,
every one of them checked for races and bounds. The first pass's blocks are measured for the technique
(autograder.technique, which holds these measurements to the same thresholds on their own): the first pass is
nearly all of what the GPU times, and a technique kept to it would hide in an average over the later passes (red
team). Each pass's input holds what a timed call's would, hashed from the seed (random floats in the first, what
they reduce to in the later ones), where those blocks read (in whole pages); every other page of it faults when
read, so a kernel that looks outside its slice to tell this run from a timed call crashes. Each of those blocks'
outputs is held to the contract.

The open stage may share its work out as it likes, so it is not sampled: its blocks need each other.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Iterator

import numpy as np

from autograder.backends.base import Backend, Buffer, Kernel
from autograder.launch import (
    WRONG_PASS,
    guard_finding,
    guard_length,
    guard_value,
    input_changed,
    launch_geometry,
    output_count,
    pass_sizes,
    quadrant_message,
    slice_message,
    sum_tolerance,
)
from autograder.records import Finding
from autograder.stages import MAX2D_BLOCK, Shape, Stage

EDGE = 16  # blocks at each end of a pass that run (a partial last block among them)
DRAWN = 64  # blocks between them that run, drawn from the seed: where a kernel that avoids the ends is caught
AT_TIMING_SIZE = "at the timing size"  # in what a sampled pass's failure says
AT_SCALE_HINT = (
    "right at every size checked, but not at the timing size, where the GPU times the kernel (the message says "
    "where): a kernel does the same at every size, and chooses no other code by n or by the grid's size. There only "
    "the pages that hold the sampled blocks' own slices can be read, so a block that reads outside its slice crashes"
)


def blocks_run(count: int, seed: int, number: int) -> np.ndarray:
    """The blocks (linear numbers) that run in pass `number` of `count` blocks: all of a small pass; else the
    first and last EDGE and DRAWN drawn between them from `seed`."""
    if count <= 2 * EDGE + DRAWN:
        return np.arange(count)
    drawn = EDGE + np.random.default_rng([seed, count, number]).choice(count - 2 * EDGE, DRAWN, replace=False)
    return np.unique(np.concatenate([np.arange(EDGE), drawn, np.arange(count - EDGE, count)]))


def values(indices: np.ndarray, seed: int, stands_for: int = 1, shape: Shape = Shape.SUM_1D) -> np.ndarray:
    """The input at `indices`, hashed from the index and `seed`, as a timed call's pass would read it, so that a
    kernel cannot tell this case from a timed call by its values. The first pass: random floats as the timed input
    holds (autograder.verify.draw, "random": multiples of 2^-24 in [0, 1), doubled, less 0.75). A later pass, each
    of whose values `stands_for` that many of the timed input's: their sum (drawn as a normal of the same mean and
    spread) or their max (drawn from the max's own distribution)."""
    unit = _unit(indices, seed)
    if stands_for == 1:
        return unit * np.float32(2.0) - np.float32(0.75)
    if shape is Shape.MAX_2D:  # a multiple of 2^-24 again, as every value of the timed input is
        largest = np.floor(unit.astype(np.float64) ** (1.0 / stands_for) * 2.0**24) / 2.0**24
        return largest.astype(np.float32) * np.float32(2.0) - np.float32(0.75)
    angle = 2.0 * np.pi * _unit(indices, seed ^ 0x5851F42D4C957F2D).astype(np.float64)
    normal = np.sqrt(-2.0 * np.log1p(-unit.astype(np.float64))) * np.cos(angle)
    return (0.25 * stands_for + np.sqrt(stands_for / 3.0) * normal).astype(np.float32)


def _unit(indices: np.ndarray, seed: int) -> np.ndarray:
    """A multiple of 2^-24 in [0, 1) for each index, hashed with `seed` (splitmix64's finaliser: every bit kept
    depends on every bit of the index, so neighbours share no pattern a block could recognise; a multiply alone
    left a fixed step from one value to the next)."""
    mixed = indices.astype(np.uint64)
    mixed += np.uint64(seed % 2**64)
    mixed *= np.uint64(0x9E3779B97F4A7C15)
    for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        mixed ^= mixed >> np.uint64(shift)
        mixed *= np.uint64(factor)
    mixed ^= mixed >> np.uint64(31)
    mixed >>= np.uint64(40)
    unit = mixed.astype(np.float32)
    unit *= np.float32(2.0**-24)
    return unit


class _Pass:
    """One pass at the timing size: the blocks that run, what they read, and what they must write."""

    def __init__(self, stage: Stage, size: tuple[int, ...], block_size: int, blocks: np.ndarray, number: int) -> None:
        self.stage, self.size, self.block_size, self.blocks = stage, size, block_size, blocks
        # How many of the timed input's values each of this pass's input values stands for.
        per_value = block_size * stage.elements_per_thread if stage.shape is Shape.SUM_1D else 4
        self.stands_for = per_value**number
        if stage.shape is Shape.SUM_1D:
            per_block = block_size * stage.elements_per_thread
            starts = blocks * per_block
            self.slices = [(int(s), min(size[0], int(s) + per_block)) for s in starts]
            self.outputs = blocks
            self.reads = np.concatenate([np.arange(first, last) for first, last in self.slices])
        else:
            width, height = size
            half_w, half_h = math.ceil(width / 2), math.ceil(height / 2)
            grid, _, _ = launch_geometry(stage, size, block_size)
            bx, by = MAX2D_BLOCK
            xs = (blocks % grid[0])[:, None] * bx + np.arange(bx)[None, :]
            ys = (blocks // grid[0])[:, None] * by + np.arange(by)[None, :]
            # Every output (x, y) of the blocks inside the half-size matrix, as flat arrays.
            x = np.repeat(xs, by, axis=1).ravel()
            y = np.tile(ys, (1, bx)).ravel()
            inside = (x < half_w) & (y < half_h)
            self.x, self.y = x[inside], y[inside]
            self.outputs = self.y * half_w + self.x
            quadrants = [(self.x + dx * half_w, self.y + dy * half_h) for dy in (0, 1) for dx in (0, 1)]
            neighbours = [(2 * self.x + dx, 2 * self.y + dy) for dy in (0, 1) for dx in (0, 1)]
            self.quadrants, self.neighbours = quadrants, neighbours
            self.reads = np.concatenate([
                (row * width + col)[(col < width) & (row < height)] for col, row in quadrants + neighbours
            ])

    def expected(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """What the sampled blocks must write, at `self.outputs` (float64), and how far from it float32 rounding
        may be (autograder.launch.sum_tolerance; none for a max)."""
        if self.stage.shape is Shape.MAX_2D:
            maxima = self._maxima(self.quadrants, seed)
            return maxima, np.zeros_like(maxima)
        slices = [self.values(np.arange(first, last), seed) for first, last in self.slices]
        sums = np.array([part.sum(dtype=np.float64) for part in slices])
        magnitudes = np.array([np.abs(part).sum(dtype=np.float64) for part in slices])
        per_block = self.block_size * self.stage.elements_per_thread
        return sums, sum_tolerance(per_block, self.stage.elements_per_thread, magnitudes)

    def _maxima(self, points: list[tuple[np.ndarray, np.ndarray]], seed: int) -> np.ndarray:
        width, height = self.size
        best = np.full(self.outputs.size, -np.inf)
        for col, row in points:
            inside = (col < width) & (row < height)
            found = np.full(self.outputs.size, -np.inf)
            found[inside] = self.values(row[inside] * width + col[inside], seed)
            best = np.maximum(best, found)
        return best

    def values(self, indices: np.ndarray, seed: int) -> np.ndarray:
        """This pass's input at `indices` (`values`)."""
        return values(indices, seed, self.stands_for, self.stage.shape)

    def wrong(self, output: np.ndarray, seed: int) -> str | None:
        """What is wrong with the sampled blocks' outputs, or None."""
        got = output[self.outputs].astype(np.float64)
        expected, tolerance = self.expected(seed)
        wrong = np.flatnonzero(~(np.abs(got - expected) <= tolerance))
        if wrong.size == 0:
            return None
        if self.stage.shape is Shape.SUM_1D:
            block = int(self.blocks[wrong[0]])
            first, last = self.slices[wrong[0]]
            return slice_message(block, got[wrong[0]], expected[wrong[0]], first, last - 1, wrong.size, got.size)
        if np.array_equal(got, self._maxima(self.neighbours, seed)):  # the baseline's step, as the cases accept
            return None
        at = wrong[0]
        half_w, half_h = math.ceil(self.size[0] / 2), math.ceil(self.size[1] / 2)
        x, y = int(self.x[at]), int(self.y[at])
        return quadrant_message(x, y, got[at], expected[at], half_w, half_h, self.size, wrong.size, got.size)


def grid_size(stage: Stage, size: tuple[int, ...], block_size: int) -> int:
    """How many blocks a pass over an input of `size` has."""
    grid, _, _ = launch_geometry(stage, size, block_size)
    return grid[0] * grid[1]


def passes(stage: Stage, size: tuple[int, ...], block_size: int, seed: int) -> Iterator[_Pass]:
    """The passes of a whole reduction at `size`, first to last, each with the blocks that run in it."""
    for number, pass_size in enumerate(pass_sizes(stage, size, block_size)):
        blocks = blocks_run(grid_size(stage, pass_size, block_size), seed, number)
        yield _Pass(stage, pass_size, block_size, blocks, number)


def reference(stage: Stage, size: tuple[int, ...], block_size: int, seed: int) -> tuple[float, float]:
    """The case's value: what the first pass's sampled blocks must write, summed (a sum) or their max (max2d),
    and its tolerance."""
    expected, tolerance = next(passes(stage, size, block_size, seed)).expected(seed)
    if stage.shape is Shape.MAX_2D:
        return float(expected.max()), 0.0
    return float(expected.sum()), float(tolerance.sum())


# --- run in the worker process -------------------------------------------------------------------------


def readable(reads: np.ndarray, count: int) -> list[tuple[int, int]]:
    """The ranges of whole pages of an input of `count` values that hold the indices `reads`, merged, in order."""
    per_page = mmap.PAGESIZE // 4
    pages = np.unique(reads // per_page)
    starts = np.flatnonzero(np.diff(pages, prepend=-2) != 1)
    ends = np.append(starts[1:], pages.size) - 1  # the last page of each run of consecutive ones
    return [
        (int(pages[a]) * per_page, min(count, (int(pages[b]) + 1) * per_page))
        for a, b in zip(starts, ends, strict=True)
    ]


def _readable_part(backend: Backend, buffer: Buffer, ranges: list[tuple[int, int]]) -> np.ndarray:
    """The values of `buffer` in `ranges`, one after another (the rest of it cannot be read)."""
    total = sum(last - first for first, last in ranges)
    evidence = backend.alloc(total)
    try:
        at = 0
        for first, last in ranges:
            backend.copy(buffer, evidence, last - first, start=first, to=at)
            at += last - first
        return backend.download(evidence, total)
    finally:
        backend.free(evidence)


def run(
    backend: Backend, kernel: Kernel, size: tuple[int, ...], block_size: int, seed: int
) -> tuple[float, str | None, tuple[Finding, ...]]:
    """Run every pass at `size` on its sampled blocks only (a CPU backend's `run_only`), each in an input of which
    only the pages they read can be read (`expose`): the first pass's value (as `reference`), where a pass broke
    the contract, and the writes past an output. An output's guard tail is as long as the grid at least, so that
    a block that writes g_out[b + gridDim.x] stays in it (a write past the guard tail lands in another buffer)."""
    stage = kernel.stage
    value, wrong, guards = math.nan, None, []
    for number, sampled in enumerate(passes(stage, size, block_size, seed)):
        count, written = math.prod(sampled.size), output_count(stage, sampled.size, block_size)
        guard = guard_length(stage, sampled.size, block_size)
        blocks = grid_size(stage, sampled.size, block_size)
        source, target = backend.alloc(count, guard), backend.alloc(written, max(guard, blocks))
        try:
            backend.fill(source, guard_value(stage.shape), start=count)
            backend.fill(target, math.nan)
            if sampled.blocks.size < blocks:
                # Only the pages the blocks that run read can be read: a kernel that looks elsewhere to tell this
                # run from a timed call (whose input is whole) faults, and crashes here.
                ranges = readable(sampled.reads, count)
                backend.expose(source, ranges)
            else:
                ranges = [(0, count)]
            indices = np.concatenate([np.arange(first, last) for first, last in ranges])
            data = sampled.values(indices, seed)
            at = 0
            for first, last in ranges:
                backend.write(source, data[at : at + last - first], offset=first)
                at += last - first
            grid, block, shared = launch_geometry(stage, sampled.size, block_size)
            backend.run_only(sampled.blocks, measured=number == 0)
            try:
                backend.launch(kernel, grid, block, shared, (source, target, *sampled.size))
            finally:
                backend.run_only(())
            output = backend.download(target)
            # Only the student's own input must stay as it was (later passes read the grader's scratch), and a timed
            # call reads it again: a mark left in it would tell the next call it is timed.
            now = _readable_part(backend, source, ranges) if number == 0 else data
            changed = np.flatnonzero(now.view(np.uint32) != data.view(np.uint32))
        finally:
            backend.free(source)
            backend.free(target)
        if (found := guard_finding(output[written:], written, number + 1, stage.kernel_name)) is not None:
            guards.append(found)
        if changed.size:
            guards.append(input_changed(int(indices[changed[0]]), changed.size, stage.kernel_name))
            wrong = wrong or f"{AT_TIMING_SIZE}, pass 1: {guards[-1].message}"
        if number == 0:
            got = output[sampled.outputs].astype(np.float64)
            value = float(got.sum()) if stage.shape is Shape.SUM_1D else float(got.max())
        if wrong is None and (found := sampled.wrong(output, seed)) is not None:
            wrong = f"{AT_TIMING_SIZE}, pass {number + 1} {WRONG_PASS}{found}"
    return value, wrong, tuple(guards)
