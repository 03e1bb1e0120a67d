"""The notebook runs top to bottom with the reference kernels, self-checks and graded cells included.

On the CPU backend in CI (quick cases); the gpu-marked variant runs it on a GPU with the full cases and timing.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from autograder.rubric import DEFAULT_RUBRIC, load_rubric
from autograder.stages import STAGES

ROOT = Path(__file__).resolve().parents[1]
SOURCE_NOTEBOOK = ROOT / "solutions" / "reduction" / "reduction.ipynb"


def run_notebook(notebook_path: Path, workdir: Path, timeout: int = 900) -> nbformat.NotebookNode:
    """Execute a copy of the notebook in `workdir` (where the graded cells find it) and return it with outputs."""
    copy = workdir / notebook_path.name
    shutil.copy(notebook_path, copy)
    notebook = nbformat.read(copy, as_version=4)
    resources = {"metadata": {"path": str(workdir)}}
    try:
        NotebookClient(notebook, timeout=timeout, kernel_name="python3", resources=resources).execute()
    finally:
        nbformat.write(notebook, workdir / "executed.ipynb")  # to look at when a test fails
    return notebook


def cells_by_grade_id(notebook: nbformat.NotebookNode) -> dict[str, nbformat.NotebookNode]:
    return {c.metadata.nbgrader.grade_id: c for c in notebook.cells if "nbgrader" in c.metadata}


def text_of(cell: nbformat.NotebookNode) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif "data" in output:
            parts.append(output.data.get("text/plain", ""))
    return "\n".join(parts)


def graded_value(cell: nbformat.NotebookNode) -> float:
    """The number nbgrader reads from a graded cell: its execute_result."""
    (result,) = [output for output in cell.outputs if output.output_type == "execute_result"]
    return float(result.data["text/plain"])


def assert_clean(notebook: nbformat.NotebookNode) -> None:
    """No cell raised, and none wrote to stderr (nbgrader gives a graded cell that does no points)."""
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            assert output.output_type != "error", f"cell {index} raised: {output.get('ename')}: {output.get('evalue')}"
            assert not (output.output_type == "stream" and output.name == "stderr"), f"cell {index}: {output.text}"


def test_solution_notebook_runs_on_the_cpu_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOGRADER_BACKEND", "cpu")
    monkeypatch.setenv("AUTOGRADER_QUICK", "1")
    started = time.perf_counter()
    notebook = run_notebook(SOURCE_NOTEBOOK, tmp_path)
    elapsed = time.perf_counter() - started
    assert_clean(notebook)
    cells = cells_by_grade_id(notebook)
    rubric = load_rubric()
    for stage in STAGES:
        report = text_of(cells[f"check_{stage.id}"])
        assert "CPU" in report or "cpu" in report, report
        assert "✔ correct" in report, f"{stage.id}:\n{report}"
        if f"points_{stage.id}" in cells:
            # On the CPU backend only correctness points are counted.
            assert graded_value(cells[f"points_{stage.id}"]) == rubric.stages[stage.id].correctness, stage.id
    summary = text_of(cells["summary"])
    assert all(stage.id in summary for stage in STAGES)
    print(f"notebook ran in {elapsed:.1f} s")


def small_timing_rubric(folder: Path) -> Path:
    """The default rubric with a smaller timed input and time budget, so the whole notebook fits in minutes."""
    text = DEFAULT_RUBRIC.read_text()
    for key, value in (("n", "4194304"), ("max2d_shape", "[2048, 2048]"), ("budget_seconds", "5")):
        text, count = re.subn(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.MULTILINE)
        assert count == 1, key
    path = folder / "rubric.toml"
    path.write_text(text)
    return path


@pytest.mark.gpu
def test_solution_notebook_runs_on_the_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pycuda.driver")
    monkeypatch.setenv("AUTOGRADER_BACKEND", "gpu")
    monkeypatch.setenv("AUTOGRADER_RUBRIC", str(small_timing_rubric(tmp_path)))
    started = time.perf_counter()
    notebook = run_notebook(SOURCE_NOTEBOOK, tmp_path, timeout=1800)
    elapsed = time.perf_counter() - started
    assert_clean(notebook)
    cells = cells_by_grade_id(notebook)
    rubric = load_rubric()
    for stage in STAGES:
        report = text_of(cells[f"check_{stage.id}"])
        assert "✔ correct" in report or "not fast enough" in report, f"{stage.id}:\n{report}"
        assert "Time, yours" in report, report
        if stage.previous is not None and not stage.optional:
            assert "Speedup" in report, report
        if f"points_{stage.id}" in cells:
            points = graded_value(cells[f"points_{stage.id}"])
            available = rubric.stages[stage.id]
            # The reference kernels earn every correctness point; speed points depend on this GPU's timing.
            assert available.correctness <= points <= available.correctness + available.performance, (
                f"{stage.id}:\n{text_of(cells[f'points_{stage.id}'])}"
            )
    html = "".join(output.get("data", {}).get("text/html", "") for output in cells["summary"].outputs)
    assert "data:image/png;base64," in html, "the summary shows no speedup chart"
    print(f"notebook ran in {elapsed:.1f} s")
