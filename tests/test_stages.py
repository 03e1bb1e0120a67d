from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from autograder.stages import MAX2D_BASELINE, REQUIRED_STAGE_IDS, STAGE_IDS, STAGES, get_stage


def test_the_seven_stages_in_their_fixed_order() -> None:
    assert REQUIRED_STAGE_IDS == (
        "naive",
        "anti_divergence",
        "sequential",
        "first_add",
        "unrolled_warp",
        "shuffle",
        "max2d",
    )
    assert [s.number for s in STAGES] == list(range(1, len(STAGES) + 1))


def test_each_stage_builds_on_the_one_before() -> None:
    for earlier, later in zip(STAGES, STAGES[1:], strict=False):
        if later.id == "max2d":
            assert later.previous == MAX2D_BASELINE.id
        else:
            assert later.previous == earlier.id or (later.optional and later.previous == "shuffle")
    assert STAGES[0].previous is None


def test_first_add_and_later_take_two_elements_per_thread() -> None:
    per_thread = {s.id: s.elements_per_thread for s in STAGES if s.shape.value == "sum_1d"}
    assert per_thread["sequential"] == 1 and per_thread["first_add"] == 2 and per_thread["shuffle"] == 2


def test_unknown_stage_lists_the_valid_ids() -> None:
    with pytest.raises(KeyError, match="naive"):
        get_stage("nave")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_mangled_names_match_what_nvcc_emits(tmp_path) -> None:
    """The GPU backend finds kernels by their C++ symbol; nvcc must agree with the catalogue's mangling."""
    source = "\n".join(f"{s.signature} {{}}" for s in (*STAGES, MAX2D_BASELINE))
    (tmp_path / "k.cu").write_text(source)
    subprocess.run(
        ["nvcc", "-arch=sm_90", "-cubin", "-o", str(tmp_path / "k.cubin"), str(tmp_path / "k.cu")],
        check=True,
        capture_output=True,
    )
    symbols = set(re.findall(rb"_Z\w+", (tmp_path / "k.cubin").read_bytes()))
    for stage in (*STAGES, MAX2D_BASELINE):
        assert stage.mangled_name.encode() in symbols


def test_stub_is_a_kernel_with_the_stage_signature() -> None:
    for stage_id in STAGE_IDS:
        stub = get_stage(stage_id).stub_source()
        assert get_stage(stage_id).signature in stub and "TODO" in stub
