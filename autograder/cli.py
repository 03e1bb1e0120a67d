"""The command line: one command per verb, each passing its options to the function that does the work."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from autograder import calibration, report, wire
from autograder import gradebook as gradebooks
from autograder.batch import ClassOptions, check_assignment, grade_class, write_json
from autograder.errors import GraderError
from autograder.grade import NOT_STARTED, GradeOptions, grade_notebook
from autograder.isolation import Worker
from autograder.records import to_dict
from autograder.rubric import load_rubric
from autograder.sandbox import Sandbox

BACKENDS = click.Choice(["auto", "gpu", "cpu"])


@click.group()
@click.version_option(package_name="autograder")
def cli() -> None:
    """Grade the CUDA parallel-reduction assignment."""


# Exit statuses: 0 graded (whatever the grades), 1 a configuration error (a bad rubric; an unreadable gradebook),
# 2 a usage error (click), 3 the grader itself failed on a hand-in.
EXIT_CONFIGURATION = 1
EXIT_GRADER_FAILED = 3


def _options(
    backend: str, rubric: Path | None, seed: int | None, quick: bool, speed: bool, sandbox: bool
) -> GradeOptions:
    try:
        options = GradeOptions(
            backend=backend, rubric=load_rubric(rubric), seed=seed, quick=quick, measure_speed=speed, sandbox=sandbox
        )
        Sandbox(sandbox).require()
    except GraderError as error:
        raise click.ClickException(str(error)) from None
    return options


_grading_options = [
    click.option(
        "--backend",
        type=BACKENDS,
        default="auto",
        show_default=True,
        help="gpu (PyCUDA), cpu (the CPU backend), or auto: the GPU when there is one.",
    ),
    click.option(
        "--rubric",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="A rubric TOML file (default: the one shipped in autograder/rubric.toml).",
    ),
    click.option("--seed", type=int, help="Reproduce a run: the seed recorded in its results."),
    click.option("--quick", is_flag=True, help="Skip the largest correctness cases."),
    click.option("--speed/--no-speed", default=True, show_default=True, help="Time correct stages on a GPU."),
    click.option(
        "--sandbox/--no-sandbox",
        default=True,
        show_default=True,
        help="Compile and run student code in the sandbox (bubblewrap + seccomp). --no-sandbox: trusted code only.",
    ),
]


def _writable_folder(context: click.Context, parameter: click.Parameter, folder: Path | None) -> Path | None:
    """An --out folder that is there or can be made, and can be written: checked before any work, so that a bad
    one is a usage error at once, not a traceback after grading a class."""
    if folder is None:
        return None
    existing = folder
    while not existing.exists() and not existing.is_symlink():  # ends at "." or "/" at the latest
        existing = existing.parent
    if not existing.is_dir():
        raise click.BadParameter(f"{existing} is not a folder, so {folder} cannot be made", context, parameter)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{existing} cannot be written (read-only, or no permission)", context, parameter)
    return folder


def _assignment_name(context: click.Context, parameter: click.Parameter, assignment: str | None) -> str | None:
    try:
        return None if assignment is None else check_assignment(assignment)
    except GraderError as error:
        raise click.BadParameter(str(error), context, parameter) from None


def grading_options(function):
    for option in reversed(_grading_options):
        function = option(function)
    return function


@cli.command()
@click.argument("submissions", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("results"),
    show_default=True,
    callback=_writable_folder,
    help="Folder for <student>.json results and grades.csv.",
)
@click.option("--assignment", callback=_assignment_name,
              help="The folder in each student's folder that holds the hand-in, in nbgrader's layout (reduction).")
@click.option(
    "--workers", type=click.IntRange(min=1), default=1, show_default=True,
    help="Students graded at once on this machine; more than 1 starts a local Dask cluster.",
)
@click.option("--scheduler", metavar="ADDRESS", help="Grade on an existing Dask cluster, e.g. tcp://host:8786.")
@click.option("--gpus", metavar="all|0,1,...", help="Spread students over these GPUs (each timed on one).")
@click.option("--resume", is_flag=True, help="Keep results whose notebook, rubric, seed and grader are unchanged.")
@click.option(
    "--fresh-workers", is_flag=True,
    help="Start every student's GPU workers afresh, instead of keeping them for the next student where that is safe.",
)
@click.option(
    "--gradebook",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="With --assignment: nbgrader's gradebook to compare with (default: gradebook.db beside SUBMISSIONS).",
)
@grading_options
def grade(
    submissions: Path,
    out: Path,
    assignment: str | None,
    workers: int,
    scheduler: str | None,
    gpus: str | None,
    resume: bool,
    fresh_workers: bool,
    gradebook: Path | None,
    backend: str,
    rubric: Path | None,
    seed: int | None,
    quick: bool,
    speed: bool,
    sandbox: bool,
) -> None:
    """Grade every hand-in under SUBMISSIONS (nbgrader's layout or <student>.ipynb files)."""
    options = _options(backend, rubric, seed, quick, speed, sandbox)
    spread = ClassOptions(
        workers=workers, scheduler=scheduler, gpus=_gpu_list(gpus), resume=resume, share_workers=not fresh_workers
    )
    console = Console(stderr=True)
    where = f"Dask at {scheduler}" if scheduler else f"{workers} worker(s)"
    console.print(f"grading {submissions} on the {backend} backend with {where}")
    started = time.monotonic()
    with _progress(console) as on_student:
        run = grade_class(submissions, out, options, assignment, on_student=on_student, spread=spread)
    elapsed = time.monotonic() - started
    output = Console(soft_wrap=True)  # long lines stay whole in a log, where grep finds them
    if len(run.results) <= report.CLASS_TABLE_LIMIT:
        output.print(report.class_table(run.results))
    output.print(report.class_summary(run.results, run.failures, run.skipped))
    graded = [result for result in run.results if result.device.name != NOT_STARTED]
    if graded:
        output.print(report.backend_note(graded[0].device, backend))
    if run.results:
        output.print(f"seed {run.results[0].seed}; " + report.phase_summary(run.results, elapsed))
    if run.lost_workers:
        output.print(f"{run.lost_workers} worker process(es) were lost on the way; their students were graded again")
    output.print(f"results: {out}/<student>.json, class table: {out}/grades.csv")
    gradebook = gradebook or gradebooks.course_gradebook(submissions)
    compared = True
    if assignment and gradebook.is_file():
        try:
            output.print(gradebooks.report(run.results, gradebook, assignment), markup=False, highlight=False)
        except GraderError as error:
            console.print(f"error: {error}", markup=False, highlight=False, soft_wrap=True)
            compared = False
    if run.failures:
        sys.exit(EXIT_GRADER_FAILED)
    if not compared:
        sys.exit(EXIT_CONFIGURATION)


@contextmanager
def _progress(console: Console) -> Iterator[Callable[[str, int, int], None]]:
    """A progress bar with rate and time left on a terminal; in a log, a line per student."""
    if not console.is_terminal:
        started = time.monotonic()

        def log(student: str, done: int, total: int) -> None:
            rate = done / max(time.monotonic() - started, 1e-9) * 60
            left = (total - done) / rate * 60 if rate else 0.0
            line = f"[{done}/{total}] {wire.printable(student)} ({rate:.1f} a minute, {left:.0f} s left)"
            console.print(line, markup=False, highlight=False)

        yield log
        return
    columns = (
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("students", total=None, rate="")

        def update(student: str, done: int, total: int) -> None:
            elapsed = progress.tasks[task].elapsed or 0.0
            rate = f"{done / elapsed * 60:.1f}/min" if elapsed > 0 else ""
            progress.update(task, total=total, completed=done, description=report.escape(student), rate=rate)

        yield update


def _gpu_list(gpus: str | None) -> tuple[int, ...]:
    if not gpus:
        return ()
    if gpus == "all":
        found = sorted(int(node.name[6:]) for node in Path("/dev").glob("nvidia[0-9]*") if node.name[6:].isdigit())
        if not found:
            raise click.BadParameter("no NVIDIA GPU here", param_hint="--gpus")
        return tuple(found)
    try:
        return tuple(int(part) for part in gpus.split(","))
    except ValueError:
        raise click.BadParameter(f"{gpus!r}: give `all` or GPU numbers such as 0,1", param_hint="--gpus") from None


@cli.command()
@click.argument("notebook", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--student", help="The name to record (default: the notebook's file name).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), help="Also write the result here.")
@grading_options
def check(
    notebook: Path,
    student: str | None,
    json_out: Path | None,
    backend: str,
    rubric: Path | None,
    seed: int | None,
    quick: bool,
    speed: bool,
    sandbox: bool,
) -> None:
    """Grade one NOTEBOOK and show its stage table."""
    options = _options(backend, rubric, seed, quick, speed, sandbox)
    result = grade_notebook(notebook, student or notebook.stem, options)
    report.print_student(result, asked=backend)
    if json_out:
        write_json(json_out, to_dict(result))


@cli.command()
@click.option(
    "--rubric",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Take block size and timing sizes from this rubric.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write (default: autograder/calibrations/<gpu>.json).",
)
@click.option("--seed", type=int, default=0, show_default=True)
def calibrate(rubric: Path | None, out: Path | None, seed: int) -> None:
    """Time the reference kernels on this GPU and write its calibration."""
    settings = _options("gpu", rubric, seed, False, True).rubric.timing
    try:
        with Worker("gpu", sandbox=Sandbox(False)) as worker:  # only the reference kernels run here
            measured = worker.call(calibration.measure, settings, seed, timeout=3600)
    except GraderError as error:
        raise click.ClickException(str(error)) from None
    path = out or calibration.calibration_path(measured.gpu, calibration.SHIPPED_DIR)
    calibration.write_calibration(measured, path)
    click.echo(calibration.describe(measured))
    click.echo(f"written to {path}")


# Publishing: leaderboard, feedback and exports. Each command only parses its options; the work is in
# autograder/publish/.

_results_argument = click.argument("results", type=click.Path(exists=True, path_type=Path))
_salt_options = [
    click.option("--salt", help="Secret salt of the pseudonyms (default: kept in RESULTS/pseudonym-salt.txt)."),
    click.option("--salt-file", type=click.Path(dir_okay=False, path_type=Path), help="Read the salt from this file."),
]


def _salted(function: click.decorators.FC) -> click.decorators.FC:
    for option in reversed(_salt_options):
        function = option(function)
    return function


def _publish(module: str, results_path: Path, **options: object) -> None:
    """Run the main of autograder.publish.<module>, list what it wrote, and turn expected failures into a clean
    exit. Imported here, so that grading never pays for pandas and matplotlib."""
    import importlib

    from autograder.publish.results import left_out

    try:
        written = importlib.import_module(f"autograder.publish.{module}").main(results_path=results_path, **options)
        stale = left_out(results_path)
    except GraderError as error:
        raise click.ClickException(str(error)) from None
    for path in written:
        click.echo(str(path))
    if stale:
        shown = ", ".join(stale[:5]) + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
        click.echo(f"left out {len(stale)} result file(s) that the latest grading run did not write (students no "
                   f"longer in the submissions folder?): {shown}", err=True)


@cli.command()
@_results_argument
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), callback=_writable_folder,
              help="Folder for leaderboard.{csv,md,html} and leaderboard-open.csv (default: RESULTS/leaderboard).")
@click.option("--pseudonyms/--real-names", default=True, show_default=True,
              help="Publish stable pseudonyms instead of student ids.")
@_salted
@click.option("--calibration", "calibrations", multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Calibration file(s) with the CUB figure (default: each GPU's calibration).")
@click.option("--cub-gbps", type=float, help="CUB's (cupy.sum) GB/s on the grading GPU, above the calibration's.")
@click.option("--peak-gbps", type=float, help="The GPU's peak memory bandwidth in GB/s (H200: 4800 built in).")
@click.option("--top", type=int, default=10, show_default=True, help="Entries in the bandwidth chart.")
@click.option("--title", default="Parallel reduction: class leaderboard", show_default=True)
def leaderboard(results: Path, out: Path | None, pseudonyms: bool, salt: str | None, salt_file: Path | None,
                calibrations: tuple[Path, ...], cub_gbps: float | None, peak_gbps: float | None, top: int,
                title: str) -> None:
    """Build the class leaderboard from the RESULTS folder of `autograder grade`."""
    _publish("leaderboard", results_path=results, out=out, use_pseudonyms=pseudonyms, salt=salt, salt_file=salt_file,
             calibrations=calibrations, cub_gbps=cub_gbps, peak_gbps=peak_gbps, top=top, title=title)


@cli.command()
@_results_argument
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), callback=_writable_folder,
              help="Folder for <student>.md and <student>.html (default: RESULTS/feedback).")
@click.option("--student", "students", multiple=True, help="Only this student (repeatable).")
@_salted
def feedback(results: Path, out: Path | None, students: tuple[str, ...], salt: str | None,
             salt_file: Path | None) -> None:
    """Write a feedback page per student, in Markdown and HTML."""
    _publish("feedback", results_path=results, out=out, students=students, salt=salt, salt_file=salt_file)


@cli.command()
@_results_argument
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), callback=_writable_folder,
              help="Folder for gradescope/<student>/results.json and gradebook.csv (default: RESULTS/exports).")
@click.option("--gradescope/--no-gradescope", default=True, show_default=True, help="Gradescope results.json files.")
@click.option("--gradebook/--no-gradebook", default=True, show_default=True, help="The LMS gradebook CSV.")
@click.option("--visibility", type=click.Choice(["visible", "after_due_date", "after_published", "hidden"]),
              default="visible", show_default=True, help="Gradescope visibility of the tests.")
def export(results: Path, out: Path | None, gradescope: bool, gradebook: bool, visibility: str) -> None:
    """Export the RESULTS for Gradescope and for an LMS gradebook."""
    _publish("exports", results_path=results, out=out, gradescope=gradescope, lms=gradebook,
             visibility=visibility)


def main() -> None:
    cli(prog_name="autograder")


if __name__ == "__main__":
    main()
