"""Reading the per-student result files the grader writes, strictly.

A result file is `to_dict(StudentResult)`. Before it is used, every field is checked against the records' types
(a number where a number belongs, a string where a string does, finite points within their maximum, one entry
per known stage), then it is read back with `from_dict` and written out again: the two must be equal. So a
hand-edited, damaged or drifted file stops the run with the file and the key named, instead of quietly dropping
a stage from a leaderboard or adding one twice to a gradebook. Files are read only when they are regular files
of a bounded size, without following symbolic links, so a FIFO or a link in the folder cannot block or redirect
a run.

Where the folder holds the list of the latest grading run (`graded.txt`, autograder.batch.write_class_table), only
the files it names are read: a result an earlier run left there, of a student since removed or renamed, is no
more published than it is in grades.csv (`left_out` names them).
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Callable, Iterable
from enum import Enum
from pathlib import Path
from typing import Any

from autograder.batch import FAILURES_STEM, GRADED_LIST
from autograder.errors import GraderError
from autograder.files import read_regular_file
from autograder.records import DeviceInfo, Points, StudentResult, Timing, from_dict, to_dict
from autograder.stages import STAGES

MAX_RESULT_BYTES = 64 * 1024 * 1024  # a class's files are about 100 kB each
INTEGER_LIMIT = 2**64  # a seed, a size, a count: anything larger was not written by the grader
BACKENDS = ("gpu", "cpu")


class ResultsError(GraderError):
    """A results folder or file cannot be used."""


def load_results(path: Path) -> list[StudentResult]:
    """The student results in `path`: a folder of `<student>.json` files, or one such file.

    In a folder, JSON files that are not student results (no "stages" key: a summary, a calibration copy), and
    those the latest grading run did not write (`left_out`), are left alone; every file that is one must read back
    exactly. Results come sorted by student.
    """
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise ResultsError(f"{path}: no such file or folder; give the folder `autograder grade` wrote results to")
    if not path.is_dir():
        results = [_read_result(path, _read_json(path))]
    else:
        results = []
        stale = set(left_out(path))
        for file in sorted(path.glob("*.json")):
            if file.name in stale:
                continue
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


def left_out(path: Path) -> list[str]:
    """The `.json` files of the results folder `path` that its latest grading run did not write or keep (none
    where the folder has no list of that run: one written by an earlier version)."""
    listing = Path(path) / GRADED_LIST
    if not Path(path).is_dir() or not listing.exists():
        return []
    try:
        graded = set(read_regular_file(listing, MAX_RESULT_BYTES).decode("utf-8").splitlines())
    except (OSError, UnicodeDecodeError) as error:
        raise ResultsError(f"{listing}: cannot read the list of the latest grading run ({error}); grade the class "
                           "again, or delete it to publish every result file") from None
    return sorted(file.name for file in Path(path).glob("*.json")
                  if file.name not in graded and file.stem != FAILURES_STEM)


def results_folder(path: Path) -> Path:
    """The folder that holds the results (the folder itself, or a result file's folder)."""
    path = Path(path)
    return path if path.is_dir() else path.parent


def _read_json(file: Path) -> Any:
    try:
        return json.loads(read_regular_file(file, MAX_RESULT_BYTES).decode("utf-8"), object_pairs_hook=_unique_keys)
    except OSError as error:
        raise ResultsError(f"{file}: cannot read it ({error.strerror}); result files are the plain files "
                           "`autograder grade` writes") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        # ValueError: bad JSON, a repeated key, or an integer too long to convert; RecursionError: too deep.
        reason = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise ResultsError(f"{file}: cannot read it as JSON ({reason})") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise ValueError(f"the key {key!r} appears twice in one object")
        data[key] = value
    return data


def _read_result(file: Path, data: Any) -> StudentResult:
    problem = _problem(StudentResult, data, "")
    if problem is not None:
        raise ResultsError(f"{file}: {problem}; re-grade the student with this autograder version (the file was "
                           "written by another version, or edited or damaged)")
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


def _problem(kind: Any, value: Any, where: str) -> str | None:
    """What is wrong with `value` as JSON of the type `kind` ("at /stages/0/points/correctness: ..."), or None."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        inner = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        return _problem(inner[0], value, where)
    if origin is tuple:
        if not isinstance(value, list):
            return f"at {where or '/'}: a list is needed, not {_shown(value)}"
        args = typing.get_args(kind)
        if len(args) == 2 and args[1] is Ellipsis:
            args = (args[0],) * len(value)
        elif len(args) != len(value):
            return f"at {where}: {len(args)} items are needed, not {len(value)}"
        return next(filter(None, (_problem(arg, item, f"{where}/{index}")
                                  for index, (arg, item) in enumerate(zip(args, value, strict=True)))), None)
    if isinstance(kind, type) and issubclass(kind, Enum):
        names = [member.value for member in kind]
        if isinstance(value, str) and value in names:
            return None
        return f"at {where}: one of {', '.join(names)} is needed, not {_shown(value)}"
    if dataclasses.is_dataclass(kind):
        return _record_problem(kind, value, where)
    if kind is str:
        return None if isinstance(value, str) else f"at {where}: a string is needed, not {_shown(value)}"
    if kind is bool:
        return None if isinstance(value, bool) else f"at {where}: true or false is needed, not {_shown(value)}"
    if kind in (int, float):
        whole = isinstance(value, int) and not isinstance(value, bool)
        if kind is int and not whole:
            return f"at {where}: a whole number is needed, not {_shown(value)}"
        if not whole and not isinstance(value, float):
            return f"at {where}: a number is needed, not {_shown(value)}"
        if whole and abs(value) >= INTEGER_LIMIT:
            return f"at {where}: {str(value)[:12]}... is out of range"
        return None  # NaN or infinite may be data: a kernel's output, a timing's spread over one sample
    return f"at {where}: cannot check a {kind}"  # a record field of a type this reader does not know: a bug


def _record_problem(kind: type, value: Any, where: str) -> str | None:
    if not isinstance(value, dict):
        return f"at {where or '/'}: an object is needed, not {_shown(value)}"
    fields = dataclasses.fields(kind)
    names = {field.name for field in fields}
    unknown = [key for key in value if key not in names]
    if unknown:
        return f"at {where}/{unknown[0]}: an unknown key"
    hints = typing.get_type_hints(kind)
    for field in fields:
        key = f"{where}/{field.name}"
        if field.name not in value:
            required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
            if required:
                return f"at {key}: missing"
            continue
        problem = _problem(hints[field.name], value[field.name], key)
        if problem is not None:
            return problem
    rule = _RULES.get(kind)
    return rule(value, where) if rule else None


def _points_problem(points: dict[str, Any], where: str) -> str | None:
    for name in ("correctness", "performance", "penalty", "max_correctness", "max_performance", "technique"):
        if not math.isfinite(points.get(name, 0.0)):
            return f"at {where}/{name}: a finite number is needed, not {points[name]!r}"
        if points.get(name, 0.0) < 0:
            return f"at {where}/{name}: points cannot be negative ({points[name]!r})"
    for earned, most in (("correctness", "max_correctness"), ("performance", "max_performance")):
        if points[earned] > points[most]:
            return f"at {where}/{earned}: {points[earned]!r} is more than {most} ({points[most]!r})"
    return None


def _timing_problem(timing: dict[str, Any], where: str) -> str | None:
    if timing["median_ms"] <= 0:
        return f"at {where}/median_ms: a time must be positive ({timing['median_ms']!r})"
    for name in ("rse", "repetitions", "gbps"):
        if timing[name] < 0:
            return f"at {where}/{name}: cannot be negative ({timing[name]!r})"
    return None


def _device_problem(device: dict[str, Any], where: str) -> str | None:
    if device["backend"] not in BACKENDS:
        return f"at {where}/backend: one of {', '.join(BACKENDS)} is needed, not {_shown(device['backend'])}"
    return None


def _student_problem(result: dict[str, Any], where: str) -> str | None:
    if not result["student"].strip():
        return f"at {where}/student: the student's id is empty"
    known = [stage.id for stage in STAGES]
    first: dict[str, int] = {}
    for index, stage in enumerate(result["stages"]):
        if stage["stage"] not in known:
            return f"at {where}/stages/{index}/stage: no stage {stage['stage']!r} here (the stages: {', '.join(known)})"
        if stage["stage"] in first:
            return (f"at {where}/stages/{index}/stage: a second entry for stage {stage['stage']!r} (the first is "
                    f"/stages/{first[stage['stage']]}); each stage has one")
        first[stage["stage"]] = index
    return None


_RULES: dict[type, Callable[[dict[str, Any], str], str | None]] = {
    Points: _points_problem,
    Timing: _timing_problem,
    DeviceInfo: _device_problem,
    StudentResult: _student_problem,
}


def _shown(value: Any) -> str:
    """A JSON value in a message, kept short: a hand-edited file may hold anything."""
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        return "an object" if isinstance(value, dict) else "a list"
    text = json.dumps(value) if not isinstance(value, int) or abs(value) < INTEGER_LIMIT else "a huge number"
    return text if len(text) <= 40 else text[:37] + "..."


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
