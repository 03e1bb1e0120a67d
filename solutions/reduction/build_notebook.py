"""Build the nbgrader source notebook `reduction.ipynb` from the reference kernels and the text below.

The kernels in `kernels/<stage id>.cu` are the single source of truth: edit them (or the text here), then run

    .venv/bin/python solutions/reduction/build_notebook.py            # rewrite reduction.ipynb
    .venv/bin/python solutions/reduction/build_notebook.py --release  # ... and release it to assignments/
    .venv/bin/python solutions/reduction/build_notebook.py --check    # exit 1 if reduction.ipynb is stale

`--release` runs `nbgrader generate_assignment reduction --force` at the repository root.

It also writes `.github/classroom/autograding.json` beside the notebook: GitHub Classroom's tests, one per stage
worth points, each running the autograder's pytest plugin on the student's notebook through `tests/conftest.py`.
nbgrader releases both with the notebook.

Points and the block size come from the rubric (autograder/rubric.toml, or the file AUTOGRADER_RUBRIC names),
so rebuild after changing it.
Cell ids are fixed, so the same inputs always give the same file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from autograder.grade import GradeOptions
from autograder.nbgrade import GRADED_CELL_PREFIX, graded_cell
from autograder.notebook import NBGRADER_SCHEMA_VERSION, kernel_cell
from autograder.selfcheck import environment_rubric
from autograder.stages import MAX2D_BASELINE, MAX2D_BLOCK, STAGES, Stage

HERE = Path(__file__).resolve().parent
KERNELS = HERE / "kernels"
NOTEBOOK = HERE / "reduction.ipynb"
CLASSROOM = HERE / ".github" / "classroom" / "autograding.json"
CLASSROOM_TIMEOUT_MINUTES = 10  # per test: each grades the whole notebook, which takes about a minute on a CPU

# Cell grade_ids besides the stage ids (which the kernel cells carry).
SETUP_ID = "setup"
SUMMARY_ID = "summary"


def check_id(stage_id: str) -> str:
    return f"check_{stage_id}"


def graded_id(stage_id: str) -> str:
    return f"{GRADED_CELL_PREFIX}{stage_id}"


def variable(stage_id: str) -> str:
    return f"{stage_id.upper()}_SOURCE"


def reference_kernel(stage_id: str) -> str:
    return (KERNELS / f"{stage_id}.cu").read_text()


INTRO = """\
# Parallel reduction in CUDA

A *reduction* turns many values into one: a sum, a maximum, a count. It is the standard first lesson in GPU
performance, because the same algorithm (add pairs, then pairs of pairs, ...) runs several times faster once
it is written with the hardware in mind. In this assignment you write the classic sequence of reduction kernels.
Every stage keeps the idea of the stage before and removes one bottleneck, so each kernel should be measurably
faster than your previous one.

## How this notebook works

* Each stage has a **kernel cell**: a single Python assignment of a raw string that holds your CUDA C code, for
  example `NAIVE_SOURCE = r\"\"\"...\"\"\"`. Write the kernel inside the string. Helper `__device__`
  functions go inside the same string.
* The grader reads that string out of the cell **without running your Python**. Keep the cell exactly one
  assignment of a plain string literal: no f-string, no `open(...)`, no second statement. Do not rename the
  kernel, and do not delete or duplicate the cell.
* Under each kernel cell a **self-check** compiles your kernel, checks it on many input sizes, times it and
  compares it with your previous stage, with the same code that grades your hand-in. Run it as often as you
  like. It remembers the kernels you checked, so the speedup it shows is over *your* previous stage.
* Without an NVIDIA GPU the self-check runs your CUDA C on the **CPU backend**. That checks results and also
  reports data races, out-of-bounds accesses and deadlocks, which a GPU run cannot show, but it cannot measure
  speed; it also skips the largest inputs, to stay quick. On a GPU the self-check uses every input size, times
  your kernel, and also runs it through the CPU backend's race checker on a few small inputs, as the grader
  does.
* The graded cells under each self-check are hidden; they run the same grading when your hand-in is graded.

Run the next cell first.
"""

SETUP = """\
# Loads the self-check. It picks the GPU when PyCUDA finds one, and the CPU backend otherwise.
from autograder.selfcheck import check, summary
"""

CONTRACT = """\
## The contract between your kernels and the grader

The grader launches your kernels itself. Write them for exactly this launch.

**Stages 1-6 and the open stage (sums of a float array)**

* Signature: `__global__ void reduce_<stage>(const float *g_in, float *g_out, unsigned int n)`. Each stub has
  the exact name.
* Block size: **{block_size} threads**, one-dimensional. Do not hard-code it: use `blockDim.x` (it is always a
  power of two of at least 64).
* Shared memory: `blockDim.x * sizeof(float)` bytes of *dynamic* shared memory, which a kernel declares with an
  `extern __shared__ float` array of no size.
* Grid: just enough blocks to cover `n`, at one element per thread in stages 1-3, two in stages 4-6 and
  sixteen in the open stage. So a block of stage 1 owns elements `blockIdx.x * blockDim.x` to
  `blockIdx.x * blockDim.x + blockDim.x - 1`.
* Output: block `b` writes the sum of its elements to `g_out[b]`, and nothing else. No atomics are needed. It
  reads its own elements and nothing else of the input, and writes none of them. A kernel keeps nothing
  between launches: a `__device__` variable may hold scratch that a launch writes before it reads it (an atomic
  reads too, so a counter that carries over from launch to launch is not allowed).
* Passes: the grader launches your kernel again on the partial sums, pass after pass, until one value is left.
* Any `n` from 1 up: `n` is rarely a multiple of the block size, so the last block must ignore what lies past
  `n-1` (a thread with nothing to load contributes 0, the identity of a sum). The grader puts values that spoil
  the sum after the end of every input, and checks that nothing is written past the end of every output.
* What a kernel may call: `+`, `fmaxf`, `fminf`, `fabsf`, `sqrtf` and the other exact math, warp and atomic
  functions, `printf`. It allocates nothing (`malloc` and `new` are refused). Approximate or transcendental math (`expf`, `__expf`, `__fdividef`, `rsqrtf`, `sinf`,
  ...) and the clocks (`clock()`, `clock64()`) are refused: the grader also runs your kernel on its CPU, where
  they give other bits than on a GPU, and a reduction needs none of them. `__CUDA_ARCH__` may be read only in
  an `#if`.
* Time: each correctness case may take {case_seconds:g} s (more for large ones), and a stage's cases
  {stage_seconds:g} s together.

**Stage 7 (the maximum of a matrix)** has its own launch, described in its section.

## How it is graded

* **Correctness.** Sizes from 1 to several million, chosen to hit the edges (31, 32, 33, 255, 256, 257, ...),
  with two kinds of input: integer-valued floats, whose sums are exact, so any element dropped or added twice
  shows; and random floats, compared with a float64 sum within a tolerance that fits float32 arithmetic. Each
  grading run draws new inputs. Every pass is checked, not only the last value: in stages 1-6 each `g_out[b]`
  must be the sum of block `b`'s own elements, and in stage 7 each step's matrix the quadrant maxima.
* **The size you are timed at** (2^26 values, 8192 x 8192 for stage 7) is checked too, once every other case
  is right: every pass runs there on some of its blocks (the first, the last and some drawn at random), whose
  outputs, races and technique are checked as on the other cases; the rest of the input cannot be read there.
  A kernel that does something else for large inputs fails this case.
{undefined}
* **Speed** (on the grading GPU only). Your stage is timed side by side with your previous stage, with the L2
  cache flushed before every call, and the median of many calls counts. It must be faster than your previous
  stage by a factor derived from how much faster the reference solution is on that GPU, and not much slower
  than the reference of the same stage. A deliberately slow earlier stage therefore does not help.
* **Points** (from the rubric; on the CPU backend only the correctness points count):

{points_table}
"""

# What the rubric's [undefined_behaviour] verdict makes of a kernel whose result CUDA leaves undefined.
UNDEFINED = {
    "incorrect": """\
* **Undefined behaviour.** A data race, an access out of bounds, a `__syncthreads()` that only part of the
  block reaches, a warp operation that reads a lane not taking part: CUDA does not define what such a kernel
  computes, so the stage is incorrect even when its result is right (it may sum right on your GPU and wrong on
  the grader's, or on the CPU backend). The self-check names the line to fix.""",
    "penalty": """\
* **Races.** Data races, out-of-bounds accesses and similar defects found while your kernel runs cost part of
  the stage's correctness points even when the result is right.""",
}

STAGE_TEXT: dict[str, str] = {
    "naive": """\
## Stage 1: Naive, a tree in shared memory

Each block sums its own slice of the input:

1. Thread `t` copies its element from global memory into slot `t` of the shared array (0 when the element lies
   past `n`), and the whole block waits at `__syncthreads()`.
2. The block then adds in rounds. In the round with stride `s` (1, 2, 4, ...), every thread whose index is a
   multiple of `2*s` adds the slot `s` places to its right into its own slot: `if (t % (2*s) == 0)`. After
   log2(`blockDim.x`) rounds, slot 0 holds the sum of the block.
3. A round reads what *other warps* wrote in the round before, so every round ends with `__syncthreads()`.
4. Thread 0 writes slot 0 to `g_out[blockIdx.x]`.

**The bottleneck: divergence.** The 32 threads of a warp share one instruction stream. When only some lanes
take a branch, the warp still spends the time of the branch, with the other lanes switched off. Here the
working threads are spread across the whole block:

| round (stride `s`) | working lanes in every warp | warps with work (256 threads) |
|---|---|---|
| 1 | 16 of 32 (even lanes) | 8 of 8 |
| 2 | 8 of 32 | 8 of 8 |
| 4 | 4 of 32 | 8 of 8 |
| 8 | 2 of 32 | 8 of 8 |
| 16 | 1 of 32 | 8 of 8 |
| 32 | 1 lane, in every second warp | 4 of 8 |

So in the first five rounds every warp stays busy while most of its lanes do nothing. The `%` is an expensive
integer operation as well.
""",
    "anti_divergence": """\
## Stage 2: Anti-divergence, contiguous working threads

Keep the same pairs but hand them to different threads: thread `t` now works on the pair that starts at
slot `2*s*t` (and adds slot `2*s*t + s` into it), if that slot is inside the block. The work of a round is
then done by the *lowest-numbered* threads. With 256 threads, the round `s = 1` uses threads 0-127 (warps 0-3
fully, warps 4-7 not at all), `s = 2` uses threads 0-63, and so on. A warp is either all busy or all idle until
fewer than 32 threads are left, so the early rounds no longer diverge.

**The new bottleneck: shared-memory bank conflicts.** Shared memory is split into 32 banks; the 4-byte word
number `w` lives in bank `w mod 32`. Each bank delivers one word per cycle. When several lanes of one warp
access *different* words of the *same* bank, the access is split into as many transactions as the busiest
bank has words (lanes reading one and the same word are served together). In this stage, lane `t` reads
word `2*s*t`, so neighbouring lanes are `2*s` words apart:

| stride `s` | lane `t` reads word | banks hit by lanes 0-7 | lanes sharing each bank | transactions |
|---|---|---|---|---|
| 1 | `2t` | 0, 2, 4, 6, 8, 10, 12, 14 | 2 (lane `t` and lane `t+16`) | 2 |
| 2 | `4t` | 0, 4, 8, 12, 16, 20, 24, 28 | 4 | 4 |
| 4 | `8t` | 0, 8, 16, 24, 0, 8, 16, 24 | 8 | 8 |
| 8 | `16t` (lanes 0-15 work) | 0, 16, 0, 16, 0, 16, 0, 16 | 8 | 8 |

The second word of each pair, `2*s*t + s`, has the same pattern. This stage is still faster than stage 1
(about 1.5x on an H200), because divergence cost more than the conflicts do; the next stage removes them.
""",
    "sequential": """\
## Stage 3: Sequential addressing, no bank conflicts

Fold the block in halves instead. In the first round, the upper half of the slots is added onto the lower
half: thread `t < blockDim.x/2` adds slot `t + blockDim.x/2` into slot `t`. The next round folds the lower
half in two, and so on: the stride starts at `blockDim.x/2` and halves down to 1.

The working threads are still the lowest-numbered ones, so there is no divergence while at least 32 are
working. And now lane `t` reads words `t` and `t + s` and writes word `t`: the 32 lanes of a warp touch 32
consecutive words, which lie in 32 different banks.

| stride `s` | lane `t` reads words | banks hit by lanes 0-7 | lanes sharing each bank | transactions |
|---|---|---|---|---|
| 128 | `t`, `t+128` | 0, 1, 2, 3, 4, 5, 6, 7 | 1 | 1 |
| 64 | `t`, `t+64` | 0, 1, 2, 3, 4, 5, 6, 7 | 1 | 1 |
| any `s` | `t`, `t+s` | 0, 1, 2, 3, 4, 5, 6, 7 | 1 | 1 |

Start the stride at `blockDim.x/2`, not at a fixed 128, so that the kernel is right for any block size. The
order of the additions changes, so a random-float sum differs from stage 2 in its last bits; the grader's
tolerance allows for that.
""",
    "first_add": """\
## Stage 4: First add during load, no idle threads

In stage 3, half of the threads go idle straight after loading: the first round only needs threads below
`blockDim.x/2`. Give them real work before the tree starts. Each block now owns `2 * blockDim.x` elements, and
every thread adds two of them while loading, the element at its position in the first half of the block's slice
and the one `blockDim.x` places later. The grader launches **half as many blocks** for this stage (and the next
ones): `ceil(n / (2 * blockDim.x))`.

* Both loads stay coalesced: neighbouring lanes read neighbouring addresses in each of them.
* Each load needs its own bounds check. In the last block the second element, or both, may lie past `n`.
* The tree in shared memory is the one of stage 3.

Why it pays: the shared-memory tree costs the same per block, but there are half as many blocks, and each
thread has two independent global loads in flight, which is what a memory-bound kernel needs. On an H200
this step gave about 1.8x.
""",
    "unrolled_warp": """\
## Stage 5: Unrolling the last warp

Once the stride is 32 or less, only warp 0 has work, yet every round still pays for the loop's test and
increment, for a `__syncthreads()` that all the block's warps must reach, and for the idle warps evaluating the
`if`. Stop the loop once 64 values are left (stride greater than 32) and let warp 0 finish the last six steps
(strides 32, 16, 8, 4, 2, 1) alone, written out one after the other, without block barriers.

**Why `__syncwarp()` is needed.** Old versions of this code assumed that the 32 lanes of a warp always
execute in lockstep, and only declared the shared array `volatile`. Since Volta (compute capability 7.0),
*independent thread scheduling* gives every thread its own program counter: the hardware may interleave the
lanes of a warp in any order, even in code without branches. Nothing then guarantees that lane 0 reads slot 16
only after lane 16 has written it. That is a **data race**: it often gives the right sum anyway, and fails on
another GPU, with another compiler, or on another day. `volatile` only stops the compiler from keeping the
values in registers; it does not order one lane's accesses against another's.

`__syncwarp()` is a barrier for one warp: the lanes named in its mask (all 32 by default) wait for each other
there, and the shared-memory writes made before it are visible to all of them after it. In each unrolled step:

1. read the partner's slot and add it to a value in a register,
2. `__syncwarp()`, so every lane of the step has finished reading before anyone overwrites a slot,
3. write the register back to your own slot,
4. `__syncwarp()`, so every write is visible before the next step reads.

Every lane named in the mask must reach each `__syncwarp()`, so do not put one inside a branch that only some
lanes of the warp take. The self-check's race checker (CPU backend) reports a missing `__syncwarp()` as a race,
and the grader counts a race against the stage even when the sum is right. On an H200 this step gave about 1.3x.
""",
    "shuffle": """\
## Stage 6: Warp shuffle

The last warp still passes its partial sums through shared memory: every step is a store, a barrier and a
load. A *shuffle* lets a lane read another lane's register directly. `__shfl_down_sync(mask, v, d)` returns
the value of `v` held by the lane `d` places higher (a lane whose partner would be past lane 31 gets its own
value back). Adding the result for `d` = 16, 8, 4, 2, 1 leaves the warp's total in lane 0.

* No shared memory and no `__syncwarp()` in the last warp: a shuffle exchanges and synchronises in one
  instruction.
* The mask names the lanes that take part, and every one of them must execute the call. Call it where all 32
  lanes of the warp are active and pass `0xffffffff`; a mask that names a lane that never arrives is an error
  the race checker reports.
* Start from the 64 values left after the block-wide loop: each lane of warp 0 first adds its two slots into a
  register.

The gain is small (about 1.05x on an H200) but measurable, because the timing is repeated until it is precise.
""",
    "max2d": """\
## Stage 7: The maximum of a matrix, by quadrants

A second reduction, with another operator and another shape: the largest value of a `width x height` matrix of
floats, stored row by row (element `(x, y)` is `g_in[y * width + x]`).

Your kernel does **one step**. Let `W = ceil(width/2)` and `H = ceil(height/2)`. It writes the `W x H` matrix
(row by row, to `g_out[y * W + x]`) whose element `(x, y)` is the maximum of four inputs, one from each quadrant
of the input: `(x, y)`, `(x + W, y)`, `(x, y + H)` and `(x + W, y + H)`. The grader repeats the step on the output
until a single value is left.

* Signature: `__global__ void max2d(const float *g_in, float *g_out, unsigned int width, unsigned int height)`.
* Launch: one thread per *output* element, in blocks of {max2d_block} threads, on a two-dimensional grid that
  covers the output. The grid is rounded up to whole blocks, so some threads have no element and must do
  nothing. No shared memory is given.
* Edges: when a side is odd, the right (or lower) quadrants are one column (or row) short, so some partners lie
  outside the matrix: skip them. 1 x N and N x 1 matrices must work.
* Values can all be negative: a maximum that starts from 0 is wrong.

**Why quadrants.** The simple kernel below (shipped as the baseline) takes each 2 x 2 block of neighbours:
thread `x` reads columns `2x` and `2x + 1`, so in each load a warp touches 64 floats and uses half of them. With
quadrants, neighbouring threads read neighbouring words in each of the four loads, so every load of a warp is
one contiguous run of memory and nothing fetched is wasted. The speedup of this stage is measured against this
baseline:
""",
    "open": """\
## Open stage (optional): as fast as you can

Anything goes, within the contract of the sum stages. The grader launches this kernel with **sixteen elements
per thread**: `ceil(n / (16 * blockDim.x))` blocks of {block_size} threads, and block `b` writes the sum of its
`16 * blockDim.x` elements to `g_out[b]`. It is ranked on the class leaderboard by bandwidth; the rubric says
whether it earns points. Ideas that work:

* Loop over the thread's sixteen elements `blockDim.x` apart, so each load stays coalesced, and keep several
  independent partial sums so that many loads are in flight at once.
* Vectorised loads: a `float4` load reads 16 bytes in one instruction, from a 16-byte aligned address only;
  handle a slice that is cut short by `n` with plain loads.
* Reduce each warp with shuffles, meet in shared memory once, and finish with one more warp of shuffles.
* The ceiling is memory bandwidth. On an H200, CUB's sum reads about 4.4 TB/s at 2^28 floats; stage 6 reaches
  about 2.1 TB/s at 2^26.
""",
}

SUMMARY_TEXT = """\
## Summary

The table lists every stage you checked in this session, and the chart compares your speedups with the ones
required on this GPU. Rerun a stage's self-check after changing its kernel, then rerun this cell.
"""

KERNEL_COMMENT = "# Stage {number}, {title}: write your kernel inside the string, and keep this cell one assignment."

BASELINE_COMMENT = "# Read-only: the baseline kernel that the speedup of stage 7 is measured against."

CHECK_COMMENT = "# Self-check: compiles, checks and times the kernel above exactly as the grader does."

GRADED_COMMENT = """\
# Graded cell, hidden: when your hand-in is graded it grades the kernel cell above, in a separate process that
# reads the notebook file with the grader's own code (the self-check's), and shows the stage's points."""


def graded_source(stage_id: str) -> str:
    return f"{GRADED_COMMENT}\n### BEGIN HIDDEN TESTS\n{graded_cell(stage_id)}\n### END HIDDEN TESTS"


def _nbgrader(
    grade_id: str, *, grade: bool = False, solution: bool = False, locked: bool = False, points: float | None = None
) -> dict:
    metadata: dict = {
        "grade": grade,
        "grade_id": grade_id,
        "locked": locked,
        "schema_version": NBGRADER_SCHEMA_VERSION,
        "solution": solution,
        "task": False,
    }
    if points is not None:
        metadata["points"] = points
    return metadata


def _markdown(cell_id: str, text: str) -> NotebookNode:
    cell = nbformat.v4.new_markdown_cell(text.rstrip("\n"))
    cell.id = cell_id
    return cell


def _code(cell_id: str, source: str, nbgrader: dict) -> NotebookNode:
    cell = nbformat.v4.new_code_cell(source.rstrip("\n"))
    cell.id = cell_id
    cell.metadata["nbgrader"] = nbgrader
    return cell


def _kernel(stage: Stage) -> NotebookNode:
    # The whole assignment sits between the markers: ClearKernelSolutions puts the stage's stub in its place.
    assignment = kernel_cell(stage.id, reference_kernel(stage.id), variable(stage.id)).source.rstrip("\n")
    comment = KERNEL_COMMENT.format(number=stage.number, title=stage.title)
    source = f"{comment}\n# BEGIN SOLUTION\n{assignment}\n# END SOLUTION"
    return _code(f"{stage.id}-kernel", source, _nbgrader(stage.id, solution=True))


def _points_table() -> str:
    rubric = environment_rubric()
    rows = ["| # | stage | technique | correctness | speed | total |", "|---|---|---|---|---|---|"]
    for stage in STAGES:
        available = rubric.stages[stage.id]
        title = f"{stage.title} (optional)" if stage.optional else stage.title
        rows.append(
            f"| {stage.number} | `{stage.id}`: {title} | {stage.technique} | {available.correctness:g} "
            f"| {available.performance:g} | {available.correctness + available.performance:g} |"
        )
    return "\n".join(rows)


def _stage_cells(stage: Stage) -> list[NotebookNode]:
    rubric = environment_rubric()
    text = STAGE_TEXT[stage.id].format(block_size=rubric.block_size, max2d_block=f"{MAX2D_BLOCK[0]} x {MAX2D_BLOCK[1]}")
    cells = [_markdown(f"{stage.id}-text", text)]
    if stage.id == "max2d":
        baseline = kernel_cell(MAX2D_BASELINE.id, reference_kernel(MAX2D_BASELINE.id), variable(MAX2D_BASELINE.id))
        source = f"{BASELINE_COMMENT}\n{baseline.source}"
        cells.append(_code(f"{MAX2D_BASELINE.id}-kernel", source, _nbgrader(MAX2D_BASELINE.id, locked=True)))
    cells.append(_kernel(stage))
    check = f'{CHECK_COMMENT}\ncheck("{stage.id}", {variable(stage.id)})'
    cells.append(_code(f"{stage.id}-check", check, _nbgrader(check_id(stage.id), locked=True)))
    available = rubric.stages[stage.id]
    points = available.correctness + available.performance
    if points > 0:  # a stage worth nothing (the open stage, by default) gets no graded cell
        graded = graded_source(stage.id)
        metadata = _nbgrader(graded_id(stage.id), grade=True, locked=True, points=points)
        cells.append(_code(f"{stage.id}-points", graded, metadata))
    return cells


def build() -> NotebookNode:
    """The source notebook, from the kernels, the rubric and the text above."""
    rubric = environment_rubric()
    notebook = nbformat.v4.new_notebook()
    notebook.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    cells = [
        _markdown("intro", INTRO),
        _code("setup", SETUP, _nbgrader(SETUP_ID, locked=True)),
        _markdown("contract", CONTRACT.format(block_size=rubric.block_size, points_table=_points_table(),
                                              case_seconds=GradeOptions.case_seconds,
                                              stage_seconds=GradeOptions.stage_seconds,
                                              undefined=UNDEFINED[rubric.undefined])),
    ]
    for stage in STAGES:
        cells.extend(_stage_cells(stage))
    cells.append(_markdown("summary-text", SUMMARY_TEXT))
    cells.append(_code("summary", "summary()", _nbgrader(SUMMARY_ID, locked=True)))
    notebook.cells = cells
    nbformat.validate(notebook)
    return notebook


def render(notebook: NotebookNode) -> str:
    return nbformat.writes(notebook) + "\n"


def classroom_tests() -> dict:
    """GitHub Classroom's autograding.json: one test per stage worth points, passed when all the stage's checks pass."""
    rubric = environment_rubric()
    tests = []
    for stage in STAGES:
        available = rubric.stages[stage.id]
        points = available.correctness + available.performance
        if points > 0:
            tests.append({
                "name": f"{stage.number}. {stage.title} ({stage.id})",
                "setup": "",
                "run": f"python -m pytest -k {stage.id}",
                "input": "",
                "output": "",
                "comparison": "included",
                "timeout": CLASSROOM_TIMEOUT_MINUTES,
                "points": int(points) if points == int(points) else points,
            })
    return {"tests": tests}


def render_classroom() -> str:
    return json.dumps(classroom_tests(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if reduction.ipynb differs from a fresh build")
    parser.add_argument("--release", action="store_true", help="then regenerate assignments/ with nbgrader")
    args = parser.parse_args(argv)
    text = render(build())
    classroom = render_classroom()
    if args.check:
        for path, fresh in ((NOTEBOOK, text), (CLASSROOM, classroom)):
            if not path.exists() or path.read_text() != fresh:
                print(f"{path} is stale: run {Path(__file__).name} to rebuild it", file=sys.stderr)
                return 1
        return 0
    NOTEBOOK.write_text(text)
    print(f"wrote {NOTEBOOK}")
    CLASSROOM.parent.mkdir(parents=True, exist_ok=True)
    CLASSROOM.write_text(classroom)
    print(f"wrote {CLASSROOM}")
    return release() if args.release else 0


def release() -> int:
    """Regenerate assignments/reduction from solutions/ with nbgrader, as an instructor would."""
    # nbgrader runs `alembic` by name, so the environment's scripts folder must be on PATH.
    scripts = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{scripts}{os.pathsep}{os.environ.get('PATH', '')}"}
    command = [sys.executable, "-m", "nbgrader", "generate_assignment", "reduction", "--force"]
    return subprocess.run(command, cwd=HERE.parents[1], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
