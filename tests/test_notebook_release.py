"""The source notebook, its release, and the release pipeline.

`solutions/reduction/reduction.ipynb` is built from the reference kernels; `assignments/` is generated from it by
`nbgrader generate_assignment` and never edited by hand. These tests regenerate both and fail on any difference,
and check that the release holds stubs, graded cells worth the rubric's points, and no solution text.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.nbgrader_support import ClearKernelSolutions
from autograder.notebook import kernel_literal_lines, stage_cells
from autograder.rubric import load_rubric
from autograder.stages import MAX2D_BASELINE, STAGES, get_stage

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions" / "reduction"
SOURCE_NOTEBOOK = SOLUTIONS / "reduction.ipynb"
RELEASE = ROOT / "assignments" / "reduction"
RELEASED_NOTEBOOK = RELEASE / "reduction.ipynb"
KERNELS = SOLUTIONS / "kernels"

sys.path.insert(0, str(SOLUTIONS))
import build_notebook  # noqa: E402  (a script beside the notebook, not a package module)


def nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run nbgrader in `course` as an instructor would; nbgrader finds `alembic` on PATH, so the venv goes first."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args], cwd=course, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def make_course(directory: Path) -> Path:
    """A temporary course directory holding a copy of the configuration and the solutions."""
    shutil.copy(ROOT / "nbgrader_config.py", directory / "nbgrader_config.py")
    shutil.copytree(ROOT / "solutions", directory / "solutions", ignore=shutil.ignore_patterns("__pycache__"))
    return directory


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The release folder that `nbgrader generate_assignment reduction` makes now from solutions/."""
    course = make_course(tmp_path_factory.mktemp("course"))
    nbgrader(course, "generate_assignment", "reduction")
    return course / "assignments" / "reduction"


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def significant(line: str) -> str:
    return "".join(line.split())


def test_source_notebook_is_built_from_the_kernels_and_rubric() -> None:
    fresh = build_notebook.render(build_notebook.build())
    rebuild = "run `.venv/bin/python solutions/reduction/build_notebook.py --release` to rebuild it"
    assert SOURCE_NOTEBOOK.read_text() == fresh, rebuild


def test_source_kernel_cells_hold_exactly_the_reference_kernels() -> None:
    cells = stage_cells(SOURCE_NOTEBOOK)
    for stage in STAGES:
        cell = cells[stage.id]
        assert cell.source is not None, f"{stage.id}: {cell.problem}"
        assert cell.source.text == "\n" + (KERNELS / f"{stage.id}.cu").read_text(), stage.id


def test_release_is_what_nbgrader_generates_from_the_solutions(regenerated: Path) -> None:
    committed, fresh = files_under(RELEASE), files_under(regenerated)
    assert sorted(committed) == sorted(fresh)
    for name in fresh:
        assert committed[name] == fresh[name], (
            f"assignments/reduction/{name} differs from a fresh release: run `.venv/bin/python "
            "solutions/reduction/build_notebook.py --release`; never edit the release by hand"
        )


def test_release_ships_only_the_notebook(regenerated: Path) -> None:
    # ... and what grades it in a student's repository: the pytest entry point and GitHub Classroom's tests.
    expected = [".github/classroom/autograding.json", "reduction.ipynb", "tests/conftest.py"]
    assert sorted(files_under(regenerated)) == expected


def test_released_kernel_cells_are_the_stubs() -> None:
    notebook = nbformat.read(RELEASED_NOTEBOOK, as_version=4)
    cells = stage_cells(RELEASED_NOTEBOOK, notebook)
    for stage in STAGES:
        assert cells[stage.id].problem is None, cells[stage.id].problem
        assert not cells[stage.id].attempted, f"{stage.id}: the released cell is not the untouched stub"
        (cell,) = [c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == stage.id]
        text, _ = kernel_literal_lines(cell.source)
        assert text == "\n" + stage.stub_source()
        assert cell.metadata.nbgrader.solution and not cell.metadata.nbgrader.locked


def test_released_graded_cells_carry_the_rubric_points_and_hide_the_grading() -> None:
    notebook = nbformat.read(RELEASED_NOTEBOOK, as_version=4)
    graded = {c.metadata.nbgrader.grade_id: c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade")}
    rubric = load_rubric()
    expected = {
        build_notebook.graded_id(stage_id): points.correctness + points.performance
        for stage_id, points in rubric.stages.items()
        if points.correctness + points.performance > 0
    }
    assert {grade_id: cell.metadata.nbgrader.points for grade_id, cell in graded.items()} == expected
    for cell in graded.values():
        assert cell.metadata.nbgrader.locked
        assert "autograder.nbgrade" not in cell.source, "the graded cell's call should be a hidden test"


def solution_leaks(notebook: nbformat.NotebookNode) -> list[str]:
    """Lines of the reference kernels that the notebook shows, other than those shown on purpose."""
    # Shown on purpose: the stub of every stage (its signature) and the baseline kernel of max2d.
    shipped = {significant(line) for stage in STAGES for line in stage.stub_source().splitlines()}
    shipped |= {significant(line) for line in (KERNELS / f"{MAX2D_BASELINE.id}.cu").read_text().splitlines()}
    shown = [significant(line) for cell in notebook.cells for line in cell.source.splitlines()]
    leaks = []
    for stage in STAGES:
        for line in (KERNELS / f"{stage.id}.cu").read_text().splitlines():
            # Short lines ("}", "__syncthreads();") are in any kernel; every longer one is the solution's own.
            key = significant(line)
            if len(key) >= 12 and key not in shipped and any(key in text for text in shown):
                leaks.append(f"{stage.id}.cu: {line.strip()}")
    return leaks


def test_release_contains_no_solution_text() -> None:
    leaks = solution_leaks(nbformat.read(RELEASED_NOTEBOOK, as_version=4))
    assert not leaks, "the release shows solution lines:\n" + "\n".join(leaks)


def test_solution_text_check_finds_a_leaked_line() -> None:
    notebook = nbformat.read(RELEASED_NOTEBOOK, as_version=4)
    (leaked,) = [line for line in (KERNELS / "unrolled_warp.cu").read_text().splitlines() if "tid + 32]" in line]
    notebook.cells.append(nbformat.v4.new_markdown_cell(f"Hint: `{leaked.strip()}`"))
    assert f"unrolled_warp.cu: {leaked.strip()}" in solution_leaks(notebook)


def _solution_cell(source: str) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade_id": "naive", "solution": True, "grade": False, "locked": False}
    return cell


def test_clear_kernel_solutions_puts_the_stub_under_the_same_name() -> None:
    cell = _solution_cell('# keep me\n# BEGIN SOLUTION\nMY_KERNEL = r"""\nanything\n"""\n# END SOLUTION')
    cleared, _ = ClearKernelSolutions().preprocess_cell(cell, {"language": "python"}, 0)
    assert cleared.source.startswith('# keep me\nMY_KERNEL = r"""\n')
    assert kernel_literal_lines(cleared.source)[0] == "\n" + get_stage("naive").stub_source()


def test_clear_kernel_solutions_refuses_a_kernel_cell_without_markers() -> None:
    with pytest.raises(RuntimeError, match="BEGIN SOLUTION"):
        ClearKernelSolutions().preprocess_cell(_solution_cell('X = r"""\nk\n"""'), {"language": "python"}, 0)
