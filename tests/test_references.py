from __future__ import annotations

from pathlib import Path

import pytest

from autograder import references
from autograder.errors import ConfigError


def test_every_reference_kernel_is_here() -> None:
    assert references.references_available()
    assert "reduce_shuffle" in references.reference_source("shuffle").text


def test_an_installation_without_solutions_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(references, "KERNELS_DIR", tmp_path)
    assert not references.references_available()
    with pytest.raises(ConfigError, match="AUTOGRADER_SOLUTIONS"):
        references.reference_source("naive")
