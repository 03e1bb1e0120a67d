"""Mutants of a correct hand-in, graded through the class path on the CPU backend (issue 19): whatever a notebook
holds, its student gets a result file with a verdict and a message for every stage, and the grader never fails.

The mutants start from the example class's complete hand-in (`alice.ipynb`) at two levels:
- the notebook: its cells, their nbgrader metadata and sources, its format fields, the file's bytes. Most of
  these never reach a compiler, so they are cheap;
- the kernel: one stage's CUDA source renamed, retyped, cut, or given a nasty token. Each compiles (about a
  second), and every other stage must stay correct.

Hypothesis draws them, derandomized so that CI sees the same mutants on every run, and without shrinking: each try
is a class run, and every mutant says exactly what was done to it. The named cases at the end pin the verdict of
each kind of mutant, which a random test alone does not document.

Every run grades into one results folder with one seed, so the stages a mutant leaves alone come from the class
memo (autograder.memo) and cost nothing.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from autograder.batch import file_stem, grade_class
from autograder.cli import cli
from autograder.grade import GradeOptions
from autograder.records import Status, StudentResult, from_dict
from autograder.stages import STAGE_IDS, Stage, get_stage

ROOT = Path(__file__).resolve().parents[1]
ALICE = json.loads((ROOT / "examples" / "submissions" / "alice.ipynb").read_text())
SEED = 19
# A hang costs one case's limit: 3 s here rather than the default 30 (a quick case of a correct kernel takes
# well under a second on the CPU backend, and the largest quick case gets 0.7 s more for its elements).
OPTIONS = GradeOptions(backend="cpu", seed=SEED, quick=True, case_seconds=3.0)
STUDENT = "mutant"

# Each Hypothesis test is a few minutes' budget at most: the examples are class runs, and a failure is reported
# as found (no shrinking, which would grade the mutant hundreds of times more).
MUTANT_SETTINGS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example),
)


@dataclass(frozen=True)
class Mutant:
    """A hand-in's file, and what was done to the correct one to make it (what Hypothesis prints)."""

    description: str
    raw: bytes

    def __repr__(self) -> str:
        return f"Mutant({self.description!r})"


# The contract every student's result must keep, whatever the hand-in.


def check_result(data: dict, description: str) -> StudentResult:
    """The result file's content as a record, after checking it has every stage with a verdict and a message."""
    stages = data.get("stages", [])
    assert [stage.get("stage") for stage in stages] == list(STAGE_IDS), description
    for stage in stages:
        status = Status(stage["status"])  # a status the records know, or ValueError
        assert status is not Status.GRADER_ERROR, f"{description}: {stage['stage']}: {stage['message']}"
        assert isinstance(stage["message"], str) and stage["message"].strip(), f"{description}: {stage['stage']}"
    assert data.get("grader_errors") in ([], ()), f"{description}: {data.get('grader_errors')}"
    return from_dict(StudentResult, data)  # and it reads back, as the leaderboard and the exports read it


class ClassGrader:
    """Grades one mutant at a time as a class of one, always into the same results folder with the same seed."""

    def __init__(self, top: Path) -> None:
        self.submissions = top / "submissions"
        self.out = top / "results"
        self.submissions.mkdir()

    def grade(self, mutant: Mutant) -> StudentResult:
        """The student's result, read back from its file, after checking the run and the file keep the contract."""
        (self.submissions / f"{STUDENT}.ipynb").write_bytes(mutant.raw)
        written = self.out / f"{STUDENT}.json"
        written.unlink(missing_ok=True)
        run = grade_class(self.submissions, self.out, OPTIONS)
        assert run.failures == (), f"{mutant.description}: the grader failed: {run.failures}"
        assert not (self.out / "grader-failures.json").exists(), mutant.description
        assert written.is_file(), f"{mutant.description}: no result file"
        result = check_result(json.loads(written.read_text()), mutant.description)
        assert [r.student for r in run.results] == [STUDENT]
        return result


@pytest.fixture(scope="module")
def grader(tmp_path_factory: pytest.TempPathFactory) -> ClassGrader:
    return ClassGrader(tmp_path_factory.mktemp("mutants"))


# The correct hand-in's pieces.


def kernel_cell_index(notebook: dict, stage_id: str) -> int:
    return next(
        index
        for index, cell in enumerate(notebook["cells"])
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == stage_id
    )


def split_cell(source: str) -> tuple[str, str, str]:
    """A kernel cell's source as (what precedes the kernel's text, the text, what follows it)."""
    start = source.index('r"""') + len('r"""')
    end = source.rindex('"""')
    return source[:start], source[start:end], source[end:]


def kernel_text(stage_id: str) -> str:
    return split_cell("".join(ALICE["cells"][kernel_cell_index(ALICE, stage_id)]["source"]))[1]


def with_cell_source(stage_id: str, make: Callable[[str, str, str], str]) -> dict:
    """The correct notebook with one stage's cell source made by `make(head, kernel, tail)`."""
    notebook = copy.deepcopy(ALICE)
    cell = notebook["cells"][kernel_cell_index(notebook, stage_id)]
    cell["source"] = make(*split_cell("".join(cell["source"])))
    return notebook


def with_kernel(stage_id: str, kernel: str, escaped: bool = False) -> dict:
    """The correct notebook with another kernel for one stage: in a raw string as alice wrote it, or `escaped`, in
    the literal Python's repr() makes, through which any character (a null byte, a carriage return, a lone
    surrogate) reaches the kernel's text."""
    if escaped:
        return with_cell_source(stage_id, lambda head, _, tail: head.removesuffix('r"""') + repr(kernel) + tail[3:])
    return with_cell_source(stage_id, lambda head, _, tail: head + kernel + tail)


def file_of(notebook: object, ascii_only: bool = True) -> bytes:
    """A notebook as its file holds it. Without `ascii_only`, a lone surrogate becomes invalid UTF-8, as an editor
    that writes what it was given would leave it."""
    return json.dumps(notebook, indent=1, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


ALICE_FILE = file_of(ALICE)
KERNEL_NAMES = tuple(get_stage(stage_id).kernel_name for stage_id in STAGE_IDS)


# Notebook-level mutations: each changes the notebook in place and says what it did.

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
GRADE_IDS = st.sampled_from(
    [*STAGE_IDS, "naive2", "", "NAIVE", " naive", "naive ", "max2d_baseline", "naïve", "open\x00", "\ud800"]
)
NON_TEXT = st.sampled_from([3, None, True, 1.5, {"a": 1}, [1, 2], ["ok", 3], [None], [["nested"]]]) | JSON_VALUES

Edit = Callable[[dict, st.DrawFn], str]


def pick_cell(notebook: dict, draw: st.DrawFn) -> int | None:
    cells = notebook.get("cells")
    if not isinstance(cells, list) or not cells:
        return None
    return draw(st.integers(0, len(cells) - 1))


def cell_edit(edit: Callable[[dict, list, int, st.DrawFn], str]) -> Edit:
    """An edit of one cell, drawn among the notebook's cells; none where there is no list of cells left."""

    def apply(notebook: dict, draw: st.DrawFn) -> str:
        index = pick_cell(notebook, draw)
        if index is None:
            return "(no cells to edit)"
        return f"cell {index}: " + edit(notebook, notebook["cells"], index, draw)

    apply.__name__ = edit.__name__
    return apply


def metadata_edit(edit: Callable[[dict, st.DrawFn], str]) -> Edit:
    """An edit of a cell's nbgrader metadata; where the cell has none of the format's shape, it gets alice's first."""

    def apply(notebook: dict, cells: list, index: int, draw: st.DrawFn) -> str:
        cell = cells[index]
        if not isinstance(cell, dict):
            return "(not a dict)"
        if not isinstance(cell.get("metadata"), dict) or not isinstance(cell["metadata"].get("nbgrader"), dict):
            cell["metadata"] = copy.deepcopy(ALICE["cells"][1]["metadata"])
        return edit(cell["metadata"]["nbgrader"], draw)

    apply.__name__ = edit.__name__
    return cell_edit(apply)


@cell_edit
def delete_cell(notebook: dict, cells: list, index: int, draw: st.DrawFn) -> str:
    del cells[index]
    return "deleted"


@cell_edit
def duplicate_cell(notebook: dict, cells: list, index: int, draw: st.DrawFn) -> str:
    to = draw(st.integers(0, len(cells)))
    cells.insert(to, copy.deepcopy(cells[index]))
    return f"copied to {to}"


@cell_edit
def move_cell(notebook: dict, cells: list, index: int, draw: st.DrawFn) -> str:
    to = draw(st.integers(0, len(cells) - 1))
    cells.insert(to, cells.pop(index))
    return f"moved to {to}"


@cell_edit
def replace_cell(notebook: dict, cells: list, index: int, draw: st.DrawFn) -> str:
    cells[index] = draw(NON_TEXT)
    return f"replaced by {cells[index]!r}"


@cell_edit
def change_cell_key(notebook: dict, cells: list, index: int, draw: st.DrawFn) -> str:
    if not isinstance(cells[index], dict):
        return "(not a dict)"
    key = draw(st.sampled_from(["cell_type", "source", "metadata", "id", "outputs", "execution_count"]))
    if draw(st.booleans()):
        cells[index].pop(key, None)
        return f"{key} deleted"
    cells[index][key] = draw(st.sampled_from(["markdown", "raw", "code", "bogus"]) | NON_TEXT)
    return f"{key} = {cells[index][key]!r}"


@metadata_edit
def change_grade_id(nbgrader: dict, draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        nbgrader.pop("grade_id", None)
        return "grade_id deleted"
    nbgrader["grade_id"] = draw(GRADE_IDS | NON_TEXT)
    return f"grade_id = {nbgrader['grade_id']!r}"


@metadata_edit
def change_nbgrader_field(nbgrader: dict, draw: st.DrawFn) -> str:
    key = draw(st.sampled_from(["grade", "solution", "locked", "task", "schema_version", "points", "unknown"]))
    nbgrader[key] = draw(JSON_VALUES)
    return f"nbgrader.{key} = {nbgrader[key]!r}"


@cell_edit
def break_nbgrader(notebook: dict, cells: list, index: int, draw: st.DrawFn) -> str:
    cell = cells[index]
    if not isinstance(cell, dict):
        return "(not a dict)"
    value = draw(st.sampled_from(["naive", [], [{"grade_id": "naive"}], 3, None, True]) | JSON_VALUES)
    if draw(st.booleans()):
        cell["metadata"] = {"nbgrader": value}
        return f"metadata.nbgrader = {value!r}"
    cell["metadata"] = value
    return f"metadata = {value!r}"


SOURCE_FORMS: dict[str, Callable[[str, str, str], str]] = {
    "string": lambda head, kernel, tail: head + kernel + tail,
    "f-string": lambda head, kernel, tail: (
        head.replace('r"""', 'rf"""') + kernel.replace("{", "{{").replace("}", "}}") + tail
    ),
    "f-string of the kernel's braces": lambda head, kernel, tail: head.replace('r"""', 'rf"""') + kernel + tail,
    "a call": lambda head, kernel, tail: head.replace('r"""', 'str(r"""') + kernel + tail.replace('"""', '""")', 1),
    "two statements": lambda head, kernel, tail: head + kernel + tail + "print(len(naive_kernel))\n",
    "bytes literal": lambda head, kernel, tail: head.replace('r"""', 'rb"""') + kernel + tail,
    "an expression": lambda head, kernel, tail: head[head.index("r") :] + kernel + tail,
    "annotated": lambda head, kernel, tail: head.replace(" = ", ": str = ", 1) + kernel + tail,
    "augmented": lambda head, kernel, tail: head.replace(" = ", " += ", 1) + kernel + tail,
    "a tuple": lambda head, kernel, tail: head + kernel + tail.rstrip("\n") + ", 1\n",
    "a null byte in the cell": lambda head, kernel, tail: head + kernel.replace("{", "{\x00", 1) + tail,
    "a null byte in the string": lambda head, kernel, tail: head.replace('r"""', '"\\x00" r"""') + kernel + tail,
    "a lone surrogate in the cell": lambda head, kernel, tail: head + kernel.replace("//", "// \ud800", 1) + tail,
    "a lone surrogate in the string": lambda head, kernel, tail: head.replace('r"""', '"\\udc80" r"""') + kernel + tail,
    "parentheses 150 deep": lambda head, kernel, tail: (
        head.replace('r"""', "(" * 150 + 'r"""') + kernel + tail.replace('"""', '"""' + ")" * 150, 1)
    ),
    "parentheses 5000 deep": lambda head, kernel, tail: (
        head.replace('r"""', "(" * 5000 + 'r"""') + kernel + tail.replace('"""', '"""' + ")" * 5000, 1)
    ),
    "huge": lambda head, kernel, tail: head + "// padding\n" * 25_000 + kernel + tail,
    "empty": lambda head, kernel, tail: "",
    "only a comment": lambda head, kernel, tail: "# my kernel is in another cell\n",
}


@cell_edit
def change_source(notebook: dict, cells: list, index: int, draw: st.DrawFn) -> str:
    """The cell's source in another form: a non-literal, a string with bad characters, lines, or not text."""
    cell = cells[index]
    if not isinstance(cell, dict):
        return "(not a dict)"
    source = cell.get("source")
    text = "".join(source) if isinstance(source, list) and all(isinstance(s, str) for s in source) else source
    if not isinstance(text, str) or 'r"""' not in text or text.count('"""') < 2:
        text = "".join(ALICE["cells"][1]["source"])
    form = draw(st.sampled_from([*SOURCE_FORMS, "lines", "characters", "truncated", "not text"]))
    if form == "lines":
        cell["source"] = text.splitlines(keepends=True)
    elif form == "characters":
        cell["source"] = list(text)
    elif form == "truncated":
        cut = draw(st.integers(0, len(text)))
        cell["source"] = text[:cut]
        form = f"truncated at {cut}"
    elif form == "not text":
        cell["source"] = draw(NON_TEXT)
        form = f"source = {cell['source']!r}"
    else:
        cell["source"] = SOURCE_FORMS[form](*split_cell(text))
    return f"source as {form}"


def change_top_level(notebook: dict, draw: st.DrawFn) -> str:
    key = draw(st.sampled_from(["nbformat", "nbformat_minor", "cells", "metadata", "extra"]))
    if draw(st.booleans()):
        notebook.pop(key, None)
        return f"{key} deleted"
    notable = {
        "nbformat": [3, 5, "4", 4.0, None, True, -4],
        "nbformat_minor": [0, 4, 99, -1, "5", None, 5.5],
        "cells": [{}, None, "cells", [], {"0": ALICE["cells"][1]}],
        "metadata": [[], None, "x", {"kernelspec": 3}, {"nbgrader": None}],
        "extra": [{"nested": [1, 2]}, None],
    }[key]
    notebook[key] = draw(st.sampled_from(notable) | JSON_VALUES)
    return f"{key} = {notebook[key]!r}"


NOTEBOOK_EDITS: tuple[Edit, ...] = (
    delete_cell,
    duplicate_cell,
    move_cell,
    replace_cell,
    change_cell_key,
    change_grade_id,
    change_nbgrader_field,
    break_nbgrader,
    change_source,
    change_source,  # the richest kind: drawn twice as often
    change_top_level,
)


@st.composite
def notebook_mutants(draw: st.DrawFn) -> Mutant:
    notebook = copy.deepcopy(ALICE)
    done = []
    for _ in range(draw(st.integers(1, 3))):
        edit = draw(st.sampled_from(NOTEBOOK_EDITS))
        done.append(f"{edit.__name__} {edit(notebook, draw)}")
    ascii_only = draw(st.booleans())
    done.append("written as ASCII" if ascii_only else "written as UTF-8")
    return Mutant("; ".join(done), file_of(notebook, ascii_only))


# File-level mutations: the bytes of the file.

WHOLE_FILES = {
    "an empty file": b"",
    "whitespace": b" \n\t\n",
    "a JSON list": b"[]",
    "a list of cells": json.dumps(ALICE["cells"]).encode(),
    "a JSON number": b"4",
    "a JSON string": b'"notebook"',
    "null": b"null",
    "true": b"true",
    "an empty object": b"{}",
    "NaN": b"NaN",
    "lists 100000 deep": b"[" * 100_000 + b"]" * 100_000,
    "objects 3000 deep in the metadata": ALICE_FILE.replace(
        b'"metadata": {', b'"metadata": {"x": ' + b'{"x": ' * 3000 + b"1" + b"}" * 3000 + b", ", 1
    ),
    "lists 900 deep in a cell's metadata": ALICE_FILE.replace(
        b'"nbgrader": {', b'"deep": ' + b"[" * 900 + b"]" * 900 + b', "nbgrader": {', 1
    ),
    "a byte-order mark": b"\xef\xbb\xbf" + ALICE_FILE,
    "UTF-16": ALICE_FILE.decode().encode("utf-16"),
    "CRLF line ends": ALICE_FILE.replace(b"\n", b"\r\n"),
    "a JSON string escape of a lone surrogate": ALICE_FILE.replace(b"// Alice", b"// \\ud800Alice", 1),
    "an overlong UTF-8 slash": ALICE_FILE.replace(b"// Alice", b"/\xc0\xaf Alice", 1),
    "a NaN in the metadata": ALICE_FILE.replace(b'"schema_version": 3', b'"schema_version": NaN', 1),
    "two notebooks": ALICE_FILE + ALICE_FILE,
    "a duplicated key": ALICE_FILE.replace(b'"cells": [', b'"cells": [], "cells": [', 1),
}


@st.composite
def file_mutants(draw: st.DrawFn) -> Mutant:
    if draw(st.integers(0, 3)) == 0:
        name = draw(st.sampled_from(sorted(WHOLE_FILES)))
        return Mutant(name, WHOLE_FILES[name])
    raw = bytearray(ALICE_FILE)
    done = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "invalid UTF-8"]))
        at = draw(st.integers(0, len(raw)))
        if kind == "flip" and at < len(raw):
            mask = draw(st.integers(1, 255))
            raw[at] ^= mask
            done.append(f"byte {at} ^= {mask:#04x}")
        elif kind == "insert":
            new = draw(st.binary(min_size=1, max_size=4))
            raw[at:at] = new
            done.append(f"{new!r} inserted at {at}")
        elif kind == "delete":
            length = draw(st.integers(1, 64))
            del raw[at : at + length]
            done.append(f"{length} bytes deleted at {at}")
        elif kind == "truncate":
            del raw[at:]
            done.append(f"truncated at {at}")
        else:
            new = draw(st.sampled_from([b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\x80\x80"]))
            raw[at:at] = new
            done.append(f"{new!r} inserted at {at}")
    return Mutant("; ".join(done), bytes(raw))


# Kernel-level mutations: one stage's CUDA source.

NASTY_TOKENS = (
    "{", "}", ";", "#", '"', "'", "\\", "??)", "##", "#if 0", "#endif", "__syncthreads();", "return;", "while(1);",
    'printf("x");', "é", "g_out[-1]=0;", "g_out[1<<30]=0;",
    # Characters that reach the kernel's text only in an escaped literal (in a raw one, the cell is refused).
    "\x00", "\r", "\x0c", "\x1b[31m", "\u2028", "\ud800", '"""',
)  # fmt: skip
TOKEN = re.compile(r"\w+|\s+|.", re.DOTALL)


def parameters(stage: Stage) -> list[str]:
    return stage.signature[stage.signature.index("(") + 1 : -1].split(", ")


def with_parameters(kernel: str, stage: Stage, new: list[str]) -> str:
    declaration = f"{stage.kernel_name}({', '.join(parameters(stage))})"
    return kernel.replace(declaration, f"{stage.kernel_name}({', '.join(new)})", 1)


def retyped(stage: Stage, change: str) -> list[str]:
    """The contract's parameters with one change."""
    params = parameters(stage)
    *pointers, last = params
    if change in ("int", "size_t", "unsigned long", "long long", "float", "unsigned short"):
        return [*params[:-1], last.replace("unsigned int", change)]
    if change == "double":
        return [p.replace("float", "double") for p in pointers] + params[len(pointers) :]
    if change == "non-const input":
        return [params[0].replace("const ", ""), *params[1:]]
    if change == "an extra parameter":
        return [*params, "int extra"]
    if change == "fewer parameters":
        return params[:-1]
    if change == "swapped pointers":
        return [params[1], params[0], *params[2:]]
    assert change == "restrict and const", change  # the same kernel for the contract: still correct
    return [
        params[0].replace("*", "*__restrict__ "),
        params[1].replace("*", "*__restrict__ "),
        *(f"const {p}" for p in params[2:]),
    ]


PARAMETER_CHANGES = ("int", "size_t", "unsigned long", "long long", "float", "unsigned short", "double",
                     "non-const input", "an extra parameter", "fewer parameters", "swapped pointers",
                     "restrict and const")  # fmt: skip


def code_start(kernel: str) -> int:
    """Where the code begins, after the comments that open alice's kernels: edits of those would change nothing."""
    lines = kernel.split("\n")
    first = next((n for n, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("//")), 0)
    return len("\n".join(lines[:first]))


def kernel_edit(kernel: str, stage: Stage, draw: st.DrawFn) -> tuple[str, str]:
    """One edit of a stage's kernel text, and what it did."""
    kind = draw(st.sampled_from(["rename", "parameters", "template", "extern C", "token", "line", "nasty token",
                                 "nasty line", "truncate", "empty"]))  # fmt: skip
    declaration = f"__global__ void {stage.kernel_name}("
    contracts = f"{declaration}{', '.join(parameters(stage))})"
    if kind == "rename":
        name = draw(st.sampled_from([*KERNEL_NAMES, f"{stage.kernel_name}2", stage.kernel_name.upper(), "kernel"]))
        return kernel.replace(f" {stage.kernel_name}(", f" {name}("), f"kernel renamed {name}"
    if kind == "parameters" and contracts in kernel:
        change = draw(st.sampled_from(PARAMETER_CHANGES))
        return with_parameters(kernel, stage, retyped(stage, change)), f"parameters: {change}"
    if kind == "template" and declaration in kernel:
        head = draw(st.sampled_from(["template <typename T>", "template <int B>", "template <int B = 256>"]))
        return kernel.replace(declaration, f"{head}\n{declaration}", 1), head
    if kind == "extern C" and declaration in kernel:
        return kernel.replace(declaration, f'extern "C" {declaration}', 1), 'extern "C"'
    if kind in ("token", "nasty token"):
        tokens = TOKEN.findall(kernel)
        code = len(TOKEN.findall(kernel[: code_start(kernel)]))
        at = draw(st.integers(code, len(tokens)))
        if kind == "nasty token":
            token = draw(st.sampled_from(NASTY_TOKENS))
            tokens.insert(at, token)
            return "".join(tokens), f"{token!r} inserted before token {at}"
        if at == len(tokens):
            return kernel, "(no token)"
        if draw(st.booleans()):
            return "".join(tokens[:at] + tokens[at + 1 :]), f"token {at} ({tokens[at]!r}) deleted"
        return "".join(tokens[: at + 1] + tokens[at:]), f"token {at} ({tokens[at]!r}) doubled"
    if kind in ("line", "nasty line"):
        lines = kernel.split("\n")
        at = draw(st.integers(kernel[: code_start(kernel)].count("\n"), len(lines) - 1))
        if kind == "nasty line":
            token = draw(st.sampled_from(NASTY_TOKENS))
            lines.insert(at, token)
            return "\n".join(lines), f"line {token!r} inserted at line {at}"
        if draw(st.booleans()):
            return "\n".join(lines[:at] + lines[at + 1 :]), f"line {at} deleted"
        return "\n".join(lines[: at + 1] + lines[at:]), f"line {at} doubled"
    if kind == "truncate":
        cut = draw(st.integers(0, len(kernel)))
        return kernel[:cut], f"truncated at {cut}"
    if kind == "empty":
        return "", "emptied"
    return kernel, f"({kind}: no declaration of the contract's left)"


@st.composite
def kernel_mutants(draw: st.DrawFn) -> tuple[str, Mutant]:
    stage = get_stage(draw(st.sampled_from(STAGE_IDS)))
    kernel, done = kernel_text(stage.id), []
    for _ in range(draw(st.integers(1, 2))):
        kernel, what = kernel_edit(kernel, stage, draw)
        done.append(what)
    escaped = draw(st.booleans())
    done.append("in an escaped literal" if escaped else "in a raw literal")
    return stage.id, Mutant(f"{stage.id}: {'; '.join(done)}", file_of(with_kernel(stage.id, kernel, escaped)))


# The properties.


def test_the_mutants_start_from_a_hand_in_that_is_right_everywhere(grader: ClassGrader) -> None:
    result = grader.grade(Mutant("alice unchanged", ALICE_FILE))
    assert {stage.status for stage in result.stages} == {Status.CORRECT}


@settings(MUTANT_SETTINGS, max_examples=200)
@given(notebook_mutants())
def test_every_notebook_mutant_gets_a_verdict_for_every_stage(grader: ClassGrader, mutant: Mutant) -> None:
    grader.grade(mutant)


@settings(MUTANT_SETTINGS, max_examples=200)
@given(file_mutants())
def test_every_damaged_file_gets_a_verdict_for_every_stage(grader: ClassGrader, mutant: Mutant) -> None:
    grader.grade(mutant)


@settings(MUTANT_SETTINGS, max_examples=120)
@given(kernel_mutants())
def test_every_kernel_mutant_gets_a_verdict_and_leaves_the_other_stages_correct(
    grader: ClassGrader, mutated: tuple[str, Mutant]
) -> None:
    stage_id, mutant = mutated
    result = grader.grade(mutant)
    others = {s.stage: s.status for s in result.stages if s.stage != stage_id and s.status is not Status.CORRECT}
    assert others == {}, mutant.description


# Named cases: what each kind of mutant must get.

ALL = "*"  # every stage


@dataclass(frozen=True)
class Named:
    """A named mutant's file and what it must get: for each stage named (or ALL), a status and part of its
    message; every other stage is correct."""

    notebook: bytes
    expected: dict[str, tuple[Status, str]]


def kernel_case(stage_id: str, change: Callable[[str], str], status: Status, words: str) -> Named:
    return Named(file_of(with_kernel(stage_id, change(kernel_text(stage_id)))), {stage_id: (status, words)})


def source_case(stage_id: str, form: str, status: Status, words: str) -> Named:
    return Named(file_of(with_cell_source(stage_id, SOURCE_FORMS[form])), {stage_id: (status, words)})


def notebook_case(change: Callable[[dict], object], expected: dict[str, tuple[Status, str]]) -> Named:
    notebook = copy.deepcopy(ALICE)
    change(notebook)
    return Named(file_of(notebook), expected)


def unreadable(raw: bytes, words: str) -> Named:
    return Named(raw, {ALL: (Status.INVALID_CELL, words)})


def cell_of(notebook: dict, stage_id: str) -> dict:
    return notebook["cells"][kernel_cell_index(notebook, stage_id)]


def nbgrader_of(notebook: dict, stage_id: str) -> dict:
    return cell_of(notebook, stage_id)["metadata"]["nbgrader"]


def signature_with(stage_id: str, change: str) -> Callable[[str], str]:
    stage = get_stage(stage_id)
    return lambda kernel: with_parameters(kernel, stage, retyped(stage, change))


def inserted_before_first_barrier(line: str) -> Callable[[str], str]:
    return lambda kernel: kernel.replace("__syncthreads();", f"{line}\n    __syncthreads();", 1)


NOT_THE_CONTRACTS = "not with the contract's parameters"
NAMED: dict[str, Named] = {
    # The kernel.
    "first_add kernel renamed": kernel_case(
        "first_add",
        lambda k: k.replace("reduce_first_add(", "reduce_first_add2("),
        Status.COMPILE_ERROR,
        "no kernel named reduce_first_add",
    ),
    "naive with int n": kernel_case("naive", signature_with("naive", "int"), Status.COMPILE_ERROR, NOT_THE_CONTRACTS),
    "sequential with size_t n": kernel_case(
        "sequential", signature_with("sequential", "size_t"), Status.COMPILE_ERROR, NOT_THE_CONTRACTS
    ),
    "max2d on doubles": kernel_case(
        "max2d", signature_with("max2d", "double"), Status.COMPILE_ERROR, NOT_THE_CONTRACTS
    ),
    "anti_divergence with an extra parameter": kernel_case(
        "anti_divergence",
        signature_with("anti_divergence", "an extra parameter"),
        Status.COMPILE_ERROR,
        NOT_THE_CONTRACTS,
    ),
    "open with fewer parameters": kernel_case(
        "open", signature_with("open", "fewer parameters"), Status.COMPILE_ERROR, "was not declared"
    ),
    "naive with __restrict__ and const": kernel_case(
        "naive", signature_with("naive", "restrict and const"), Status.CORRECT, "correct"
    ),
    "unrolled_warp a template": kernel_case(
        "unrolled_warp",
        lambda k: k.replace("__global__", "template <typename T>\n__global__"),
        Status.COMPILE_ERROR,
        "no kernel named reduce_unrolled_warp",
    ),
    'shuffle as extern "C"': kernel_case(
        "shuffle", lambda k: k.replace("__global__", 'extern "C" __global__'), Status.CORRECT, "correct"
    ),
    "naive emptied": kernel_case("naive", lambda k: "", Status.NOT_ATTEMPTED, "not attempted"),
    "sequential cut in half": kernel_case(
        "sequential", lambda k: k[: len(k) // 2], Status.COMPILE_ERROR, "does not compile"
    ),
    "naive with an unterminated #if 0": kernel_case(
        "naive", inserted_before_first_barrier("#if 0"), Status.COMPILE_ERROR, "unterminated #if"
    ),
    "sequential with a trigraph": kernel_case(
        "sequential", inserted_before_first_barrier("??)"), Status.COMPILE_ERROR, "does not compile"
    ),
    "sequential with a non-ASCII letter": kernel_case(
        "sequential",
        lambda k: k.replace("unsigned int tid", "unsigned int tíd", 1),
        Status.COMPILE_ERROR,
        "U+00ED outside comments and strings is refused",
    ),
    "naive writing g_out[-1]": kernel_case(
        "naive", inserted_before_first_barrier("g_out[-1]=0;"), Status.INCORRECT, "out of bounds"
    ),
    "naive leaving early": kernel_case(
        "naive", inserted_before_first_barrier("if (tid == 5) return;"), Status.INCORRECT, "barrier divergence"
    ),
    "naive printing": kernel_case("naive", inserted_before_first_barrier('printf("x");'), Status.CORRECT, "correct"),
    "naive with a null byte in the kernel": Named(
        file_of(with_kernel("naive", kernel_text("naive").replace("{", "{\x00", 1), escaped=True)),
        {"naive": (Status.COMPILE_ERROR, "the control character U+0000 is refused")},
    ),
    "naive with carriage returns for line ends": Named(
        file_of(with_kernel("naive", kernel_text("naive").replace("\n", "\r\n"), escaped=True)),
        {"naive": (Status.CORRECT, "correct")},
    ),
    "naive writing far past g_out": kernel_case(
        "naive", inserted_before_first_barrier("g_out[1<<30]=0;"), Status.CRASHED, "crashed"
    ),
    # The cell's source.
    "naive as an f-string": source_case("naive", "f-string", Status.INVALID_CELL, "plain string literal"),
    "naive in a call": source_case("naive", "a call", Status.INVALID_CELL, "plain string literal"),
    "naive with a second statement": source_case(
        "naive", "two statements", Status.INVALID_CELL, "must hold only the kernel's string assignment"
    ),
    "naive as a bytes literal": source_case("naive", "bytes literal", Status.INVALID_CELL, "plain string literal"),
    "naive with a null byte in the cell": source_case(
        "naive", "a null byte in the cell", Status.INVALID_CELL, "null byte"
    ),
    "naive with a lone surrogate in the string": source_case(
        "naive", "a lone surrogate in the string", Status.INVALID_CELL, "not valid Unicode"
    ),
    "naive with a lone surrogate in the cell": source_case(
        "naive", "a lone surrogate in the cell", Status.INVALID_CELL, "lone surrogate"
    ),
    "open with an annotation": source_case("open", "annotated", Status.CORRECT, "correct"),
    "max2d with parentheses 5000 deep": source_case(
        "max2d", "parentheses 5000 deep", Status.INVALID_CELL, "syntax error"
    ),
    "shuffle too large": source_case("shuffle", "huge", Status.INVALID_CELL, "characters, more than"),
    # The cells and their metadata.
    "naive cell deleted": notebook_case(
        lambda nb: nb["cells"].remove(cell_of(nb, "naive")), {"naive": (Status.NOT_ATTEMPTED, "not attempted")}
    ),
    "naive cell duplicated": notebook_case(
        lambda nb: nb["cells"].append(copy.deepcopy(cell_of(nb, "naive"))),
        {"naive": (Status.INVALID_CELL, "keep exactly one")},
    ),
    "cells reversed": notebook_case(lambda nb: nb["cells"].reverse(), {}),
    "first_add a markdown cell": notebook_case(
        lambda nb: cell_of(nb, "first_add").update(cell_type="markdown"),
        {"first_add": (Status.INVALID_CELL, "is not a code cell")},
    ),
    "shuffle without grade_id": notebook_case(
        lambda nb: nbgrader_of(nb, "shuffle").pop("grade_id"), {"shuffle": (Status.NOT_ATTEMPTED, "not attempted")}
    ),
    "shuffle with a grade_id that is a number": notebook_case(
        lambda nb: nbgrader_of(nb, "shuffle").update(grade_id=6), {"shuffle": (Status.NOT_ATTEMPTED, "not attempted")}
    ),
    "sequential with an unknown grade_id": notebook_case(
        lambda nb: nbgrader_of(nb, "sequential").update(grade_id="sequential2"),
        {"sequential": (Status.NOT_ATTEMPTED, "not attempted")},
    ),
    "max2d graded as shuffle": notebook_case(
        lambda nb: nbgrader_of(nb, "max2d").update(grade_id="shuffle"),
        {"max2d": (Status.NOT_ATTEMPTED, "not attempted"), "shuffle": (Status.INVALID_CELL, "keep exactly one")},
    ),
    "max2d with nbgrader a string": notebook_case(
        lambda nb: cell_of(nb, "max2d")["metadata"].update(nbgrader="max2d"),
        {"max2d": (Status.NOT_ATTEMPTED, "not attempted")},
    ),
    "naive source a number": notebook_case(
        lambda nb: cell_of(nb, "naive").update(source=3), {"naive": (Status.INVALID_CELL, "its source is not text")}
    ),
    "open source one string": notebook_case(
        lambda nb: cell_of(nb, "open").update(source="".join(cell_of(nb, "open")["source"])), {}
    ),
    "nbformat_minor 99": notebook_case(lambda nb: nb.update(nbformat_minor=99), {}),
    # The file.
    "nbformat 3": notebook_case(lambda nb: nb.update(nbformat=3), {ALL: (Status.INVALID_CELL, "not a readable")}),
    "nbformat 5": notebook_case(
        lambda nb: nb.update(nbformat=5), {ALL: (Status.INVALID_CELL, "unknown notebook format version")}
    ),
    "truncated": unreadable(ALICE_FILE[: len(ALICE_FILE) // 2], "not JSON"),
    "invalid UTF-8": unreadable(ALICE_FILE.replace(b"Alice", b"Al\xffice", 1), "not UTF-8 text"),
    "an empty file": unreadable(b"", "not JSON"),
    "a JSON list": unreadable(b"[1, 2]", "not a readable notebook"),
    "a JSON number": unreadable(b"4", "not a readable notebook"),
    "lists 100000 deep": unreadable(WHOLE_FILES["lists 100000 deep"], "nested too deeply"),
}


@pytest.fixture(scope="module")
def named_class(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Every named case as a student of one class, graded by `autograder grade`: the result files by case."""
    top = tmp_path_factory.mktemp("named")
    submissions, results = top / "submissions", top / "results"
    submissions.mkdir()
    students = {name: re.sub(r"\W+", "_", name.encode("ascii", "replace").decode()).strip("_") for name in NAMED}
    assert len(set(students.values())) == len(students)
    for name, case in NAMED.items():
        (submissions / f"{students[name]}.ipynb").write_bytes(case.notebook)
    args = ["grade", str(submissions), "--out", str(results), "--backend", "cpu", "--quick", "--seed", str(SEED)]
    outcome = CliRunner().invoke(cli, args)
    assert outcome.exit_code == 0, outcome.output  # 3 would say the grader failed on a student
    assert not (results / "grader-failures.json").exists()
    return {name: json.loads((results / f"{file_stem(s)}.json").read_text()) for name, s in students.items()}


@pytest.mark.parametrize("name", list(NAMED))
def test_each_named_mutant_gets_its_verdict(named_class: dict[str, dict], name: str) -> None:
    result = check_result(named_class[name], name)
    case = NAMED[name]
    for stage in result.stages:
        status, words = case.expected.get(stage.stage) or case.expected.get(ALL) or (Status.CORRECT, "correct")
        assert stage.status is status, f"{stage.stage}: {stage.message}"
        assert words in stage.message, f"{stage.stage}: {stage.message}"


def test_a_hanging_kernel_times_out_and_the_other_stages_are_graded(grader: ClassGrader) -> None:
    kernel = kernel_text("naive").replace("__syncthreads();", "while(1);\n    __syncthreads();", 1)
    result = grader.grade(Mutant("naive with while(1);", file_of(with_kernel("naive", kernel))))
    statuses = {stage.stage: stage.status for stage in result.stages}
    assert statuses == {stage_id: Status.TIMEOUT if stage_id == "naive" else Status.CORRECT for stage_id in STAGE_IDS}
    assert "ran past its 3 s limit" in result.stages[0].message
