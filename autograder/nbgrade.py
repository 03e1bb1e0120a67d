"""nbgrader's graded cells: `python -P -m autograder.nbgrade NOTEBOOK STAGE` grades one stage of the notebook
file and prints `{"points": ..., "report": ...}` as JSON.

A graded cell runs in the student's kernel, after every cell the student wrote, so any object there may have been
replaced: a grading function, a module, an environment variable. The grading therefore runs here, in a fresh
Python that imports nothing from the kernel and reads the notebook *file* with the grader's own code. The cell
(`graded_cell`) starts it with `-P`, so the notebook's folder is not on sys.path (an `autograder/` or a
`sitecustomize.py` put there is not imported), and with the environment the kernel was *started* with
(/proc/self/environ on Linux), not the kernel's `os.environ`, which a student cell can change: PATH, PYTHONPATH,
LD_PRELOAD and the settings AUTOGRADER_BACKEND, AUTOGRADER_QUICK and AUTOGRADER_RUBRIC are the instructor's.
Student kernels are compiled and run in the grader's sandbox, as with `autograder grade`.

What this cannot stop is in the kernel itself: a cell that replaces `subprocess`, `open`, the builtins or the
kernel's display can still forge the number the graded cell shows, and student code can change files with the
rights of whoever runs nbgrader. nbgrader executes student Python by design. The grade of record is `autograder
grade`, which never runs student Python, and `autograder grade --assignment` lists where nbgrader's gradebook
disagrees with it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GRADED_CELL_PREFIX = "points_"  # a stage's graded cell has the grade_id points_<stage id>


def graded_cell(stage_id: str, notebook: str = "reduction.ipynb") -> str:
    """The code of a stage's hidden graded cell: it runs this module, shows the report and ends with the points,
    which nbgrader takes as the cell's partial credit."""
    return (
        "import json, os, subprocess, sys\n"
        "try:  # the environment the kernel started with: a cell of the notebook may have changed os.environ\n"
        '    with open("/proc/self/environ", "rb") as started:\n'
        '        env = dict(os.fsdecode(item).split("=", 1) for item in started.read().split(b"\\0") if b"=" in item)\n'
        "except OSError:  # no /proc: not Linux\n"
        "    env = dict(os.environ)\n"
        f'command = [sys.executable, "-P", "-m", "autograder.nbgrade", "{notebook}", "{stage_id}"]\n'
        "graded = subprocess.run(command, env=env, capture_output=True, text=True)\n"
        'assert graded.returncode == 0, graded.stderr[-3000:] or "the grader stopped without a message"\n'
        "graded = json.loads(graded.stdout)\n"
        'print(graded["report"])\n'
        'graded["points"]'
    )


def grade(notebook: Path, stage_id: str) -> dict[str, object]:
    """The points and the report of one stage of the notebook file, as `autograder grade` gives them."""
    from autograder.errors import NotebookError
    from autograder.grade import grade_stages, new_worker
    from autograder.notebook import stage_cells
    from autograder.selfcheck import StageReport, environment_options
    from autograder.stages import STAGE_IDS, get_stage

    stage = get_stage(stage_id)
    options = environment_options().with_seed()
    try:
        cells = stage_cells(notebook)
        sources = {cell.stage: cell.source for cell in cells.values()}
        problems = {cell.stage: cell.problem for cell in cells.values() if cell.problem and cell.attempted}
    except NotebookError as error:
        sources, problems = {}, {stage.id: str(error)}
    # The stage's speedup is over the student's own previous stage when that one is correct, so it is graded too.
    only = [stage.previous, stage.id] if stage.previous in STAGE_IDS else [stage.id]
    with new_worker(options) as worker:
        result = grade_stages(sources, only=only, options=options, worker=worker, problems=problems)[-1]
        device = worker.device
    points = round(result.points.total, 6) if result.points else 0.0
    return {"points": points, "report": str(StageReport(result, device=device))}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -P -m autograder.nbgrade NOTEBOOK STAGE", file=sys.stderr)
        return 2
    from autograder.errors import GraderError

    try:
        graded = grade(Path(args[0]), args[1])
    except GraderError as error:
        print(f"the grader could not grade this stage: {error}", file=sys.stderr)
        return 1
    print(json.dumps(graded))
    return 0


if __name__ == "__main__":
    sys.exit(main())
