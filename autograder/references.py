"""The reference kernels: `solutions/reduction/kernels/<stage id>.cu`, the single source of truth.

The solutions notebook is built from these files, and the grader times a stage against them.
"""

from __future__ import annotations

import os
from pathlib import Path

from autograder.errors import ConfigError
from autograder.records import KernelSource

# Where the solutions live: AUTOGRADER_SOLUTIONS, else the checkout this package sits in.
SOLUTIONS_DIR = Path(os.environ.get("AUTOGRADER_SOLUTIONS", Path(__file__).resolve().parents[1] / "solutions"))
KERNELS_DIR = SOLUTIONS_DIR / "reduction" / "kernels"


def reference_source(stage_id: str) -> KernelSource:
    """The reference kernel of a stage (or of `max2d_baseline`)."""
    path = KERNELS_DIR / f"{stage_id}.cu"
    try:
        return KernelSource(text=path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"no reference kernel for '{stage_id}' at {path}; set AUTOGRADER_SOLUTIONS to the solutions folder"
        ) from None


def references_available() -> bool:
    """Whether every reference kernel is here. A student's installation may hold none: speed is then graded
    only by the course's grader."""
    from autograder.stages import MAX2D_BASELINE, STAGE_IDS

    return all((KERNELS_DIR / f"{stage_id}.cu").exists() for stage_id in (*STAGE_IDS, MAX2D_BASELINE.id))
