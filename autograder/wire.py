"""What a worker sends back: plain JSON, checked against the record shapes, never code.

A worker runs student code, so anything it says may have been written by a student. Its replies are JSON
documents of bounded size, decoded here into the grader's own records: every record is rebuilt field by field
from its type annotations, and a value of the wrong type, an unknown record or error class, or a document over
the size cap is refused (WireError). Nothing is unpickled.

Values that cross: None, bools, numbers (NaN and infinities too), strings, lists and tuples, dicts with string
keys, float32/float64 numpy arrays, the records of autograder.records (and of the calibration and timing
settings), and the grader's own errors.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import math
import types
import typing
from enum import Enum
from typing import Any

import numpy as np

from autograder import records
from autograder.errors import BackendUnavailable, CompileError, GraderError, KernelFault, KernelTimeout, NotebookError

MAX_REPLY_BYTES = 64 << 20


def printable(text: str) -> str:
    """`text` with every character a terminal would act on (escape sequences, carriage returns, bells, and the
    other control and format characters) written as its escape: what a student's kernel printed, shown to a TA."""
    return "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text)
ARRAY_DTYPES = ("float32", "float64")


class WireError(GraderError):
    """A worker's reply is not a valid record: the worker is broken or was taken over by a kernel."""


def _record_classes() -> dict[str, type]:
    from autograder import calibration, timing

    classes = [
        getattr(records, name)
        for name in dir(records)
        if dataclasses.is_dataclass(getattr(records, name)) and isinstance(getattr(records, name), type)
    ]
    classes += [calibration.Calibration, calibration.StageCalibration, timing.TimingSettings]
    return {cls.__name__: cls for cls in classes}


def _error_classes() -> dict[str, type[GraderError]]:
    from autograder.timing import WrongTimedResult

    classes = (GraderError, NotebookError, CompileError, KernelFault, KernelTimeout, BackendUnavailable,
               WrongTimedResult)
    return {cls.__name__: cls for cls in classes}


@functools.cache
def _registries() -> tuple[dict[str, type], dict[str, type[GraderError]]]:
    """The record and error classes a reply may name (looked up on first use: calibration and timing import
    the worker's modules, which import this one)."""
    return _record_classes(), _error_classes()


# --- encoding (in the worker) ------------------------------------------------------------------------------


def encode_reply(status: str, payload: Any) -> bytes:
    """A reply ("ok" with a value, or "error" with a GraderError) as one JSON document."""
    body = _encode_error(payload) if status == "error" else _encode(payload)
    return json.dumps({"status": status, "payload": body}, allow_nan=True).encode()


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, Enum):
        return _encode(value.value)
    if isinstance(value, np.ndarray):
        if value.dtype.name not in ARRAY_DTYPES:
            raise TypeError(f"arrays of {value.dtype} do not cross the worker boundary")
        data = base64.b64encode(np.ascontiguousarray(value).tobytes()).decode()
        return {"~": "array", "dtype": value.dtype.name, "shape": list(value.shape), "data": data}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"~": "record", "name": type(value).__name__, "fields": fields}
    if isinstance(value, (tuple, list)):
        return {"~": "tuple" if isinstance(value, tuple) else "list", "items": [_encode(v) for v in value]}
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise TypeError("only dicts with string keys cross the worker boundary")
        return {"~": "dict", "items": {key: _encode(v) for key, v in value.items()}}
    raise TypeError(f"a {type(value).__name__} does not cross the worker boundary")


def _encode_error(error: BaseException) -> dict[str, Any]:
    if not isinstance(error, GraderError):
        error = GraderError(repr(error))
    fields: dict[str, Any] = {"message": str(error)}
    if isinstance(error, CompileError):
        fields.update(messages=_encode(error.messages), log=error.log)
    if isinstance(error, KernelFault):
        fields.update(findings=_encode(error.findings))
    name = type(error).__name__ if type(error).__name__ in _registries()[1] else "GraderError"
    return {"~": "error", "name": name, "fields": fields}


# --- decoding (in the grader) ------------------------------------------------------------------------------


def decode_reply(data: bytes) -> tuple[str, Any]:
    """("ok", value) or ("error", GraderError) from a worker's JSON reply. Raises WireError."""
    if len(data) > MAX_REPLY_BYTES:
        raise WireError(f"the worker's reply is {len(data)} bytes, over the {MAX_REPLY_BYTES}-byte limit")
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise WireError(f"the worker's reply is not JSON ({type(error).__name__})") from None
    if not isinstance(document, dict) or document.get("status") not in ("ok", "error"):
        raise WireError("the worker's reply has no status")
    try:
        if document["status"] == "error":
            return "error", _decode_error(document.get("payload"))
        return "ok", _decode(document.get("payload"))
    except (KeyError, TypeError, ValueError, RecursionError) as error:
        raise WireError(f"the worker's reply does not match the record shapes: {error}") from None


def check(tp: Any, value: Any) -> Any:
    """A decoded reply as the type `tp` (the called function's return annotation) says it must be: a forged
    frame of valid JSON can hold any value, and the grader unpacks replies by their shape. Raises WireError."""
    try:
        return _build(tp, value)
    except RecursionError:
        raise WireError("the worker's reply is nested too deep") from None


def _decode(data: Any) -> Any:
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if not isinstance(data, dict):
        raise WireError(f"unexpected {type(data).__name__} in a reply")
    kind = data.get("~")
    if kind in ("tuple", "list"):
        items = [_decode(item) for item in _expect(data["items"], list)]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        return {_expect(key, str): _decode(value) for key, value in _expect(data["items"], dict).items()}
    if kind == "array":
        return _array(data)
    if kind == "record":
        cls = _registries()[0].get(_expect(data["name"], str))
        if cls is None:
            raise WireError(f"unknown record {data['name']!r} in a reply")
        return _build(cls, _decode_fields(data))
    if kind == "error":
        return _decode_error(data)
    raise WireError(f"unknown value kind {kind!r} in a reply")


def _decode_fields(data: dict[str, Any]) -> dict[str, Any]:
    return {_expect(key, str): _decode(value) for key, value in _expect(data["fields"], dict).items()}


def _decode_error(data: Any) -> GraderError:
    data = _expect(data, dict)
    if data.get("~") != "error":
        raise WireError("an error reply without an error")
    cls = _registries()[1].get(_expect(data["name"], str))
    if cls is None:
        raise WireError(f"unknown error class {data['name']!r} in a reply")
    fields = _decode_fields(data)
    message = _expect(fields.get("message", ""), str)
    if issubclass(cls, CompileError):
        messages = _build(tuple[records.CompilerMessage, ...], fields.get("messages", ()))
        return cls(message, messages, _expect(fields.get("log", ""), str))
    if issubclass(cls, KernelFault):
        return cls(message, _build(tuple[records.Finding, ...], fields.get("findings", ())))
    return cls(message)


def _array(data: dict[str, Any]) -> np.ndarray:
    dtype = _expect(data["dtype"], str)
    if dtype not in ARRAY_DTYPES:
        raise WireError(f"arrays of {dtype} are refused")
    shape = tuple(_expect(n, int) for n in _expect(data["shape"], list))
    raw = base64.b64decode(_expect(data["data"], str), validate=True)
    array = np.frombuffer(raw, dtype=dtype)
    if array.size != math.prod(shape):
        raise WireError("an array's data does not match its shape")
    return array.reshape(shape).copy()


def _expect(value: Any, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise WireError(f"expected {getattr(kind, '__name__', 'a sequence')}, got {type(value).__name__}")
    return value


def _build(tp: Any, value: Any) -> Any:
    """`value` (already decoded) checked against the type `tp`, records rebuilt from their annotations."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if tp is type(None):
        if value is not None:
            raise WireError("expected None")
        return None
    if origin in (typing.Union, types.UnionType):
        arguments = typing.get_args(tp)
        if value is None and type(None) in arguments:
            return None
        for argument in arguments:
            if argument is type(None):
                continue
            try:
                return _build(argument, value)
            except WireError:
                continue
        raise WireError(f"{type(value).__name__} is none of {tp}")
    if origin is tuple:
        items = _expect(value, (tuple, list))
        arguments = typing.get_args(tp)
        if len(arguments) == 2 and arguments[1] is Ellipsis:
            return tuple(_build(arguments[0], item) for item in items)
        if len(arguments) != len(items):
            raise WireError(f"expected {len(arguments)} items, got {len(items)}")
        return tuple(_build(argument, item) for argument, item in zip(arguments, items, strict=True))
    if origin is list:
        return [_build(typing.get_args(tp)[0], item) for item in _expect(value, (tuple, list))]
    if origin is dict:
        key_type, value_type = typing.get_args(tp)
        return {_build(key_type, k): _build(value_type, v) for k, v in _expect(value, dict).items()}
    if isinstance(tp, type) and issubclass(tp, Enum):
        try:
            return tp(value.value if isinstance(value, Enum) else value)
        except ValueError:
            raise WireError(f"{value!r} is not a {tp.__name__}") from None
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            value = {f.name: getattr(value, f.name) for f in dataclasses.fields(tp)}
        fields = _expect(value, dict)
        hints = typing.get_type_hints(tp)
        known = {f.name for f in dataclasses.fields(tp)}
        unknown = set(fields) - known
        if unknown:
            raise WireError(f"{tp.__name__} has no field {sorted(unknown)[0]!r}")
        try:
            return tp(**{name: _build(hints[name], item) for name, item in fields.items()})
        except TypeError as error:
            raise WireError(f"{tp.__name__}: {error}") from None
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise WireError(f"expected a number, got {type(value).__name__}")
        return float(value)
    if tp in (int, str, bool):
        return _expect(value, tp)
    raise WireError(f"cannot check a value of type {tp}")
