"""Reading each stage's kernel source out of a notebook, without running any of it.

The cell format (the released notebook and the example hand-ins follow it):

- A stage's kernel cell is a code cell whose metadata carries `nbgrader.grade_id` equal to the stage id
  (`naive`, `anti_divergence`, ..., `max2d`).
- Its source is one assignment of a string literal to a name, for example::

      NAIVE_SOURCE = r\"\"\"
      __global__ void reduce_naive(const float *g_in, float *g_out, unsigned int n)
      { ... }
      \"\"\"

  Comments may surround it. Anything else (an f-string, a call, a second statement) is refused: the cell is
  parsed with `ast`, never executed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograder.errors import NotebookError
from autograder.records import KernelSource, SourceLocation
from autograder.stages import STAGE_IDS, get_stage

NBGRADER_SCHEMA_VERSION = 3


@dataclass(frozen=True)
class StageCell:
    """What a notebook holds for one stage: its kernel source, or why there is none.

    Exactly one of `source` and `problem` is set, unless the stage is simply absent or untouched (then
    `attempted` is False and both may be None).
    """

    stage: str
    source: KernelSource | None
    problem: str | None
    attempted: bool


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """The notebook at `path`, or a NotebookError that says why it cannot be read."""
    try:
        return nbformat.read(path, as_version=4)
    except FileNotFoundError:
        raise NotebookError(f"{path}: no such notebook") from None
    except Exception as error:  # nbformat raises many kinds for a damaged file
        raise NotebookError(f"{path}: not a readable notebook ({type(error).__name__}: {error})") from None


def stage_cells(path: Path, notebook: nbformat.NotebookNode | None = None) -> dict[str, StageCell]:
    """Every stage's cell in the notebook at `path`, keyed by stage id, in catalogue order."""
    notebook = notebook if notebook is not None else read_notebook(path)
    found: dict[str, list[int]] = {}
    for index, cell in enumerate(notebook.cells):
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in STAGE_IDS:
            found.setdefault(grade_id, []).append(index)
    return {stage_id: _stage_cell(path, notebook, stage_id, found.get(stage_id, [])) for stage_id in STAGE_IDS}


def _stage_cell(path: Path, notebook: nbformat.NotebookNode, stage_id: str, indices: list[int]) -> StageCell:
    if not indices:
        return StageCell(stage_id, None, f"no cell has grade_id '{stage_id}'", attempted=False)
    if len(indices) > 1:
        cells = ", ".join(str(i + 1) for i in indices)
        problem = f"cells {cells} all have grade_id '{stage_id}'; keep exactly one"
        return StageCell(stage_id, None, problem, attempted=True)
    index = indices[0]
    cell = notebook.cells[index]
    where = f"{path.name}, cell {index + 1} ('{stage_id}')"
    if cell.cell_type != "code":
        return StageCell(stage_id, None, f"{where} is a {cell.cell_type} cell, not a code cell", attempted=True)
    try:
        text, first_line = kernel_literal(cell.source)
    except NotebookError as error:
        return StageCell(stage_id, None, f"{where}: {error}", attempted=True)
    if is_untouched(stage_id, text):
        return StageCell(stage_id, None, None, attempted=False)
    location = SourceLocation(notebook=str(path), grade_id=stage_id, cell_index=index, first_line=first_line)
    return StageCell(stage_id, KernelSource(text=text, location=location), None, attempted=True)


def kernel_literal(cell_source: str) -> tuple[str, int]:
    """The string literal a kernel cell assigns, and the cell line its first line is on.

    Raises NotebookError naming the line when the cell is not exactly one string-literal assignment.
    """
    try:
        tree = ast.parse(cell_source)
    except SyntaxError as error:
        raise NotebookError(f"line {error.lineno}: Python syntax error ({error.msg})") from None
    statements = tree.body
    if not statements:
        raise NotebookError("the cell holds no kernel: assign the CUDA source to a name, as a string literal")
    if len(statements) > 1:
        raise NotebookError(
            f"line {statements[1].lineno}: the cell must hold only the kernel's string assignment; "
            "move other code to another cell"
        )
    statement = statements[0]
    value = statement.value if isinstance(statement, (ast.Assign, ast.AnnAssign)) else None
    if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
        raise NotebookError(
            f"line {statement.lineno}: the kernel must be a plain string literal assigned to a name "
            '(r"""..."""); the grader never runs notebook code, so calls, f-strings and names are not allowed'
        )
    return value.value, value.lineno


def is_untouched(stage_id: str, text: str) -> bool:
    """True when `text` is empty or still the released stub of the stage (whitespace aside)."""
    compact = "".join(text.split())
    return not compact or compact == "".join(get_stage(stage_id).stub_source().split())


def kernel_cell(stage_id: str, kernel: str, variable: str | None = None) -> nbformat.NotebookNode:
    """A kernel cell in the contract's format, as the released notebook and the example hand-ins hold it."""
    name = variable or f"{stage_id.upper()}_SOURCE"
    body = kernel if kernel.startswith("\n") else "\n" + kernel
    cell = nbformat.v4.new_code_cell(f'{name} = r"""{body}"""\n')
    cell.metadata["nbgrader"] = {
        "grade": False,
        "grade_id": stage_id,
        "locked": False,
        "schema_version": NBGRADER_SCHEMA_VERSION,
        "solution": True,
        "task": False,
    }
    return cell
