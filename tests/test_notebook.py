from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.errors import CompileError, NotebookError
from autograder.notebook import (
    MAX_JSON_VALUES,
    MAX_NOTEBOOK_BYTES,
    kernel_cell,
    kernel_literal_lines,
    stage_cells,
)
from autograder.policy import check_source
from autograder.records import SourceLocation
from autograder.stages import get_stage

KERNEL = "__global__ void reduce_naive(const float *g_in, float *g_out, unsigned int n)\n{\n    int x;\n}\n"


def write(tmp_path: Path, cells: list) -> Path:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = cells
    path = tmp_path / "hand-in.ipynb"
    nbformat.write(notebook, path)
    return path


def test_reads_the_kernel_and_maps_its_lines_to_the_cell(tmp_path: Path) -> None:
    cell = kernel_cell("naive", KERNEL)
    cell.source = "# my comment\n" + cell.source
    path = write(tmp_path, [nbformat.v4.new_markdown_cell("intro"), cell])
    naive = stage_cells(path)["naive"]
    assert naive.source is not None and "int x;" in naive.source.text
    kernel_line = naive.source.text.splitlines().index("    int x;") + 1
    cell_lines = cell.source.splitlines()
    assert cell_lines[naive.source.cell_line(kernel_line) - 1] == "    int x;"
    assert naive.source.location.cell_index == 1


def test_missing_cells_are_not_attempted(tmp_path: Path) -> None:
    cells = stage_cells(write(tmp_path, [kernel_cell("naive", KERNEL)]))
    assert cells["sequential"].attempted is False and cells["sequential"].source is None


def test_the_released_stub_counts_as_not_attempted(tmp_path: Path) -> None:
    stub = get_stage("shuffle").stub_source()
    cells = stage_cells(write(tmp_path, [kernel_cell("shuffle", stub)]))
    assert cells["shuffle"].attempted is False


def test_duplicated_cells_are_a_problem(tmp_path: Path) -> None:
    cells = stage_cells(write(tmp_path, [kernel_cell("naive", KERNEL), kernel_cell("naive", KERNEL)]))
    assert cells["naive"].source is None and "cells 1, 2" in cells["naive"].problem


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ('SRC = open("k.cu").read()\n', "line 1: the kernel must be a plain string literal"),
        ('name = "x"\nSRC = f"""{name}"""\n', "line 2: the cell must hold only"),
        ('SRC = f"""__global__ void k() {{}}"""\n', "plain string literal"),
        ("SRC = '''unterminated\n", "syntax error"),
        ("# nothing but a comment\n", "holds no kernel"),
        # One assignment to one name: not several targets, an attribute, an item or a tuple.
        ('A = B = """__global__ void k() {}"""\n', "assigned to a name"),
        ('SRC.text = """__global__ void k() {}"""\n', "assigned to a name"),
        ('SRC[0] = """__global__ void k() {}"""\n', "assigned to a name"),
        ('A, B = "xy"\n', "assigned to a name"),
    ],
)
def test_non_literal_cells_are_refused_with_the_line(source: str, message: str) -> None:
    with pytest.raises(NotebookError, match=message):
        kernel_literal_lines(source)


def test_an_annotated_assignment_to_one_name_is_a_kernel_cell() -> None:
    assert kernel_literal_lines('SRC: str = """__global__ void k() {}"""\n')[0] == "__global__ void k() {}"


def test_the_student_code_is_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    cell = kernel_cell("naive", KERNEL)
    cell.source = f"import pathlib; pathlib.Path({str(marker)!r}).touch()\n" + cell.source
    cells = stage_cells(write(tmp_path, [cell]))
    assert not marker.exists()
    assert "only the kernel's string assignment" in cells["naive"].problem


def test_a_damaged_notebook_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.ipynb"
    path.write_text('{"cells": [')
    with pytest.raises(NotebookError, match="not a readable notebook"):
        stage_cells(path)


def test_a_notebook_saved_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    path = tmp_path / "bom.ipynb"
    notebook = nbformat.v4.new_notebook(cells=[kernel_cell("naive", "x")])
    path.write_bytes(b"\xef\xbb\xbf" + nbformat.writes(notebook).encode())
    assert stage_cells(path)["naive"].attempted


def test_grading_builds_no_grammar_that_no_notebook_schema_uses() -> None:
    # jsonschema, under nbformat, builds rfc3987_syntax's grammar at import where that package is installed: a
    # second of a core in every grading process, for string formats no notebook schema has. Notebooks are still
    # read and validated.
    code = (
        "import sys, autograder.batch, nbformat\n"
        "nbformat.validate(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('x = 1')]))\n"
        "print(sys.modules.get('rfc3987_syntax'))\n"
    )
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "None"


# --- notebooks too large to parse ------------------------------------------------------------------------------

ALICE = Path(__file__).resolve().parent.parent / "examples" / "submissions" / "alice.ipynb"


@pytest.mark.parametrize("filler", ["{}", "[]", "0", '""'], ids=["objects", "lists", "numbers", "strings"])
def test_a_notebook_of_millions_of_tiny_values_is_refused_before_it_is_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, filler: str
) -> None:
    # Under MAX_NOTEBOOK_BYTES, 11 million empty objects took 5.7 GB and 41 s to parse (twice) and killed the
    # class's workers: the student got no result. Now no parser sees them.
    base = ALICE.read_text()
    room = MAX_NOTEBOOK_BYTES - len(base) - 100
    bomb = ",".join([filler] * (room // (len(filler) + 1)))
    path = tmp_path / "mallory.ipynb"
    path.write_text(base.replace('"metadata": {', '"metadata": {"x": [' + bomb + "], ", 1))
    parsed: list[str] = []
    monkeypatch.setattr("autograder.notebook.json.loads", lambda text, **_: parsed.append(text))
    with pytest.raises(NotebookError, match=r"^mallory\.ipynb: not a readable notebook \(its JSON holds") as error:
        stage_cells(path)
    assert parsed == []
    assert "a notebook may hold" in str(error.value) and "reduce_" not in str(error.value)  # nothing it holds


def test_a_large_notebook_of_outputs_cells_and_nesting_is_read(tmp_path: Path) -> None:
    # 25 MB of output lines full of braces, brackets, commas and escaped quotes (which count for nothing inside
    # strings: millions of them), 2 000 cells and metadata nested 400 deep are all a notebook may hold.
    line = 'say "{[1, 2], [3, 4]}", \\ then {,,,} and [,,,]' * 2
    output = nbformat.v4.new_output("stream", name="stdout", text=[line + "\n"] * (25_000_000 // len(line)))
    busy = nbformat.v4.new_code_cell("print(data)", outputs=[output])
    nested: dict = {}
    for _ in range(200):
        nested = {"x": [nested]}
    notebook = nbformat.v4.new_notebook(metadata={"deep": nested})
    cells = [nbformat.v4.new_code_cell(f"x = {i}") for i in range(2_000)]
    notebook.cells = [*cells, busy, kernel_cell("naive", KERNEL)]
    path = tmp_path / "big.ipynb"
    path.write_text(json.dumps(notebook, indent=1))
    assert path.stat().st_size > 25_000_000 and path.read_text().count(",") > MAX_JSON_VALUES
    naive = stage_cells(path)["naive"]
    assert naive.source is not None and "int x;" in naive.source.text


# --- kernel lines to cell lines --------------------------------------------------------------------------------

MARKED = KERNEL.replace("int x;\n", 'int x;\n    asm("nop");\n')
MARKED_LINES = MARKED.split("\n")


def quoted(text: str) -> str:
    """`text` as a non-raw one-line Python string literal, with \\n escapes."""
    return json.dumps(text)


RAW_STRING = f'SRC = r"""\n{MARKED}"""\n'
# Every string form the grader reads, with the kernel MARKED; its `asm` line is the one the policy refuses.
STRING_FORMS = {
    "an r-string": RAW_STRING,
    "an r-string in parentheses, on the next line": f'SRC = (\n    r"""\n{MARKED}"""\n)\n',
    "one line with \\n escapes": f"SRC = {quoted(MARKED)}\n",
    "a backslash-newline after the opening quotes": f'# my kernel\nSRC = """\\\n{MARKED}"""\n',
    "literals side by side, two on a line, comments between": "SRC = ("
    + quoted(MARKED_LINES[0] + "\n")
    + quoted(MARKED_LINES[1] + "\n")
    + "\n"
    + "".join(f"    {quoted(line + chr(10))}  # line {i}\n" for i, line in enumerate(MARKED_LINES[2:-1], 3))
    + ")\n",
    "an r-string side by side with one with \\n escapes": (
        f'SRC = (\n    r"""\n{"".join(line + chr(10) for line in MARKED_LINES[:3])}"""\n'
        f"    {quoted(''.join(line + chr(10) for line in MARKED_LINES[3:-1]))}\n)\n"
    ),
    "other escapes of a newline, a continuation inside a line, and a u prefix": (
        'SRC = u"""\\\n' + MARKED.replace("\n    int x;\n", "\\x0a    int \\\nx;\\012").replace('"', '\\"') + '"""\n'
    ),
    "Windows line ends": RAW_STRING.replace("\n", "\r\n"),
}


@pytest.mark.parametrize("cell_source", STRING_FORMS.values(), ids=STRING_FORMS.keys())
def test_messages_name_the_cell_line_of_a_kernel_line_in_every_string_form(tmp_path: Path, cell_source: str) -> None:
    cell = kernel_cell("naive", "")
    cell.source = cell_source
    naive = stage_cells(write(tmp_path, [cell]))["naive"].source
    assert naive is not None and naive.text.lstrip("\n") == MARKED  # the same kernel, whatever its form
    cell_lines = cell_source.splitlines()
    true_line = next(number for number, line in enumerate(cell_lines, 1) if "asm" in line)
    with pytest.raises(CompileError) as refused:
        check_source(naive)
    assert [message.line for message in refused.value.messages] == [true_line]
    kernel_lines = naive.text.split("\n")
    for in_kernel, in_cell in (("__global__", "__global__"), ("int x;", "    int "), ("}", "}")):
        kernel_line = next(number for number, line in enumerate(kernel_lines, 1) if in_kernel in line)
        assert in_cell in cell_lines[naive.cell_line(kernel_line) - 1]


def test_an_r_string_keeps_the_plain_location_and_a_compiler_line_past_the_end_counts_on() -> None:
    location = SourceLocation.of_lines("a.ipynb", "naive", 0, kernel_literal_lines(RAW_STRING)[1])
    assert location == SourceLocation("a.ipynb", "naive", 0, first_line=1)  # as before: memo keys stay the same
    text, cell_lines = kernel_literal_lines(STRING_FORMS["one line with \\n escapes"])
    escaped = SourceLocation.of_lines("a.ipynb", "naive", 0, cell_lines)
    lines = text.count("\n") + 1
    assert escaped.line_starts == (1,) * lines
    assert [escaped.cell_line(n) for n in (lines, lines + 1, lines + 3)] == [1, 2, 4]
