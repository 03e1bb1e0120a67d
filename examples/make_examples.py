"""Build the example class in examples/submissions/ from the reference kernels plus each student's edits.

Every hand-in starts from the reference kernels in solutions/reduction/kernels/ and changes only what its
student got wrong, so the examples follow the references when those change. An edit names the exact reference
text it replaces; when a reference no longer holds that text, the build stops and says which edit to update.

    .venv/bin/python examples/make_examples.py            # rewrite examples/submissions/*.ipynb
    .venv/bin/python examples/make_examples.py --out DIR  # write them somewhere else (the tests compare)

What each hand-in shows, stage by stage, is in examples/submissions/EXPECTED.toml.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from autograder.notebook import kernel_cell
from autograder.stages import STAGES, get_stage

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_DIR = ROOT / "solutions" / "reduction" / "kernels"
DEFAULT_OUT = ROOT / "examples" / "submissions"


class EditError(Exception):
    """An edit no longer applies to the reference kernel it was written for."""


@dataclass(frozen=True)
class Replace:
    """Replace `old`, which must occur exactly once in the reference kernel, by `new`."""

    old: str
    new: str

    def apply(self, text: str, where: str) -> str:
        count = text.count(self.old)
        if count != 1:
            raise EditError(
                f"{where}: the edit expects its text exactly once in the reference kernel, found it {count} times; "
                f"update the edit in examples/make_examples.py to match the reference. Text:\n{self.old}"
            )
        return text.replace(self.old, self.new)


@dataclass(frozen=True)
class ReplaceSpan:
    """Replace everything from `start` to the end of `end` by `new`; each must occur exactly once."""

    start: str
    end: str
    new: str

    def apply(self, text: str, where: str) -> str:
        for marker in (self.start, self.end):
            if text.count(marker) != 1:
                raise EditError(
                    f"{where}: the edit's marker is not exactly once in the reference kernel; update the edit in "
                    f"examples/make_examples.py to match the reference. Marker:\n{marker}"
                )
        first = text.index(self.start)
        last = text.index(self.end) + len(self.end)
        if last <= first:
            raise EditError(f"{where}: the edit's end marker comes before its start marker")
        return text[:first] + self.new + text[last:]


@dataclass(frozen=True)
class Stub:
    """Leave the released stub in the cell: the stage is not attempted."""


@dataclass(frozen=True)
class Missing:
    """Delete the stage's cell from the notebook altogether."""


@dataclass(frozen=True)
class RawCell:
    """The stage's cell holds this Python source instead of a string literal."""

    source: str


# What a student did to one stage: edits of the reference kernel, or one of the special cases.
StageChange = tuple[Replace | ReplaceSpan, ...] | Stub | Missing | RawCell


@dataclass(frozen=True)
class Student:
    name: str
    intro: str  # the hand-in's markdown cell: what the student says about it
    changes: Mapping[str, StageChange] = field(default_factory=dict)
    variable: Callable[[str], str] | None = None  # the cell's variable name per stage, if not the default
    banner: str = ""  # a comment the student put on top of every kernel


def reference_kernel(stage_id: str) -> str:
    return (REFERENCE_DIR / f"{stage_id}.cu").read_text()


# Stages every example student leaves as released unless said otherwise: the open stage is optional.
_OPTIONAL_UNTOUCHED: dict[str, StageChange] = {stage.id: Stub() for stage in STAGES if stage.optional}

_NAIVE_UNGUARDED_LOAD = Replace(
    old=(
        "    // Threads past the end still take part in the tree, so they load the sum's identity, 0.\n"
        "    sdata[tid] = (i < n) ? g_in[i] : 0.0f;\n"
    ),
    new="    sdata[tid] = g_in[i];\n",
)

_MAX2D_UNGUARDED_QUADRANTS = Replace(
    old=(
        "    bool has_right = x + half_w < width;\n"
        "    bool has_below = y + half_h < height;\n"
        "    size_t row = (size_t)y * width;\n"
        "    size_t row_below = (size_t)(y + half_h) * width;\n"
        "\n"
        "    float m = g_in[row + x];\n"
        "    if (has_right) {\n"
        "        m = fmaxf(m, g_in[row + x + half_w]);\n"
        "    }\n"
        "    if (has_below) {\n"
        "        m = fmaxf(m, g_in[row_below + x]);\n"
        "    }\n"
        "    if (has_right && has_below) {\n"
        "        m = fmaxf(m, g_in[row_below + x + half_w]);\n"
        "    }\n"
    ),
    new=(
        "    size_t row = (size_t)y * width;\n"
        "    size_t row_below = (size_t)(y + half_h) * width;\n"
        "    float m = fmaxf(fmaxf(g_in[row + x], g_in[row + x + half_w]),\n"
        "                    fmaxf(g_in[row_below + x], g_in[row_below + x + half_w]));\n"
    ),
)

_SEQUENTIAL_TREE_WITHOUT_BARRIER = Replace(
    old="            sdata[tid] += sdata[tid + s];\n        }\n        __syncthreads();\n    }\n",
    new="            sdata[tid] += sdata[tid + s];\n        }\n    }\n",
)

# The pre-sm_70 idiom: relies on the 32 lanes running in lockstep, which Volta and later no longer promise.
_VOLATILE_LAST_WARP = ReplaceSpan(
    start="    if (tid < 32) {\n",
    end="            g_out[blockIdx.x] = v;\n        }\n    }\n",
    new=(
        "    if (tid < 32) {\n"
        "        // one warp left: no syncs needed, volatile stops the compiler caching values in registers\n"
        "        volatile float *vs = sdata;\n"
        "        vs[tid] += vs[tid + 32];\n"
        "        vs[tid] += vs[tid + 16];\n"
        "        vs[tid] += vs[tid + 8];\n"
        "        vs[tid] += vs[tid + 4];\n"
        "        vs[tid] += vs[tid + 2];\n"
        "        vs[tid] += vs[tid + 1];\n"
        "    }\n"
        "    if (tid == 0) {\n"
        "        g_out[blockIdx.x] = sdata[0];\n"
        "    }\n"
    ),
)

# Correct, but one thread per block walks the block's elements in global memory, one load after another, while
# the block's other threads idle: about 4x slower than the reference on an H200.
_SEQUENTIAL_SERIAL_SUM = ReplaceSpan(
    start="    extern __shared__ float sdata[];\n",
    end="        g_out[blockIdx.x] = sdata[0];\n    }\n}\n",
    new=(
        "    unsigned int tid = threadIdx.x;\n"
        "    // sequential addressing: thread 0 adds the block's elements in order, so there are no bank conflicts\n"
        "    if (tid == 0) {\n"
        "        unsigned int first = blockIdx.x * blockDim.x;\n"
        "        float total = 0.0f;\n"
        "        for (unsigned int k = 0; k < blockDim.x && first + k < n; ++k) {\n"
        "            total += g_in[first + k];\n"
        "        }\n"
        "        g_out[blockIdx.x] = total;\n"
        "    }\n"
        "}\n"
    ),
)

_FIRST_ADD_MISSING_SEMICOLON = Replace(
    old="    unsigned int tid = threadIdx.x;\n",
    new="    unsigned int tid = threadIdx.x\n",
)

CLASS: tuple[Student, ...] = (
    Student(
        name="alice",
        intro="Alice: every stage, including the open one.",
        changes={},
        variable=lambda stage_id: f"{stage_id}_kernel",
        banner="// Alice, final version.\n",
    ),
    Student(
        name="bob",
        intro="Bob: all required stages. I dropped the `if (i < n)` checks where I thought they were not needed.",
        changes={"naive": (_NAIVE_UNGUARDED_LOAD,), "max2d": (_MAX2D_UNGUARDED_QUADRANTS,), **_OPTIONAL_UNTOUCHED},
    ),
    Student(
        name="carol",
        intro="Carol: all required stages. Sequential addressing works on the small sizes I tried.",
        changes={"sequential": (_SEQUENTIAL_TREE_WITHOUT_BARRIER,), **_OPTIONAL_UNTOUCHED},
    ),
    Student(
        name="dave",
        intro="Dave: all required stages; the last warp uses the classic volatile trick from the slides.",
        changes={"unrolled_warp": (_VOLATILE_LAST_WARP,), **_OPTIONAL_UNTOUCHED},
    ),
    Student(
        name="erin",
        intro="Erin: all required stages. For sequential addressing I avoided bank conflicts my own way.",
        changes={"sequential": (_SEQUENTIAL_SERIAL_SUM,), **_OPTIONAL_UNTOUCHED},
    ),
    Student(
        name="frank",
        intro="Frank: all required stages (handed in in a hurry).",
        changes={"first_add": (_FIRST_ADD_MISSING_SEMICOLON,), **_OPTIONAL_UNTOUCHED},
    ),
    Student(
        name="grace",
        intro="Grace: I ran out of time for stage 5 and max2d; for the open stage I reuse my naive kernel.",
        changes={
            "unrolled_warp": Missing(),
            "max2d": Stub(),
            "open": RawCell('OPEN_SOURCE = NAIVE_SOURCE.replace("reduce_naive", "reduce_open")\n'),
        },
    ),
)


def student_kernel(student: Student, stage_id: str, change: tuple[Replace | ReplaceSpan, ...]) -> str:
    text = reference_kernel(stage_id)
    for edit in change:
        text = edit.apply(text, f"{student.name}/{stage_id}")
    return student.banner + text


def stage_cell(student: Student, stage_id: str) -> nbformat.NotebookNode | None:
    """The student's cell for one stage, or None when the student deleted it."""
    change = student.changes.get(stage_id, ())
    variable = student.variable(stage_id) if student.variable else None
    if isinstance(change, Missing):
        return None
    if isinstance(change, Stub):
        cell = kernel_cell(stage_id, get_stage(stage_id).stub_source(), variable)
    elif isinstance(change, RawCell):
        cell = kernel_cell(stage_id, "", variable)
        cell.source = change.source
    else:
        cell = kernel_cell(stage_id, student_kernel(student, stage_id, change), variable)
    # Fixed cell ids keep the files byte-for-byte reproducible (nbformat would draw random ones).
    cell.id = stage_id.replace("_", "-")
    return cell


def notebook(student: Student) -> nbformat.NotebookNode:
    intro = nbformat.v4.new_markdown_cell(f"# Parallel reduction: hand-in\n\n{student.intro}\n")
    intro.id = "intro"
    cells = [intro]
    for stage in STAGES:
        cell = stage_cell(student, stage.id)
        if cell is not None:
            cells.append(cell)
    book = nbformat.v4.new_notebook(cells=cells)
    book.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    book.metadata["language_info"] = {"name": "python"}
    return book


def build_class(out_dir: Path) -> list[Path]:
    """Write every example hand-in to `out_dir`/<student>.ipynb and return the paths, in class order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for student in CLASS:
        path = out_dir / f"{student.name}.ipynb"
        nbformat.write(notebook(student), path)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the notebooks")
    args = parser.parse_args(argv)
    try:
        paths = build_class(args.out)
    except EditError as error:
        parser.exit(1, f"error: {error}\n")
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
