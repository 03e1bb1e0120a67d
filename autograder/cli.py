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


# Exit statuses: 0 graded (whatever the grades), 1 a usage or configuration error, 2 the grader itself failed.
EXIT_GRADER_FAILED = 2


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
    report.print_student(result)
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


def main() -> None:
    cli(prog_name="autograder")


if __name__ == "__main__":
    main()
