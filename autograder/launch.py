"""The grader's side of the launch contract, on top of any backend.

1-D stages: `kernel(g_in, g_out, n)` with `block_size` threads, `block_size * 4` bytes of dynamic shared
memory and enough blocks to cover `n` at the stage's elements per thread. Block `b` writes its partial sum to
`g_out[b]`. Passes repeat until one value remains.

max2d: `kernel(g_in, g_out, width, height)` with one thread per output element in MAX2D_BLOCK blocks. It writes
the ceil(width/2) x ceil(height/2) matrix of quadrant maxima. Steps repeat until 1 x 1.

Every buffer carries a guard tail. Inputs are followed by values that spoil the result if read (NaN for a sum,
+inf for a max), so a missing bounds check shows on any backend. Outputs are poisoned with NaN before each pass
and their guard tails are checked afterwards, so a kernel that leaves an output unwritten or writes past its end
is caught. The input is read-only (`const float *g_in`): after a checked run the first pass's input is compared
with what was loaded, so a kernel that writes it fails on every backend, not only where a later call reuses it.

A checked run also keeps what every pass wrote, so that each pass can be held to the contract (`wrong_output`):
the right final value from wrong passes (block 0 adding everything, a 1-D max over a max2d matrix) is not the
kernel the contract asks for.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from autograder.backends.base import Backend, Buffer, Kernel
from autograder.records import Finding
from autograder.stages import MAX2D_BLOCK, Shape, Stage

GUARD_MIN = 4096  # values after every buffer, at least
POISON = float("nan")
UNIT_ROUNDOFF = 2.0**-24  # float32
WRONG_PASS = "of the reduction: "  # in what `Plan.wrong_output` says


def sum_tolerance(count: int, elements_per_thread: int, magnitude: float | np.ndarray) -> float | np.ndarray:
    """The bound a correct float32 sum of `count` values meets, whose absolute values sum to `magnitude`: a tree
    of depth log2(count) with up to `elements_per_thread` sequential adds per thread (the classic bound for
    recursive summation), with a factor of two to spare."""
    depth = math.ceil(math.log2(max(count, 2))) + elements_per_thread + 2
    return 2.0 * depth * UNIT_ROUNDOFF * magnitude


def guard_value(shape: Shape) -> float:
    """What fills an input's guard tail: a value that spoils the reduction if a kernel reads it."""
    return float("nan") if shape is Shape.SUM_1D else float("inf")


def guard_length(stage: Stage, size: tuple[int, ...], block_size: int) -> int:
    """How many guard values follow a buffer: more than a kernel without bounds checks reads past the end,
    that is one block's slice for a sum, and a whole row (the quadrant below the last) for max2d."""
    reach = block_size * stage.elements_per_thread if stage.shape is Shape.SUM_1D else 2 * size[0]
    return max(GUARD_MIN, reach)


def pass_sizes(stage: Stage, size: tuple[int, ...], block_size: int) -> list[tuple[int, ...]]:
    """The input size of every pass, first to last: (n,) for a sum, (width, height) for max2d."""
    sizes = [size]
    while True:
        current = sizes[-1]
        if stage.shape is Shape.SUM_1D:
            following: tuple[int, ...] = (math.ceil(current[0] / (block_size * stage.elements_per_thread)),)
        else:
            following = (math.ceil(current[0] / 2), math.ceil(current[1] / 2))
        if math.prod(following) == 1 or following == current:
            return sizes
        sizes.append(following)


def launch_geometry(
    stage: Stage, size: tuple[int, ...], block_size: int
) -> tuple[tuple[int, int], tuple[int, int], int]:
    """(grid, block, dynamic shared bytes) of one pass over an input of `size`."""
    if stage.shape is Shape.SUM_1D:
        blocks = math.ceil(size[0] / (block_size * stage.elements_per_thread))
        return (blocks, 1), (block_size, 1), block_size * 4
    out_w, out_h = math.ceil(size[0] / 2), math.ceil(size[1] / 2)
    bx, by = MAX2D_BLOCK
    return (math.ceil(out_w / bx), math.ceil(out_h / by)), (bx, by), 0


def output_count(stage: Stage, size: tuple[int, ...], block_size: int) -> int:
    grid, _, _ = launch_geometry(stage, size, block_size)
    if stage.shape is Shape.SUM_1D:
        return grid[0]
    return math.ceil(size[0] / 2) * math.ceil(size[1] / 2)


@dataclass
class Plan:
    """The buffers and launches of one whole reduction of one input size, allocated once and reusable.

    `input` holds `count` values plus the guard tail; write the data with `load`.
    """

    backend: Backend
    kernel: Kernel
    size: tuple[int, ...]
    block_size: int
    input: Buffer
    scratch: tuple[Buffer, Buffer]
    owns_input: bool = True
    loaded: np.ndarray | None = field(default=None, repr=False)  # what `load` wrote, to check it is unchanged
    _outputs: list[np.ndarray] | None = field(default=None, repr=False)  # what each pass of the last checked run wrote
    _result_buffer: Buffer | None = field(default=None, repr=False)

    @classmethod
    def create(
        cls,
        backend: Backend,
        kernel: Kernel,
        size: tuple[int, ...],
        block_size: int,
        shared_input: Buffer | None = None,
        guarded: bool = True,
    ) -> Plan:
        """A plan with its own input buffer, or reading `shared_input` (another plan's, of the same size).

        `guarded=False` allocates no guard tails, so that compute-sanitizer sees any access past the end."""
        stage = kernel.stage
        count = math.prod(size)
        first = output_count(stage, size, block_size)
        second = output_count(stage, pass_sizes(stage, size, block_size)[1], block_size) if first > 1 else 1
        guard = guard_length(stage, size, block_size) if guarded else 0
        input_buffer = shared_input
        if input_buffer is None:
            input_buffer = backend.alloc(count, guard)
            backend.fill(input_buffer, guard_value(stage.shape), start=count)
        scratch = (backend.alloc(first, guard), backend.alloc(second, guard))
        return cls(backend, kernel, size, block_size, input_buffer, scratch, owns_input=shared_input is None)

    @property
    def count(self) -> int:
        return math.prod(self.size)

    def load(self, data: np.ndarray) -> None:
        """Copy the input data (`count` float32 values) into the input buffer, before its guard tail."""
        self.loaded = data.astype(np.float32, copy=False).ravel()
        self.backend.write(self.input, self.loaded)

    def poison(self) -> None:
        """Fill both scratch buffers, guard tails included, with NaN."""
        for buffer in self.scratch:
            self.backend.fill(buffer, POISON)

    def run(self, *, check_each_pass: bool = False) -> tuple[Finding, ...]:
        """Launch every pass. With `check_each_pass`, poison each output first and check its guard after.

        Without it the launches are queued back to back, as a timed call needs; call `poison` before.
        Returns the guard findings, and an input_changed finding where the kernel wrote its input (always
        empty without `check_each_pass`).

        A checked run waits for the device once, not once a pass: what it checks is copied aside on the device
        as it goes (each output, guard tail included, as its pass left it, before that tail becomes the next
        pass's input guard; then the input), and read back in one download at the end. On a GPU that other
        processes use at the same time, each wait is also a wait for their turns (README, "Large classes").
        """
        stage = self.kernel.stage
        sizes = pass_sizes(stage, self.size, self.block_size)
        self._outputs = None
        evidence = None
        if check_each_pass:
            written = [output_count(stage, size, self.block_size) for size in sizes]
            lengths = [self.scratch[index % 2].physical_count for index in range(len(sizes))]
            starts = list(itertools.accumulate([0, *lengths]))  # each pass's output, then the input
            evidence = self.backend.alloc(starts[-1] + self.input.physical_count)
        try:
            source = self.input
            for index, size in enumerate(sizes):
                target = self.scratch[index % 2]
                grid, block, shared = launch_geometry(stage, size, self.block_size)
                if evidence is not None:
                    self.backend.fill(target, POISON)
                self.backend.launch(self.kernel, grid, block, shared, (source, target, *size))
                if evidence is not None:
                    self.backend.copy(target, evidence, lengths[index], to=starts[index])
                    # The guard tail of this output is the next pass's input guard.
                    self.backend.fill(target, guard_value(stage.shape), start=written[index])
                source = target
            self._result_buffer = source
            if evidence is None:
                return ()
            self.backend.copy(self.input, evidence, self.input.physical_count, to=starts[-1])
            self.backend.synchronize()
            seen = self.backend.download(evidence)
        finally:
            if evidence is not None:
                self.backend.free(evidence)
        outputs = [seen[starts[index] : starts[index + 1]] for index in range(len(sizes))]
        self._outputs = [output[:count] for output, count in zip(outputs, written, strict=True)]
        guards = [
            guard_finding(output[count:], count, index + 1, stage.kernel_name)
            for index, (output, count) in enumerate(zip(outputs, written, strict=True))
        ]
        return (*(found for found in guards if found is not None), *self._check_input(seen[starts[-1] :]))

    def wrong_output(self, first: Expected | None = None) -> str | None:
        """Where the last checked run's passes broke the contract, or None: each pass's output against what the
        contract makes of that pass's input (the first pass's as loaded, every later one's as the pass before
        wrote it). For a sum, block b's sum of its slice, within float32 rounding (exactly where the values are
        whole numbers); for max2d, the quadrant maxima (or the baseline's maxima of 2 x 2 neighbours), exactly.
        The open stage's blocks may share the work out as they like: only its final value counts.

        `first`: what `expect` made of the loaded input, where the caller kept it (a worker holds every case's
        input for all the students it serves, and the first pass's expectation with it: autograder.verify)."""
        stage = self.kernel.stage
        if stage.optional or self.loaded is None or self._outputs is None:
            return None
        source = self.loaded
        sizes = pass_sizes(stage, self.size, self.block_size)
        for number, (size, output) in enumerate(zip(sizes, self._outputs, strict=True)):
            expected = first if number == 0 and first is not None else expect(stage, source, size, self.block_size)
            wrong = expected.wrong(output)
            if wrong is not None:
                return f"pass {number + 1} {WRONG_PASS}{wrong}"
            source = output
        return None

    def result(self) -> float:
        """The single value the last `run` left."""
        if self._outputs is not None:  # read back by the checked run
            return float(self._outputs[-1][0])
        self.backend.synchronize()
        return float(self.backend.download(self._result_buffer, 1)[0])

    def _check_input(self, now: np.ndarray) -> list[Finding]:
        """The first pass's input, guard tail included, as the last pass left it, against what was loaded: only
        the student's own input must stay unchanged (later passes read the grader's scratch buffers)."""
        if self.loaded is None:
            return []
        now = now.view(np.uint32)
        count, guard = self.loaded.size, np.float32(guard_value(self.kernel.stage.shape)).view(np.uint32)
        changed = np.concatenate([  # compared in place: the input may be 2^22 values, the guard a few
            np.flatnonzero(now[:count] != self.loaded.view(np.uint32)), count + np.flatnonzero(now[count:] != guard)
        ])
        return [input_changed(int(changed[0]), changed.size, self.kernel.stage.kernel_name)] if changed.size else []

    def release(self) -> None:
        for buffer in (self.input, *self.scratch) if self.owns_input else self.scratch:
            self.backend.free(buffer)


def input_changed(first: int, count: int, kernel_name: str) -> Finding:
    """That a kernel wrote its read-only input: `count` values, the first at index `first`."""
    return Finding(
        kind="input_changed",
        message=(
            f"the kernel changed its input g_in (first at index {first}, {count} values in all): the input is "
            "read-only (const float *); reduce in shared memory or registers"
        ),
        kernel=kernel_name,
    )


def guard_finding(tail: np.ndarray, written: int, pass_number: int, kernel_name: str) -> Finding | None:
    """What a pass that wrote `written` values did past them, where its output's guard `tail` is not all NaN."""
    touched = np.flatnonzero(~np.isnan(tail))
    if touched.size == 0:
        return None
    return Finding(
        kind="output_guard",
        message=(
            f"pass {pass_number} wrote g_out[{written + int(touched[0])}], past the {written} values it should write "
            "(one per block for a sum, ceil(w/2) x ceil(h/2) for max2d)"
        ),
        kernel=kernel_name,
    )


def expect(stage: Stage, values: np.ndarray, size: tuple[int, ...], block_size: int) -> Expected:
    """What the contract makes of one pass's input `values` (of `size`): a sum's block sums, max2d's quadrant
    maxima."""
    if stage.shape is Shape.MAX_2D:
        return QuadrantMaxima.of(values, size)
    per_block = block_size * stage.elements_per_thread
    tolerance: float | np.ndarray = 0.0
    if not np.array_equal(values, np.rint(values)):  # whole numbers sum exactly in any order
        tolerance = sum_tolerance(per_block, stage.elements_per_thread, _slice_sums(np.abs(values), per_block))
    return BlockSums(values.size, per_block, _slice_sums(values, per_block), tolerance)


@dataclass(frozen=True)
class BlockSums:
    """The sum of each block's slice of an input of `count` values, and how far from it float32 rounding may be."""

    count: int
    per_block: int
    sums: np.ndarray  # float64
    tolerance: float | np.ndarray

    def wrong(self, output: np.ndarray) -> str | None:
        """What is wrong with `output` as these sums, or None."""
        wrong = np.flatnonzero(~(np.abs(output.astype(np.float64) - self.sums) <= self.tolerance))
        if wrong.size == 0:
            return None
        block = int(wrong[0])
        first, last = block * self.per_block, min(self.count, (block + 1) * self.per_block) - 1
        return slice_message(block, output[block], self.sums[block], first, last, wrong.size, output.size)


def slice_message(block: int, got: float, expected: float, first: int, last: int, wrong: int, total: int) -> str:
    """What is wrong where block `block` wrote `got` for its slice g_in[first..last], which sums to `expected`."""
    return (
        f"g_out[{block}] = {float(got):.9g}, but block {block}'s slice, g_in[{first}] to g_in[{last}], sums to "
        f"{float(expected):.9g} ({wrong} of {total} blocks wrong): block b writes the sum of its own slice to "
        "g_out[b], and nothing else, even where the final sum comes out right"
    )


def _slice_sums(values: np.ndarray, per_block: int) -> np.ndarray:
    """The float64 sum of each slice of `per_block` values, the last one cut short by the end."""
    whole = values.size - values.size % per_block
    sums = values[:whole].reshape(-1, per_block).sum(axis=1, dtype=np.float64)
    return np.append(sums, values[whole:].sum(dtype=np.float64)) if whole < values.size else sums


@dataclass(frozen=True)
class QuadrantMaxima:
    """The quadrant maxima of the `width x height` matrix `values`."""

    size: tuple[int, ...]
    values: np.ndarray
    maxima: np.ndarray

    @classmethod
    def of(cls, values: np.ndarray, size: tuple[int, ...]) -> QuadrantMaxima:
        padded = _padded(values, size)
        half_h, half_w = padded.shape[0] // 2, padded.shape[1] // 2
        top = np.maximum(padded[:half_h, :half_w], padded[:half_h, half_w:])
        return cls(size, values, np.maximum(top, np.maximum(padded[half_h:, :half_w], padded[half_h:, half_w:])))

    def wrong(self, output: np.ndarray) -> str | None:
        """What is wrong with `output` as these maxima, or None."""
        half_h, half_w = self.maxima.shape
        got = output.reshape(half_h, half_w)
        wrong = np.argwhere(~(got == self.maxima))
        if wrong.size == 0 or np.array_equal(got, self._neighbour_maxima()):
            return None
        y, x = (int(index) for index in wrong[0])
        return quadrant_message(x, y, got[y, x], self.maxima[y, x], half_w, half_h, self.size, len(wrong), got.size)

    def _neighbour_maxima(self) -> np.ndarray:
        """The baseline's step, the max of each 2 x 2 block of neighbours: the same reduction without the quadrant
        loads, accepted as a step (the stage's technique check, not its correctness, tells it apart)."""
        half_h, half_w = self.maxima.shape
        return _padded(self.values, self.size).reshape(half_h, 2, half_w, 2).max(axis=(1, 3))


def quadrant_message(
    x: int, y: int, got: float, expected: float, half_w: int, half_h: int, size: tuple[int, ...], wrong: int, total: int
) -> str:
    """What is wrong where a step wrote `got` at (x, y), whose quadrants' max is `expected`."""
    width, height = size
    return (
        f"out({x}, {y}) = {float(got):.9g}, but the max of in({x}, {y}), in({x + half_w}, {y}), in({x}, {y + half_h}) "
        f"and in({x + half_w}, {y + half_h}) (those inside the {width} x {height} matrix) is {float(expected):.9g} "
        f"({wrong} of {total} wrong): each step writes the quadrant maxima, even where the final max comes out right"
    )


def _padded(values: np.ndarray, size: tuple[int, ...]) -> np.ndarray:
    """A `width x height` matrix with a row and a column of -inf where a side is odd."""
    width, height = size
    padded = np.full((2 * math.ceil(height / 2), 2 * math.ceil(width / 2)), -np.inf, dtype=np.float32)
    padded[:height, :width] = values.reshape(height, width)
    return padded


Expected = BlockSums | QuadrantMaxima
