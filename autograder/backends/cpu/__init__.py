"""The CPU backend: runs the student's unchanged CUDA C on a CPU with race, bounds and deadlock checks."""

from autograder.backends.cpu.backend import SCHEDULES, CpuBackend

__all__ = ["SCHEDULES", "CpuBackend"]
