from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.errors import NotebookError
from autograder.notebook import kernel_cell, kernel_literal, stage_cells
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
        kernel_literal(source)


def test_an_annotated_assignment_to_one_name_is_a_kernel_cell() -> None:
    assert kernel_literal('SRC: str = """__global__ void k() {}"""\n')[0] == "__global__ void k() {}"


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
