"""Bank conflicts and divergence measured by the CPU backend reach the results and their readers."""

from __future__ import annotations

import pytest

from autograder.grade import GradeOptions, grade_stages
from autograder.references import reference_source
from autograder.report import metric_notes


@pytest.fixture(scope="module")
def graded():
    stages = ("naive", "anti_divergence", "sequential")
    options = GradeOptions(backend="cpu", quick=True, seed=5)
    results = grade_stages({s: reference_source(s) for s in stages}, only=list(stages), options=options)
    return {result.stage: result for result in results}


def test_the_strided_stage_shows_bank_conflicts_and_sequential_addressing_none(graded) -> None:
    strided, sequential = graded["anti_divergence"].metrics, graded["sequential"].metrics
    assert strided.transactions_per_request > 2 * sequential.transactions_per_request
    conflicted = [note for note in metric_notes(strided) if "bank conflicts" in note]
    assert len(conflicted) == 1 and "sdata[index + s]" in conflicted[0]
    assert not [note for note in metric_notes(sequential) if "bank conflicts" in note]


def test_the_modulo_stage_diverges_most(graded) -> None:
    assert graded["naive"].metrics.divergence > 2 * graded["anti_divergence"].metrics.divergence


def test_the_feedback_page_reports_what_was_measured(graded, tmp_path) -> None:
    from autograder.publish.feedback import build_page, write_feedback
    from autograder.records import DeviceInfo, StudentResult

    student = StudentResult(
        "ada",
        "ada.ipynb",
        5,
        "2026-11-21T10:00:00Z",
        DeviceInfo("cpu", "CPU backend"),
        "rubric.toml",
        tuple(graded.values()),
    )
    written = write_feedback(build_page(student), tmp_path)
    markdown = next(path for path in written if path.suffix == ".md").read_text()
    assert "Measured on the CPU backend" in markdown and "bank conflicts" in markdown
    html = next(path for path in written if path.suffix == ".html").read_text()
    assert "transactions per warp request" in html
