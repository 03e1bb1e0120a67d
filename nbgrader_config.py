"""nbgrader's configuration for this course directory; run nbgrader from the repository root.

The instructor's notebook lives in `solutions/`, the released one in `assignments/`, hand-ins in `submissions/`:

    nbgrader generate_assignment reduction   # solutions/reduction -> assignments/reduction
    nbgrader autograde reduction             # submissions/<student>/reduction -> autograded/<student>/reduction
    nbgrader generate_feedback reduction     # autograded/ -> feedback/
"""

from nbgrader.converters import GenerateAssignment
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import ClearSolutions

from autograder.nbgrader_support import GRADED_CELL_TIMEOUT_S, INSTRUCTOR_ONLY_FILES, ClearKernelSolutions

c = get_config()  # type: ignore[name-defined]  # noqa: F821  (traitlets defines get_config for config files)

c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "assignments"
c.CourseDirectory.submitted_directory = "submissions"
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"

# The reference kernels and the notebook's build script sit beside the source notebook. Without this,
# generate_assignment would copy the solutions into the release (and autograde into every student's folder).
c.CourseDirectory.ignore = [*CourseDirectory.ignore.default(), *INSTRUCTOR_ONLY_FILES]

# A kernel cell is released as its stage's compilable stub, not as nbgrader's `raise NotImplementedError()`.
c.GenerateAssignment.preprocessors = [
    ClearKernelSolutions if step is ClearSolutions else step for step in GenerateAssignment.preprocessors.default()
]

# A graded cell grades its stage and the previous one (timing included on a GPU); nbgrader's 30 s would cut it off.
c.Execute.timeout = GRADED_CELL_TIMEOUT_S
