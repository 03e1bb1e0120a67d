"""Grade this assignment's notebook with pytest: `python -m pytest` in the folder above, or `python -m pytest -k shuffle`.

The autograder's pytest plugin (installed with the autograder) does the grading: one test per stage and check
(`reduction::shuffle::correct`, `::races`, `::speed`), with the same verdicts and points as the course's grader.
Without an NVIDIA GPU, speed is not measured: those tests are skipped. GitHub Classroom runs one such command per
stage (.github/classroom/autograding.json).
"""

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "reduction.ipynb"


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("autograder"):
        raise pytest.UsageError("the autograder is not installed here: install the course's autograder package first")
    if not config.getoption("grade"):
        config.option.grade = [str(NOTEBOOK)]
