"""Grader for a CUDA parallel-reduction assignment."""

__version__ = "0.1.0"
