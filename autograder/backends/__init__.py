"""Choosing a backend: `gpu` (PyCUDA on an NVIDIA GPU), `cpu` (the CPU backend), or `auto`."""

from __future__ import annotations

from typing import Any

from autograder.backends.base import Backend
from autograder.errors import BackendUnavailable

BACKEND_NAMES = ("auto", "gpu", "cpu")


def create_backend(name: str, **options: Any) -> Backend:
    """A ready backend. `auto` takes the GPU when PyCUDA and a device are there, else the CPU backend.

    Options a backend does not take are ignored, so one options dict can serve either.
    """
    if name not in BACKEND_NAMES:
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    if name in ("gpu", "auto"):
        try:
            from autograder.backends.gpu import GpuBackend

            return GpuBackend(**_accepted(GpuBackend, options))
        except BackendUnavailable:
            if name == "gpu":
                raise
    from autograder.backends.cpu import CpuBackend

    return CpuBackend(**_accepted(CpuBackend, options))


def _accepted(cls: type, options: dict[str, Any]) -> dict[str, Any]:
    import inspect

    parameters = inspect.signature(cls).parameters
    return {key: value for key, value in options.items() if key in parameters}
