"""The class memo: identical kernels are graded once, and a kernel met again over another baseline is only
timed again, never checked again; what it gives equals grading without a memo."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from autograder.grade import GradeOptions, grade_stages
from autograder.memo import StageMemo
from autograder.records import KernelSource, StageResult, Status, to_dict
from autograder.references import reference_source
from autograder.sanitizer import Sanitized

OPTIONS = GradeOptions(backend="cpu", seed=20261123, quick=True)
WANTED = ["naive", "anti_divergence"]


def verdict(result: StageResult) -> str:
    fields = ("status", "message", "points", "findings", "cases", "technique", "performance")
    return json.dumps([to_dict(getattr(result, f)) for f in fields])


def sources(naive: str) -> dict[str, KernelSource]:
    return {"naive": KernelSource(naive), "anti_divergence": reference_source("anti_divergence")}


def test_a_stage_met_again_over_another_baseline_is_not_checked_again(tmp_path: Path) -> None:
    right = reference_source("naive").text
    wrong = right.replace("g_out[blockIdx.x] = sdata[0];", "g_out[blockIdx.x] = sdata[0] + 1.0f;")
    memo = GradeOptions(**{**OPTIONS.__dict__, "memo_dir": tmp_path})
    first = grade_stages(sources(right), only=WANTED, options=memo)
    # The same anti_divergence kernel, now over the reference naive (this student's own is wrong).
    second = grade_stages(sources(wrong), only=WANTED, options=memo)
    third = grade_stages(sources(right), only=WANTED, options=memo)  # the first student's notebook again

    assert [r.status for r in first] == [Status.CORRECT, Status.CORRECT]
    assert second[0].status is Status.INCORRECT
    assert {phase for phase, _ in first[1].phases} >= {"compile", "correctness", "analysis"}
    assert {phase for phase, _ in second[1].phases} == {"compile"}  # built for its timing, not checked again
    assert all(result.phases == () for result in third)  # everything from the memo
    alone = grade_stages(sources(wrong), only=WANTED, options=OPTIONS)
    assert [verdict(r) for r in second] == [verdict(r) for r in alone]
    assert [verdict(r) for r in third] == [verdict(r) for r in first]


def test_a_claimed_result_is_made_once_and_claims_never_deadlock(tmp_path: Path) -> None:
    memo = StageMemo(tmp_path)
    made: list[str] = []

    def make(name: str, keys: list[str]) -> None:
        with memo.claim(keys):
            if memo.get(keys[0], Sanitized) is None:
                made.append(name)
                time.sleep(0.2)  # another claim of the same key comes while this one makes it
                for key in keys:
                    memo.put(key, Sanitized(notes=(name,)))

    # Two students at once on the same keys, named in opposite orders: one makes them, the other reads them.
    claims = (("a", ["x", "y"]), ("b", ["y", "x"]))
    threads = [threading.Thread(target=make, args=claim) for claim in claims]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert not any(thread.is_alive() for thread in threads)
    assert len(made) == 1
    assert memo.get("x", Sanitized) == memo.get("y", Sanitized) == Sanitized(notes=(made[0],))
