"""The self-check inside a real notebook kernel, and its reports.

The kernel test runs a small notebook on the CPU backend: a compile error must be reported at the notebook
cell's line, a kernel the grader would refuse (built with an f-string) must be flagged, and an untouched stub
must read "not attempted". The report tests need no backend: they render hand-made results.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from test_notebook_run import assert_clean, run_notebook, text_of

from autograder.notebook import kernel_cell
from autograder.records import (
    CaseResult,
    DeviceInfo,
    Performance,
    PerfVerdict,
    Points,
    StageResult,
    Status,
    Timing,
)
from autograder.selfcheck import StageReport, SummaryReport
from autograder.stages import get_stage

KERNELS = Path(__file__).resolve().parents[1] / "solutions" / "reduction" / "kernels"


def test_self_check_in_a_notebook_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOGRADER_BACKEND", "cpu")
    monkeypatch.setenv("AUTOGRADER_QUICK", "1")
    broken = (KERNELS / "naive.cu").read_text().replace("tid = threadIdx.x;", "tid = threadIdx.q;", 1)
    broken_line = next(i for i, line in enumerate(broken.splitlines(), 1) if "threadIdx.q" in line)
    kernel = kernel_cell("naive", broken).source  # line 1 is `NAIVE_SOURCE = r"""`, the kernel starts on line 2
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.cells = [
        nbformat.v4.new_code_cell("from autograder.selfcheck import check, summary"),
        nbformat.v4.new_code_cell(f"# a comment line first, as in the released notebook\n{kernel}"),
        nbformat.v4.new_code_cell('check("naive", NAIVE_SOURCE)'),
        nbformat.v4.new_code_cell(f'body = {(KERNELS / "sequential.cu").read_text()!r}\nBUILT = f"{{body}}"'),
        nbformat.v4.new_code_cell('check("sequential", BUILT)'),
        nbformat.v4.new_code_cell(f"STUB = {get_stage('shuffle').stub_source()!r}"),
        nbformat.v4.new_code_cell('check("shuffle", STUB)'),
        nbformat.v4.new_code_cell("summary()"),
    ]
    path = tmp_path / "written" / "mine.ipynb"
    path.parent.mkdir()
    nbformat.write(notebook, path)
    executed = run_notebook(path, tmp_path)
    assert_clean(executed)
    broken_report, built_report, stub_report = (text_of(executed.cells[i]) for i in (2, 4, 6))
    # The error's line is a line of the kernel cell: two lines above the kernel (the comment, the assignment).
    assert f"does not compile at line {broken_line + 2}:" in broken_report, broken_report
    assert "✔ correct" in built_report and "one plain string literal" in built_report, built_report
    assert "not attempted" in stub_report, stub_report
    assert "compile error" in text_of(executed.cells[7])


def _result(stage: str, speedup: float | None, message: str = "correct: all 2 cases right") -> StageResult:
    timings = (Timing("yours", 1.0, 0.001, 20, 268.0), Timing("your naive", 1.5, 0.001, 20, 179.0))
    return StageResult(
        stage=stage,
        status=Status.CORRECT,
        message=message,
        cases=(CaseResult("n=1 integers", (1,), "integers", 1.0, 1.0, True),),
        performance=Performance(
            PerfVerdict.FAST_ENOUGH if speedup else PerfVerdict.NOT_MEASURED,
            "1.50x over your naive (needs 1.25x)",
            timings=timings if speedup else (),
            speedup=speedup,
            baseline="your naive" if speedup else None,
            required_speedup=1.25 if speedup else None,
            reference_step=1.5 if speedup else None,
        ),
        points=Points(10, 5 if speedup else 0, 0, 10, 5, ("correctness 10/10",)),
    )


def test_summary_charts_measured_speedups() -> None:
    summary = SummaryReport({"naive": _result("naive", None), "anti_divergence": _result("anti_divergence", 1.5)})
    assert [row[0] for row in summary.speedups()] == ["anti_divergence"]
    png = summary.chart_png()
    assert png is not None and png.startswith(b"\x89PNG")
    assert "data:image/png;base64," in summary._repr_html_()
    assert "1.50x" in str(summary) and "not checked" in str(summary)


def test_summary_without_timings_says_why() -> None:
    summary = SummaryReport({"naive": _result("naive", None)})
    assert summary.chart_png() is None
    assert "measured on a GPU only" in summary._repr_html_()


def test_report_escapes_what_the_kernel_and_compiler_say() -> None:
    result = StageResult("naive", Status.COMPILE_ERROR, "does not compile: expected '>' in <script>")
    report = StageReport(result, DeviceInfo("cpu", "CPU backend"))
    html = report._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "✘ does not compile" in str(report)
