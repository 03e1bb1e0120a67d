"""nbgrader's side of the assignment: releasing kernel cells as stubs, and the hidden graded cells.

Releasing. In the source notebook a stage's kernel cell wraps its whole assignment in solution markers::

    # BEGIN SOLUTION
    NAIVE_SOURCE = r\"\"\"
    __global__ void reduce_naive(...) { ... }
    \"\"\"
    # END SOLUTION

nbgrader's ClearSolutions would put `raise NotImplementedError()` there, which is no kernel. ClearKernelSolutions
(registered in nbgrader_config.py) puts the stage's compilable stub (`Stage.stub_source`) there instead, under the
same name, so the released cell is a kernel cell in the contract's format that the grader reports as
"not attempted" until the student changes it.

Grading. Each stage's graded cell (a hidden test) runs `python -P -m autograder.nbgrade reduction.ipynb <stage>`
in a separate process and shows its report and points (autograder/nbgrade.py says what that does and does not
defend against); a notebook kernel never needs nbgrader.
"""

from __future__ import annotations

import ast

from nbformat import NotebookNode
from nbgrader.preprocessors import ClearSolutions

from autograder.notebook import kernel_cell
from autograder.stages import STAGE_IDS, get_stage

# nbgrader_config.py imports this module, so everything nbgrader does fails if an import here fails: keep its
# imports light.

# Files beside the source notebook that must never reach students (nbgrader_config.py ignores them).
INSTRUCTOR_ONLY_FILES = ("kernels", "*.cu", "build_notebook.py")

# A graded cell grades its stage and the previous one, timing included; nbgrader's default is 30 s a cell.
GRADED_CELL_TIMEOUT_S = 3600


class ClearKernelSolutions(ClearSolutions):
    """ClearSolutions that releases a stage's kernel cell as that stage's stub (see the module docstring)."""

    def _replace_solution_region(self, cell: NotebookNode, language: str) -> bool:
        stage_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if cell.cell_type != "code" or stage_id not in STAGE_IDS:
            return super()._replace_solution_region(cell, language)
        lines = cell.source.split("\n")
        begins = [i for i, line in enumerate(lines) if self.begin_solution_delimeter in line]
        ends = [i for i, line in enumerate(lines) if self.end_solution_delimeter in line]
        if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
            raise RuntimeError(
                f"kernel cell '{stage_id}' needs exactly one '{self.begin_solution_delimeter}' line before one "
                f"'{self.end_solution_delimeter}' line, around the kernel's assignment"
            )
        begin, end = begins[0], ends[0]
        variable = assigned_name("\n".join(lines[begin + 1 : end]), stage_id)
        stub = kernel_cell(stage_id, get_stage(stage_id).stub_source(), variable).source.rstrip("\n")
        cell.source = "\n".join([*lines[:begin], *stub.split("\n"), *lines[end + 1 :]])
        return True


def assigned_name(code: str, stage_id: str) -> str:
    """The name a kernel cell's solution region assigns its kernel to, so the stub keeps it."""
    try:
        statements = ast.parse(code).body
    except SyntaxError as error:
        raise RuntimeError(f"kernel cell '{stage_id}': the solution region is not valid Python ({error})") from None
    if len(statements) == 1 and isinstance(statements[0], ast.Assign) and len(statements[0].targets) == 1:
        target = statements[0].targets[0]
        if isinstance(target, ast.Name):
            return target.id
    raise RuntimeError(f"kernel cell '{stage_id}': the solution region must be one assignment to a name")
