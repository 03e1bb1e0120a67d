"""Reading the per-student result files the grader writes, strictly.

A result file is `to_dict(StudentResult)`. It is read back with `from_dict` and then written out again: the
two must be equal, so a renamed, missing or extra key anywhere in the file stops the run with the file and the
key named, instead of quietly dropping a stage from a leaderboard.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from autograder.errors import GraderError
from autograder.records import StudentResult, from_dict, to_dict


class ResultsError(GraderError):
    """A results folder or file cannot be used."""


def load_results(path: Path) -> list[StudentResult]:
    """The student results in `path`: a folder of `<student>.json` files, or one such file.

    In a folder, JSON files that are not student results (no "stages" key: a summary, a calibration copy) are
    left alone; every file that is one must read back exactly. Results come sorted by student.
    """
    path = Path(path)
    if not path.exists():
        raise ResultsError(f"{path}: no such file or folder; give the folder `autograder grade` wrote results to")
    if path.is_file():
        results = [_read_result(path, _read_json(path))]
    else:
        results = []
        for file in sorted(path.glob("*.json")):
            data = _read_json(file)
            if isinstance(data, dict) and "stages" in data:
                results.append(_read_result(file, data))
    if not results:
        raise ResultsError(f"{path}: no student result files (<student>.json) here; run `autograder grade` first")
    seen: dict[str, str] = {}
    for result in results:
        if result.student in seen:
            raise ResultsError(f"student {result.student!r} has two result files: {seen[result.student]} and "
                               f"{result.notebook}; keep one")
        seen[result.student] = result.notebook
    return sorted(results, key=lambda r: r.student)


def results_folder(path: Path) -> Path:
    """The folder that holds the results (the folder itself, or a result file's folder)."""
    path = Path(path)
    return path if path.is_dir() else path.parent


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ResultsError(f"{file}: cannot read it as JSON ({error})") from error


def _read_result(file: Path, data: Any) -> StudentResult:
    try:
        result = from_dict(StudentResult, data)
    except (TypeError, ValueError, KeyError, AttributeError) as error:
        raise ResultsError(f"{file}: not a student result this version can read ({error}); re-grade with the "
                           "same autograder version") from error
    difference = _first_difference(to_dict(result), data, "")
    if difference is not None:
        raise ResultsError(f"{file}: the result file does not match this version's records at {difference}; "
                           "re-grade with the same autograder version")
    return result


def _first_difference(expected: Any, got: Any, where: str) -> str | None:
    """The path of the first place where `got` differs from `expected`, or None when they are equal."""
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in _ordered_union(expected, got):
            if key not in got:
                return f"{where}/{key} (missing)"
            if key not in expected:
                return f"{where}/{key} (unknown key)"
            found = _first_difference(expected[key], got[key], f"{where}/{key}")
            if found is not None:
                return found
        return None
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return f"{where} (length {len(got)}, expected {len(expected)})"
        for index, (left, right) in enumerate(zip(expected, got, strict=True)):
            found = _first_difference(left, right, f"{where}/{index}")
            if found is not None:
                return found
        return None
    if isinstance(expected, float) and isinstance(got, float) and math.isnan(expected) and math.isnan(got):
        return None  # a kernel's NaN result is data, and NaN never equals itself
    # bool is an int in Python: a true where a number belongs is drift too.
    if expected != got or isinstance(expected, bool) != isinstance(got, bool):
        return f"{where or '/'} ({got!r})"
    return None


def _ordered_union(left: Iterable[str], right: Iterable[str]) -> list[str]:
    keys = list(left)
    return keys + [key for key in right if key not in keys]
