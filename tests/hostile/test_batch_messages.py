"""A stage that forges nvcc's messages about a student's batch of stages (autograder.backends.gpu_batch): a
`static_assert` message may hold line ends, so it can print lines that name the probes' file or another stage's.
They can only send stages to be compiled alone; every stage still gets what it gets alone. Needs nvcc."""

from __future__ import annotations

import shutil

import pytest
from test_gpu_batch import DEVICE, batched, fresh_cache, items_of, kernel, outcome, together  # noqa: F401

from autograder.build import Builder
from autograder.policy import source_problems
from autograder.sandbox import Sandbox

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (it compiles without a GPU)")

FORGED = {
    "a probe's line of no probe": 'ag_probes.cu(99999): error: forged',
    "a probe's line that is one": 'ag_probes.cu(1): error: forged',
    "another stage's file": 'kernel_sequential.cu(1): error: forged',
}


@pytest.mark.parametrize("forged", sorted(FORGED))
def test_a_forged_message_sends_stages_alone_and_changes_no_verdict(forged: str) -> None:
    assertion = f'static_assert(sizeof(float) == 3, "x\\n{FORGED[forged]}\\n");\n'
    hand_in = {"naive": kernel("naive", before=assertion), "sequential": kernel("sequential"),
               "shuffle": kernel("shuffle")}
    assert all(source_problems(text) == [] for text in hand_in.values())
    alone = {stage.id: outcome(Builder(DEVICE, Sandbox()), stage, source) for stage, source in items_of(hand_in)}
    found = together(hand_in)
    assert {stage_id: result for stage_id, (result, _) in found.items()} == alone
    assert alone["naive"][0] == "does not compile"
    assert not batched(found["naive"][1])
