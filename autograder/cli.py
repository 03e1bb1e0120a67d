"""The command line: one command per verb, each passing its options to the function that does the work."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.progress import Progress, TextColumn

from autograder import calibration, report
from autograder.batch import grade_class, write_json
from autograder.errors import GraderError
from autograder.grade import GradeOptions, grade_notebook
from autograder.isolation import Worker
from autograder.records import to_dict
from autograder.rubric import load_rubric

BACKENDS = click.Choice(["auto", "gpu", "cpu"])


@click.group()
@click.version_option(package_name="autograder")
def cli() -> None:
    """Grade the CUDA parallel-reduction assignment."""


# Exit statuses: 0 graded (whatever the grades), 1 a configuration error, 2 a usage error (click), 3 the grader
# itself failed on a hand-in.
EXIT_GRADER_FAILED = 3


def _options(backend: str, rubric: Path | None, seed: int | None, quick: bool, speed: bool) -> GradeOptions:
    try:
        return GradeOptions(backend=backend, rubric=load_rubric(rubric), seed=seed, quick=quick, measure_speed=speed)
    except GraderError as error:
        raise click.ClickException(str(error)) from None


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
]


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
    help="Folder for <student>.json results and grades.csv.",
)
@click.option("--assignment", help="The assignment folder to take in nbgrader's layout (e.g. reduction).")
@grading_options
def grade(
    submissions: Path,
    out: Path,
    assignment: str | None,
    backend: str,
    rubric: Path | None,
    seed: int | None,
    quick: bool,
    speed: bool,
) -> None:
    """Grade every hand-in under SUBMISSIONS (nbgrader's layout or <student>.ipynb files)."""
    options = _options(backend, rubric, seed, quick, speed).with_seed()
    console = Console(stderr=True)
    console.print(f"grading {submissions} on the {backend} backend, seed {options.seed}")
    with Progress(
        *Progress.get_default_columns(), TextColumn("{task.fields[stage]}"), console=console, transient=True
    ) as progress:
        task = progress.add_task("students", total=None, stage="")

        def on_student(student: str, index: int, total: int) -> None:
            progress.update(task, total=total, completed=index, description=student)

        def on_stage(stage_id: str) -> None:
            progress.update(task, stage=stage_id)

        run = grade_class(submissions, out, options, assignment, on_student=on_student, on_stage=on_stage)
    output = Console()
    output.print(report.class_table(run.results))
    output.print(report.class_summary(run.results, run.failures))
    if run.results:
        output.print(report.backend_note(run.results[0].device, backend))
    output.print(f"results: {out}/<student>.json, class table: {out}/grades.csv")
    if run.failures:
        sys.exit(EXIT_GRADER_FAILED)


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
) -> None:
    """Grade one NOTEBOOK and show its stage table."""
    options = _options(backend, rubric, seed, quick, speed)
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
        with Worker("gpu") as worker:
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


def _publish(module: str, **options: object) -> None:
    """Run the main of autograder.publish.<module>, list what it wrote, and turn expected failures into a clean
    exit. Imported here, so that grading never pays for pandas and matplotlib."""
    import importlib

    try:
        written = importlib.import_module(f"autograder.publish.{module}").main(**options)
    except GraderError as error:
        raise click.ClickException(str(error)) from None
    for path in written:
        click.echo(str(path))


@cli.command()
@_results_argument
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
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
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for <student>.md and <student>.html (default: RESULTS/feedback).")
@click.option("--student", "students", multiple=True, help="Only this student (repeatable).")
@_salted
def feedback(results: Path, out: Path | None, students: tuple[str, ...], salt: str | None,
             salt_file: Path | None) -> None:
    """Write a feedback page per student, in Markdown and HTML."""
    _publish("feedback", results_path=results, out=out, students=students, salt=salt, salt_file=salt_file)


@cli.command()
@_results_argument
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
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
