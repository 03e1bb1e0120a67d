"""A worker's replies are checked data: records come back whole, anything else is refused, nothing is unpickled."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from autograder import wire
from autograder.errors import CompileError, KernelFault
from autograder.records import CompilerMessage, Finding, KernelMetrics, LineMetric
from autograder.wire import WireError, check, decode_reply, encode_reply


def round_trip(value):
    status, payload = decode_reply(encode_reply("ok", value))
    assert status == "ok"
    return payload


def test_records_numbers_and_arrays_come_back_as_they_were_sent() -> None:
    finding = Finding("race_syncthreads", "a race", line=7, thread="block (0,0,0)", kernel="reduce_naive")
    metrics = KernelMetrics(lines=(LineMetric(3, "sdata[tid] += x;", 8, 24),), divergence=0.5)
    value, findings = round_trip((2.5, (finding,)))
    assert value == 2.5 and findings == (finding,)
    assert round_trip(metrics) == metrics
    assert math.isnan(round_trip(float("nan")))
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(round_trip(array), array) and round_trip(array).dtype == np.float32


def test_errors_come_back_as_the_grader_s_own_classes_with_their_data() -> None:
    status, error = decode_reply(encode_reply("error", CompileError("no", (CompilerMessage("error", 3, "x"),), "log")))
    assert status == "error" and isinstance(error, CompileError) and error.messages[0].line == 3
    status, error = decode_reply(encode_reply("error", KernelFault("hang", (Finding("deadlock", "d"),))))
    assert isinstance(error, KernelFault) and error.findings[0].kind == "deadlock"


@pytest.mark.parametrize(
    "document",
    [
        b"\x80\x04\x95not json",  # a pickle frame
        b'{"status": "maybe", "payload": 1}',
        json.dumps({"status": "ok", "payload": {"~": "record", "name": "Popen", "fields": {}}}).encode(),
        json.dumps({"status": "ok", "payload": {"~": "record", "name": "Finding",
                                                 "fields": {"kind": 3, "message": "m"}}}).encode(),
        json.dumps({"status": "ok", "payload": {"~": "record", "name": "Finding",
                                                 "fields": {"kind": "race", "message": "m", "extra": 1}}}).encode(),
        json.dumps({"status": "error", "payload": {"~": "error", "name": "SystemExit", "fields": {}}}).encode(),
        json.dumps({"status": "ok", "payload": {"~": "array", "dtype": "object", "shape": [1], "data": ""}}).encode(),
        json.dumps({"status": "ok", "payload": {"~": "record", "name": "Build", "fields": {
            "backend": "cpu", "stage_id": "naive", "source": {"text": ""}, "warnings": [],
            "files": [["a", "b"]]}}}).encode(),
        b"[" * 100_000 + b"]" * 100_000,
    ],
    ids=["pickle", "unknown-status", "unknown-record", "wrong-type", "unknown-field", "unknown-error", "object-array",
         "bytes-in-json", "deep-nesting"],
)
def test_a_reply_that_is_not_a_valid_record_is_refused(document: bytes) -> None:
    with pytest.raises(WireError):
        decode_reply(document)


def test_a_reply_over_the_size_cap_is_refused_before_it_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "MAX_REPLY_BYTES", 100)
    with pytest.raises(WireError, match="over the 100-byte limit"):
        decode_reply(b'{"status": "ok", "payload": "' + b"x" * 200 + b'"}')


def test_a_reply_is_checked_against_what_the_function_returns() -> None:
    assert check(list[tuple[str, float]], [("a", 1)]) == [("a", 1.0)]
    assert check(tuple[float, tuple[Finding, ...]], (0.5, ())) == (0.5, ())
    for shape, value in ((list[float], "x"), (tuple[float, float], (1.0,)), (float, "1.0"), (type(None), 0)):
        with pytest.raises(WireError):
            check(shape, value)
