"""Grading hand-ins with pytest: one test item per student, stage and check, for CI and GitHub Classroom.

    pytest --grade submissions/                       # every hand-in, in any layout `autograder grade` takes
    pytest --grade alice.ipynb -k shuffle             # one notebook, one stage
    pytest --grade submissions/ --grade-out results --junitxml grades.xml

The items are `<student>::<stage>::<check>`, the checks being `correct`, `races`, `technique` and `speed`.
Nothing here grades: the first item of a student to run grades the whole notebook with `grade_notebook`, the
function `autograder grade` runs (its worker processes and sandbox included), with one seed for the session;
every item of that student then reads that one StudentResult. An item passes, fails or is skipped with the words
of the student's feedback page,
and records its points and maximum as user properties, which `--junitxml` writes out. A stage's points are split
as in the Gradescope export: `correct` carries the correctness points, `races` the penalty for findings and
`technique` the loss for an absent technique (each zero or negative, out of 0), and `speed` the performance points,
so a student's items add up to the total of `autograder grade` with the same options and seed.

With `--grade`, the hand-ins are collected instead of the project's testpaths (test paths named on the command line
are still collected). Under pytest-xdist (`-n`), each student's items run on one worker, the workers grade with the
controller's seed, and the controller writes the class table. Do not use `-n` on a GPU: a GPU that times kernels
must do nothing else.

Registered through the `pytest11` entry point; it does nothing without `--grade`, and imports the grading code only
then, so other test runs do not pay for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from autograder.records import PerfVerdict, Points, Status
from autograder.stages import STAGE_IDS, STAGES

if TYPE_CHECKING:
    from autograder.batch import Submission
    from autograder.grade import GradeOptions
    from autograder.publish.figures import StageFigures
    from autograder.records import StudentResult

CHECKS = ("correct", "races", "technique", "speed")
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"  # an item's outcome, in pytest's words
SEED_KEY = "autograder_seed"  # xdist workerinput: the seed the controller drew for the run
RESULTS_KEY = "autograder_results"  # xdist workeroutput: the results a worker graded, as JSON data


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("autograder", "grading hand-ins with the autograder (autograder.pytest_plugin)")
    group.addoption(
        "--grade",
        action="append",
        default=[],
        metavar="PATH",
        help="Grade the hand-in PATH (a notebook), or every hand-in under the folder PATH, instead of collecting "
        "the testpaths: one item per student, stage and check. Repeatable.",
    )
    group.addoption(
        "--grade-backend",
        choices=("auto", "gpu", "cpu"),
        default="auto",
        help="gpu (PyCUDA), cpu (the CPU backend), or auto: the GPU when there is one. Default: auto.",
    )
    group.addoption("--grade-rubric", metavar="FILE", help="A rubric TOML file (default: autograder/rubric.toml).")
    group.addoption("--grade-seed", type=int, metavar="N", help="Reproduce a run: the seed it printed and recorded.")
    group.addoption("--grade-quick", action="store_true", help="Skip the largest correctness cases.")
    group.addoption("--grade-no-speed", action="store_true", help="Do not time correct stages on a GPU.")
    group.addoption(
        "--grade-assignment", metavar="NAME",
        help="The folder in each student's folder that holds the hand-in, in nbgrader's layout (reduction).",
    )
    group.addoption(
        "--grade-out",
        metavar="DIR",
        help="Also write the results of `autograder grade` here: <student>.json and grades.csv.",
    )


@pytest.hookimpl(trylast=True)  # after the conftests' own pytest_configure, which may set --grade
def pytest_configure(config: pytest.Config) -> None:
    paths = [Path(path) for path in config.getoption("grade")]
    if not paths:
        return
    missing = [str(path) for path in paths if not path.is_dir() and not (path.is_file() and path.suffix == ".ipynb")]
    if missing:
        raise pytest.UsageError(f"--grade {', '.join(missing)}: no such notebook (.ipynb) or folder of hand-ins")
    grading = Grading(config, paths)
    if grading.options.backend == "gpu" and getattr(config.option, "numprocesses", None) and not _is_worker(config):
        raise pytest.UsageError("--grade-backend gpu times kernels: no -n, a GPU that times must do nothing else")
    config.stash[GRADING] = grading
    config.pluginmanager.register(grading, "autograder-grading")
    named = [str(path) for path in paths]
    config.args = [*config.args, *named] if config.args_source is pytest.Config.ArgsSource.ARGS else named


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def grade_options(config: pytest.Config) -> GradeOptions:
    """The options of `autograder grade` from the --grade-* options, with the seed of the run: an xdist worker takes
    its controller's, so that every process grades with the same inputs."""
    from autograder.errors import GraderError
    from autograder.grade import GradeOptions
    from autograder.rubric import load_rubric

    seed = getattr(config, "workerinput", {}).get(SEED_KEY, config.getoption("grade_seed"))
    try:
        rubric = load_rubric(config.getoption("grade_rubric"))
    except GraderError as error:
        raise pytest.UsageError(str(error)) from None
    return GradeOptions(
        backend=config.getoption("grade_backend"),
        rubric=rubric,
        seed=seed,
        quick=config.getoption("grade_quick"),
        measure_speed=not config.getoption("grade_no_speed"),
    ).with_seed()


# --- what one item says ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """One check of one stage: its outcome, the feedback page's words for it, and its share of the stage's points."""

    outcome: str  # PASSED, FAILED or SKIPPED
    text: str
    points: float
    max_points: float


def check_verdict(check: str, figures: StageFigures) -> Verdict:
    """The verdict of `check` ("correct", "races" or "speed") on one stage of a graded student.

    An item fails when it lost points or found a defect, and is skipped when it says nothing about this hand-in:
    an optional stage not handed in, races in a kernel that never ran, speed where it is not counted (the CPU
    backend, --grade-no-speed).
    """
    # The feedback page's own account of the stage; imported here, so that a run without --grade never loads it.
    from autograder.publish.feedback import _section as feedback_section
    from autograder.publish.render import text_table

    if check not in CHECKS:
        raise ValueError(f"no check {check!r}; the checks are {', '.join(CHECKS)}")
    record = figures.result
    points = record.points if record and record.points else Points(0.0, 0.0, 0.0, 0.0, 0.0)
    share, maximum = {
        "correct": (points.correctness, points.max_correctness),
        "races": (0.0 - points.penalty, 0.0),
        "technique": (0.0 - points.technique, 0.0),
        "speed": (points.performance, points.max_performance),
    }[check]
    section = feedback_section(figures)
    rubric_lines = [f"points: {line}" for line in section.points]
    if figures.stage.optional and figures.status is Status.NOT_ATTEMPTED:
        return Verdict(SKIPPED, "optional stage, not handed in", share, maximum)
    if check == "correct":
        lines = [section.message] + ([f"hint: {section.hint}"] if section.hint else [])
        if section.compiler:
            lines += ["compiler messages (lines of the stage's notebook cell):", text_table(section.compiler)]
        if section.failed_cases:
            lines += ["cases that failed:", text_table(section.failed_cases)]
        if figures.status is Status.CORRECT:
            return Verdict(PASSED, "\n".join(lines), share, maximum)
        return Verdict(FAILED, "\n".join(lines + rubric_lines), share, maximum)
    if check == "races":
        if record is None or not record.cases:
            return Verdict(SKIPPED, f"not checked: the kernel did not run ({section.status})", share, maximum)
        if not section.findings:
            return Verdict(PASSED, "no race or bounds findings", share, maximum)
        lines = ["race and bounds findings (lines of the stage's notebook cell):"]
        return Verdict(FAILED, "\n".join([*lines, text_table(section.findings), *rubric_lines]), share, maximum)
    if check == "technique":
        measured = [c for c in record.technique if c.passed is not None] if record else []
        if not measured:
            return Verdict(SKIPPED, "not measured: the kernel did not run, or nothing is measured here", share, maximum)
        lines = [f"{c.name}: {c.value} (reference {c.reference}, required {c.required}; {c.what})" for c in measured]
        if all(c.passed for c in measured):
            return Verdict(PASSED, "\n".join(lines), share, maximum)
        return Verdict(FAILED, "\n".join(["the stage's technique is absent:", *lines, *rubric_lines]), share, maximum)
    verdict = record.performance.verdict if record else PerfVerdict.NOT_MEASURED
    lines = [section.performance] + ([text_table(section.timings)] if section.timings else [])
    if verdict is PerfVerdict.FAST_ENOUGH:
        return Verdict(PASSED, "\n".join(lines), share, maximum)
    if verdict is PerfVerdict.TOO_SLOW or maximum:  # counted, and not earned
        return Verdict(FAILED, "\n".join(lines + rubric_lines), share, maximum)
    return Verdict(SKIPPED, "\n".join(lines), share, maximum)


# --- the collection tree: folder -> student -> stage -> check -------------------------------------------------


class Submissions(pytest.Directory):
    """A folder of hand-ins, in any layout `autograder grade` takes: one Student per hand-in."""

    def collect(self) -> list[Student]:
        hand_ins = self.config.stash[GRADING].hand_ins[self.path.resolve()]
        return [Student.of(self, submission, submission.notebook or self.path / submission.shown)
                for submission in hand_ins]


class Student(pytest.Collector):
    """One hand-in. Its node id is the student's name; its setup grades the notebook (once per session)."""

    def __init__(self, *, submission: Submission, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.submission = submission
        self.figures: dict[str, StageFigures] = {}

    @classmethod
    def of(cls, parent: pytest.Collector, submission: Submission, path: Path) -> Student:
        return cls.from_parent(parent, name=submission.student, nodeid=submission.student, path=path,
                               submission=submission)

    def collect(self) -> list[Stage]:
        return [Stage.from_parent(self, name=stage.id) for stage in STAGES]

    def setup(self) -> None:
        from autograder.publish.figures import all_figures

        result = self.config.stash[GRADING].result(self.submission)
        self.figures = {figures.stage.id: figures for figures in all_figures(result)}


class Stage(pytest.Collector):
    def collect(self) -> list[Check]:
        return [Check.from_parent(self, name=check) for check in CHECKS]


class CheckFailed(Exception):
    """A check that failed; its message is the whole failure report."""


class Check(pytest.Item):
    """One check of one stage of one student."""

    def runtest(self) -> None:
        student = self.getparent(Student)
        assert student is not None and self.parent is not None
        verdict = check_verdict(self.name, student.figures[self.parent.name])
        self.user_properties += [
            ("student", student.name),
            ("stage", self.parent.name),
            ("check", self.name),
            ("points", verdict.points),
            ("max_points", verdict.max_points),
        ]
        if verdict.outcome == SKIPPED:
            # Reported at the student's notebook (reportinfo), not at this line, as pytest does for skip marks.
            raise pytest.skip.Exception(verdict.text, _use_item_location=True)
        if verdict.outcome == FAILED:
            raise CheckFailed(verdict.text)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, CheckFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, self.nodeid


# --- the session ----------------------------------------------------------------------------------------------


class Grading:
    """What one pytest run shares, registered as a plugin when --grade is given: the options (one seed for the run),
    each student's result once graded, and the items' outcomes for the terminal summary."""

    def __init__(self, config: pytest.Config, paths: list[Path]) -> None:
        self.paths = paths
        self.options = grade_options(config)
        out = config.getoption("grade_out")
        self.out = Path(out) if out else None
        # Each --grade path's hand-ins, found once here, so each student's name is known to be one hand-in's.
        self.hand_ins = distinct_hand_ins(paths, config.getoption("grade_assignment"), self.out)
        self.results: dict[str, StudentResult] = {}  # by student
        # (student, stage) -> check -> (outcome, points, max_points), from the items' reports
        self.outcomes: dict[tuple[str, str], dict[str, tuple[str, float, float]]] = {}

    def result(self, submission: Submission) -> StudentResult:
        """The student's result, graded the first time it is asked for, and written to --grade-out at once."""
        student = submission.student
        if student not in self.results:
            from autograder.batch import file_stem, grade_submission, write_json
            from autograder.records import to_dict
            from autograder.schedule import Placement

            _, result, failure = grade_submission(submission, self.options, Placement(None))
            if result is None:
                raise RuntimeError(f"the grader failed on {student}: {failure}")
            if self.out:
                self.out.mkdir(parents=True, exist_ok=True)
                write_json(self.out / f"{file_stem(student)}.json", to_dict(result))
            self.results[student] = result
        return self.results[student]

    def add_results(self, data: Iterable[Any]) -> None:
        from autograder.records import StudentResult, from_dict

        for item in data:
            result = from_dict(StudentResult, item)
            self.results[result.student] = result

    # Collection: only the --grade paths are hand-ins.

    @pytest.hookimpl(tryfirst=True)
    def pytest_collect_directory(self, path: Path, parent: pytest.Collector) -> pytest.Collector | None:
        return Submissions.from_parent(parent, path=path) if path.is_dir() and path.resolve() in self.hand_ins else None

    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
        if not file_path.is_file() or file_path.resolve() not in self.hand_ins:
            return None
        (submission,) = self.hand_ins[file_path.resolve()]
        return Student.of(parent, submission, file_path)

    # Reporting.

    def pytest_report_header(self, config: pytest.Config) -> str:
        paths = ", ".join(str(path) for path in self.paths)
        return f"autograder: grading {paths} on the {self.options.backend} backend, seed {self.options.seed}"

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        properties = dict(report.user_properties)
        if report.when == "call" and "check" in properties:
            key = (str(properties["student"]), str(properties["stage"]))
            points, maximum = float(properties["points"]), float(properties["max_points"])  # type: ignore[arg-type]
            self.outcomes.setdefault(key, {})[str(properties["check"])] = (report.outcome, points, maximum)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.outcomes:
            return
        from autograder.report import backend_note

        results = sorted(self.results.values(), key=lambda result: result.student)
        terminalreporter.section("grades")
        for line in summary_lines(self.outcomes, {result.student: result.problems for result in results}):
            terminalreporter.write_line(line)
        if results:
            terminalreporter.write_line(backend_note(results[0].device, self.options.backend))
        seed = self.options.seed
        terminalreporter.write_line(f"seed {seed}: --grade-seed {seed} grades with the same inputs again")
        if self.out:
            terminalreporter.write_line(f"results: {self.out}/<student>.json, class table: {self.out}/grades.csv")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if _is_worker(session.config):
            from autograder.records import to_dict

            session.config.workeroutput[RESULTS_KEY] = [to_dict(r) for r in self.results.values()]  # type: ignore[attr-defined]
        elif self.out and self.results:
            from autograder.batch import write_class_table

            self.out.mkdir(parents=True, exist_ok=True)
            write_class_table(sorted(self.results.values(), key=lambda result: result.student), self.out)

    # pytest-xdist: one seed for every worker, a student's items on one worker, the results back to the controller.

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[SEED_KEY] = self.options.seed

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """Schedule students as xdist schedules files (the first part of a node id): grading is per student."""
        if config.getoption("dist") == "each":
            return None
        from xdist.scheduler import LoadFileScheduling

        return LoadFileScheduling(config, log)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        self.add_results(getattr(node, "workeroutput", {}).get(RESULTS_KEY, []))


GRADING = pytest.StashKey[Grading]()


def distinct_hand_ins(
    paths: list[Path], assignment: str | None, out: Path | None
) -> dict[Path, tuple[Submission, ...]]:
    """The hand-ins of each --grade path (by resolved path; a notebook is one hand-in, a folder holds any layout
    `autograder grade` takes), each student's name held by one hand-in only.

    Two paths may give the same name (`a/reduction.ipynb` and `b/reduction.ipynb`, two sections' `alice.ipynb`):
    each such name is given the name of its --grade path's folder first (`a-reduction`), whatever the order of the
    options, so no two hand-ins share a result. Where that is not enough, the run is refused.
    """
    from autograder.batch import Submission, find_submissions
    from autograder.errors import GraderError

    found: dict[Path, tuple[Submission, ...]] = {}
    for path in paths:
        key = path.resolve()
        try:
            found[key] = (tuple(find_submissions(path, assignment, out)) if path.is_dir()
                          else (Submission(path.stem, path, shown=path.name),))
        except GraderError as error:
            raise pytest.UsageError(f"--grade {path}: {error}") from None
    claims: dict[str, list[Path]] = {}
    for key, hand_ins in found.items():
        for submission in hand_ins:
            claims.setdefault(submission.student, []).append(key)
    shared = {student for student, keys in claims.items() if len(keys) > 1}
    renamed = {
        key: tuple(replace(submission, student=f"{key.name if key.is_dir() else key.parent.name}-{submission.student}")
                   if submission.student in shared else submission for submission in hand_ins)
        for key, hand_ins in found.items()
    }
    owners: dict[str, Path] = {}
    for key, hand_ins in renamed.items():
        for submission in hand_ins:
            if submission.student in owners:
                raise pytest.UsageError(f"--grade {owners[submission.student]} and --grade {key} both hold a hand-in "
                                        f"named {submission.student!r}; grade them in separate runs")
            owners[submission.student] = key
    return renamed


def summary_lines(
    outcomes: dict[tuple[str, str], dict[str, tuple[str, float, float]]], problems: dict[str, tuple[str, ...]]
) -> list[str]:
    """One line per student and stage (its points and each check's outcome), then the student's total and the
    problems with their notebook."""
    width = max(len(student) for student, _ in outcomes)
    lines = []
    for student in sorted({student for student, _ in outcomes}):
        total = maximum = 0.0
        every_item = True
        for stage_id in STAGE_IDS:
            checks = outcomes.get((student, stage_id), {})
            every_item = every_item and len(checks) == len(CHECKS)
            if not checks:
                continue
            points = sum(points for _, points, _ in checks.values())
            stage_max = sum(stage_max for _, _, stage_max in checks.values())
            total, maximum = total + points, maximum + stage_max
            words = ", ".join(f"{check} {checks[check][0]}" for check in CHECKS if check in checks)
            lines.append(f"{student:<{width}}  {stage_id:<16} {points:>5g} / {stage_max:<5g} {words}")
        note = "" if every_item else "(the items run only)"
        lines.append(f"{student:<{width}}  {'total':<16} {total:>5g} / {maximum:<5g} {note}".rstrip())
        lines += [f"{student:<{width}}  problem: {problem}" for problem in problems.get(student, ())]
    return lines
