"""Shared fixtures, and the rule that gpu-marked tests skip cleanly where there is no GPU."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest


@functools.cache
def gpu_available() -> bool:
    """True when PyCUDA imports and sees a device. Checked in a child process, so this one holds no context."""
    import subprocess
    import sys

    probe = "import pycuda.driver as d; d.init(); assert d.Device.count() > 0"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One CPU-backend cache for the whole session: every in-process CpuBackend then loads the same runtime
    library (two copies of it in one process would keep two sets of counters; a worker holds one backend)."""
    return tmp_path_factory.mktemp("cpu-cache")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("gpu" in item.keywords for item in items) and not gpu_available():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU and PyCUDA")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
