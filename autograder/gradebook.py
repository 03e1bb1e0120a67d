"""Where nbgrader's gradebook disagrees with `autograder grade`.

`nbgrader autograde` executes the students' Python, so a hand-in can forge what lands in nbgrader's gradebook;
`autograder grade` never runs student Python and is the grade of record. After grading an nbgrader course
(`autograder grade submissions/ --assignment reduction`), the command line compares the two stage by stage and
lists every difference, so a forged or stale gradebook score is seen before it is published.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from autograder.errors import GraderError
from autograder.nbgrade import GRADED_CELL_PREFIX
from autograder.records import StudentResult

TOLERANCE = 1e-6


@dataclass(frozen=True)
class Disagreement:
    student: str
    stage: str
    ours: float
    gradebook: float


def course_gradebook(submissions: Path) -> Path:
    """nbgrader's gradebook of the course whose submitted folder is `submissions` (nbgrader's default place)."""
    return submissions.resolve().parent / "gradebook.db"


def compare(
    results: Sequence[StudentResult], gradebook: Path, assignment: str
) -> tuple[list[Disagreement], list[str]]:
    """The stages whose gradebook score differs from ours, and the students the gradebook has not autograded;
    GraderError where the gradebook cannot be read."""
    from nbgrader.api import Gradebook, MissingEntry  # only here: nbgrader pulls in SQLAlchemy
    from sqlalchemy.exc import SQLAlchemyError

    disagreements: list[Disagreement] = []
    missing: list[str] = []
    try:
        with Gradebook(f"sqlite:///{gradebook}") as book:
            for result in results:
                try:
                    notebook = book.find_submission_notebook(assignment, Path(result.notebook).stem, result.student)
                except MissingEntry:
                    missing.append(result.student)
                    continue
                theirs = {grade.name.removeprefix(GRADED_CELL_PREFIX): grade.score or 0.0 for grade in notebook.grades}
                for stage in result.stages:
                    ours = stage.points.total if stage.points else 0.0
                    if stage.stage in theirs and abs(ours - theirs[stage.stage]) > TOLERANCE:
                        disagreements.append(Disagreement(result.student, stage.stage, ours, theirs[stage.stage]))
    except SQLAlchemyError as error:  # a damaged file, another kind of database, a file that cannot be opened
        reason = str(getattr(error, "orig", None) or error).splitlines()[0]
        raise GraderError(f"{gradebook}: nbgrader's gradebook cannot be read ({reason}), so these grades were not "
                          "compared with it (they are written)") from None
    return disagreements, missing


def report(results: Sequence[StudentResult], gradebook: Path, assignment: str) -> str:
    """The comparison in words, for the terminal."""
    disagreements, missing = compare(results, gradebook, assignment)
    unseen = f"; it has no autograded notebook of {', '.join(missing)}" if missing else ""
    if not disagreements:
        return f"nbgrader's gradebook ({gradebook.name}): the gradebook agrees with these grades{unseen}"
    lines = [
        f"nbgrader's gradebook ({gradebook.name}) and these grades disagree on {len(disagreements)} stage(s){unseen}. "
        "These grades are the grade of record: nbgrader ran the students' Python, which can forge its scores."
    ]
    lines += [f"  {d.student}, {d.stage}: {d.ours:g} here, {d.gradebook:g} in the gradebook" for d in disagreements]
    return "\n".join(lines)
