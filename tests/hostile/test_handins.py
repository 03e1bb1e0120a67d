"""Hostile hand-ins in the submissions folder: links out of it, names that collide or are not Latin, notebooks that
are not JSON or hold a lone surrogate. Each test fails if the attack works: a secret outside the tree shows up in
any output, a result is lost or overwritten, a student stops the class, or a result carries a host path.

The class is built at test time (links cannot be stored as data) and graded once by `autograder grade` on the CPU
backend; the publishing commands then run on its results.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest
from click.testing import CliRunner

from autograder.batch import discover, file_stem
from autograder.cli import cli
from autograder.grade import GradeOptions, grade_notebook
from autograder.notebook import MAX_CELL_CHARS, MAX_NOTEBOOK_BYTES, kernel_cell, stage_cells
from autograder.pipeline.check import TOO_SLOW
from autograder.records import Status, to_dict
from autograder.references import reference_source

SECRET = "TOP-SECRET-7f3a9c"  # in every file outside the submissions tree; must appear in no output
ROOT = Path(__file__).resolve().parents[2]


def write_notebook(path: Path, *cells: nbformat.NotebookNode) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nbformat.v4.new_notebook(cells=list(cells)), path)
    return path


def naive_cell(kernel: str | None = None) -> nbformat.NotebookNode:
    return kernel_cell("naive", kernel or reference_source("naive").text)


def graded_with_naive(folder: Path, naive: str, options: GradeOptions) -> dict:
    """The stages of a notebook whose naive stage is `naive` and whose anti_divergence is the reference: each
    stage's result by its name."""
    notebook = write_notebook(folder / "handed_in.ipynb", naive_cell(naive),
                              kernel_cell("anti_divergence", reference_source("anti_divergence").text))
    return {stage.stage: stage for stage in grade_notebook(notebook, "student", options).stages}


@pytest.fixture(scope="module")
def hostile_class(tmp_path_factory: pytest.TempPathFactory) -> Path:
    top = tmp_path_factory.mktemp("course")
    outside = top / "outside"
    outside.mkdir()
    (outside / "passwd").write_text(f"root:x:0:0:{SECRET}:/root:/bin/bash\n")
    # A notebook outside the tree: someone else's correct work, with the secret in a cell.
    stolen = write_notebook(outside / "stolen.ipynb", nbformat.v4.new_markdown_cell(SECRET), naive_cell())
    write_notebook(outside / "folder" / "reduction.ipynb", nbformat.v4.new_markdown_cell(SECRET), naive_cell())

    submissions = top / "submissions"
    submissions.mkdir()
    os.symlink(outside / "passwd", submissions / "eve.ipynb")  # a linked notebook
    os.symlink(outside / "folder", submissions / "mallory")  # a linked student folder
    (submissions / "trudy" / "reduction").mkdir(parents=True)
    os.symlink(stolen, submissions / "trudy" / "reduction" / "reduction.ipynb")  # a link inside a student folder
    (submissions / "oscar.ipynb").write_text((outside / "passwd").read_text())  # not JSON, quoting the secret
    write_notebook(submissions / "a b.ipynb")
    write_notebook(submissions / "a_b.ipynb")
    write_notebook(submissions / "王伟.ipynb")
    write_notebook(submissions / "Łukasz.ipynb")
    write_notebook(submissions / "grader-failures.ipynb")  # the name of the grader's own file
    # A lone surrogate in the kernel cell, then a student graded after it.
    sybil = nbformat.v4.new_notebook(cells=[naive_cell()])
    sybil.cells[0].source = sybil.cells[0].source.replace("extern", "\ud800extern")
    (submissions / "sybil.ipynb").write_text(json.dumps(sybil))
    write_notebook(submissions / "zoe.ipynb", naive_cell())
    (submissions / ".hidden").mkdir()
    (submissions / "notes.txt").write_text("not a hand-in\n")
    return submissions


@pytest.fixture(scope="module")
def graded(hostile_class: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("results")
    args = ["grade", str(hostile_class), "--out", str(out), "--backend", "cpu", "--quick", "--seed", "5"]
    return CliRunner().invoke(cli, args), out


def results_of(out: Path) -> dict[str, dict]:
    return {data["student"]: data for data in (json.loads(p.read_text()) for p in out.glob("*.json"))}


def every_output(out: Path) -> str:
    return "\n".join(path.read_text(encoding="utf-8") for path in sorted(out.rglob("*")) if path.is_file())


def test_links_are_refused_unread_and_listed(hostile_class: Path) -> None:
    found = discover(hostile_class)
    skipped = dict(found.skipped)
    for link in ("eve.ipynb", "mallory", "trudy/reduction/reduction.ipynb"):
        assert "symbolic link" in skipped[link], skipped
    assert ".hidden" in skipped and "notes.txt" in skipped
    students = {s.student: s for s in found.submissions}
    assert "eve" not in students and "mallory" not in students
    assert students["trudy"].notebook is None and "trudy/reduction/reduction.ipynb refused" in students["trudy"].problem


def test_the_class_is_graded_without_a_grader_failure_and_the_summary_lists_what_was_skipped(graded) -> None:
    output, out = graded
    assert output.exit_code == 0, output.output
    assert "grader failure" not in output.output
    for listed in ("eve.ipynb: a symbolic link", "mallory: a symbolic link", "trudy/reduction/reduction.ipynb",
                   ".hidden: a hidden entry", "notes.txt: neither a notebook"):
        assert listed in output.output


def test_no_secret_from_outside_the_tree_reaches_any_output(graded) -> None:
    output, out = graded
    assert SECRET not in output.output
    assert SECRET not in every_output(out)
    oscar = results_of(out)["oscar"]
    assert oscar["problems"] == ["oscar.ipynb: not a readable notebook (not JSON)"]


def test_names_that_sanitise_alike_or_are_not_latin_keep_their_own_results(graded) -> None:
    _, out = graded
    results = results_of(out)
    for student in ("a b", "a_b", "王伟", "Łukasz", "grader-failures"):
        assert student in results
        assert (out / f"{file_stem(student)}.json").exists()
    stems = {file_stem(student) for student in ("a b", "a_b", "王伟", "Łukasz", "grader-failures")}
    assert len(stems) == 5 and "student" not in stems and "a_b" in stems
    assert not (out / "grader-failures.json").exists()  # no grader failure, and no student's file says one


def test_a_lone_surrogate_is_that_student_s_verdict_and_grading_goes_on(graded) -> None:
    _, out = graded
    results = results_of(out)
    sybil = next(stage for stage in results["sybil"]["stages"] if stage["stage"] == "naive")
    assert sybil["status"] == "invalid_cell" and "lone surrogate" in sybil["message"]
    zoe = next(stage for stage in results["zoe"]["stages"] if stage["stage"] == "naive")
    assert zoe["status"] == "correct"


def test_results_and_feedback_carry_no_host_paths(graded) -> None:
    _, out = graded
    results = results_of(out)
    assert results["zoe"]["notebook"] == "zoe.ipynb"
    assert results["trudy"]["notebook"] == "trudy/"
    assert results["zoe"]["rubric"].startswith("rubric.toml@") and len(results["zoe"]["rubric"]) == 20
    runner = CliRunner()
    for command in ("feedback", "export"):
        outcome = runner.invoke(cli, [command, str(out)])
        assert outcome.exit_code == 0, outcome.output
    written = every_output(out)
    for host_path in (str(out.parent.parent), str(ROOT), os.path.expanduser("~")):
        assert host_path not in written


NOTEBOOK = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}}


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (f"root:x:0:0:{SECRET}:/root:/bin/bash\n".encode(), "not JSON"),
        (b"\xff\xfe" + SECRET.encode(), "not UTF-8 text"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (json.dumps({**NOTEBOOK, "cells": {SECRET: 1}}).encode(), "not in the notebook format"),
        (json.dumps({**NOTEBOOK, "cells": [{"cell_type": "code", "metadata": [SECRET], "source": ""}]}).encode(),
         "not in the notebook format"),
        (json.dumps({"nbformat": 3, "nbformat_minor": 0, "metadata": {"name": SECRET}, "worksheets": []}).encode(),
         "not a notebook of format 4"),
        (b" " * (MAX_NOTEBOOK_BYTES + 1), "larger than 32 MiB"),
        (json.dumps([SECRET, NOTEBOOK]).encode(), "its JSON is not an object"),
        (b"20261124", "its JSON is not an object"),
        (json.dumps({**NOTEBOOK, "cells": [7, SECRET]}).encode(), "open it in Jupyter and save it again"),
    ],
    ids=["passwd", "binary", "deep-nesting", "cells-not-a-list", "metadata-not-a-dict", "format-3", "huge",
         "a-list", "a-number", "cells-not-objects"],
)
def test_an_unreadable_notebook_is_its_student_s_verdict_and_quotes_nothing(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    path = tmp_path / "oscar.ipynb"
    path.write_bytes(content)
    result = grade_notebook(path, "oscar", GradeOptions(backend="cpu"))
    assert {stage.status for stage in result.stages} == {Status.INVALID_CELL}
    assert reason in result.problems[0]
    assert "Error" not in result.problems[0]  # words a student can act on, not the grader's exception
    assert SECRET not in json.dumps(to_dict(result))


def test_cells_of_odd_shapes_are_that_stage_s_problem(tmp_path: Path) -> None:
    def cell(grade_id: object, source: str, cell_type: object = "code") -> dict:
        return {"cell_type": cell_type, "metadata": {"nbgrader": {"grade_id": grade_id}}, "source": source,
                "outputs": [], "execution_count": None}

    cells = [
        cell("naive", "X = " + "-" * 100_000 + "1"),  # nesting too deep for Python's parser
        cell("anti_divergence", "X = 'a\0'"),
        cell("sequential", 'X = r"""' + "x" * MAX_CELL_CHARS + '"""'),
        cell("first_add", "X = 1", cell_type=7),
        cell(["unrolled_warp"], "X = 1"),  # a grade_id that is not text: no stage's cell
        cell("shuffle", "X = '\\ud800 lone'"),  # the escape of a lone surrogate, in a plain string
    ]
    path = tmp_path / "odd.ipynb"
    path.write_text(json.dumps({**NOTEBOOK, "cells": cells}))
    found = stage_cells(path)
    assert "cannot be read as Python" in found["naive"].problem
    assert "null bytes" in found["anti_divergence"].problem
    assert "characters, more than" in found["sequential"].problem
    assert "not a code cell" in found["first_add"].problem
    assert not found["unrolled_warp"].attempted
    assert "lone surrogate" in found["shuffle"].problem


PRINTS = """
__global__ void reduce_naive(const float *g_in, float *g_out, unsigned int n)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) printf("PRINTED-BY-%s\\n", "NAIVE");
    if (threadIdx.x == 0) g_out[blockIdx.x] = 0.0f;
}
"""
# Crashes its worker after printing what a terminal would act on, a title, a colour, a line rewritten, often
# enough to pass any output buffer.
CRASHES = """
__global__ void reduce_anti_divergence(const float *g_in, float *g_out, unsigned int n)
{
    for (int i = 0; i < 400 && threadIdx.x == 0 && blockIdx.x == 0; i++)
        printf("%c]0;OWNED%c%c[31mFAKE: all correct%c\\n", 27, 7, 27, 13);
    __trap();
}
"""


def test_a_crash_message_quotes_only_its_own_kernel_s_output_and_no_terminal_codes(tmp_path: Path) -> None:
    """What a kernel printed reaches a crash message only for its own call: never another stage's output, nor,
    through the class memo, another student's; and a terminal shows it without acting on it."""
    submissions = tmp_path / "submissions"
    write_notebook(submissions / "a_printer.ipynb", naive_cell(PRINTS), kernel_cell("anti_divergence", CRASHES))
    write_notebook(submissions / "b_same_crash.ipynb", kernel_cell("anti_divergence", CRASHES))
    outcome = CliRunner().invoke(cli, ["grade", str(submissions), "--out", str(tmp_path / "out"), "--backend", "cpu",
                                       "--quick"])
    assert outcome.exit_code == 0, outcome.output
    for student in ("a_printer", "b_same_crash"):
        result = json.loads((tmp_path / "out" / f"{student}.json").read_text())
        crash = next(stage for stage in result["stages"] if stage["stage"] == "anti_divergence")
        assert crash["status"] == "crashed"
        assert "PRINTED-BY-NAIVE" not in crash["message"]
        assert "FAKE: all correct" in crash["message"] and "\x1b" not in crash["message"]
    one = CliRunner().invoke(cli, ["check", str(submissions / "a_printer.ipynb"), "--backend", "cpu", "--quick"])
    assert "FAKE: all correct" in one.output and not any(code in one.output for code in "\x1b\x07\r")


def test_a_kernel_too_large_to_load_is_its_stage_s_crash_with_no_host_path(tmp_path: Path) -> None:
    # 64 GiB of __device__ data: the worker's loader cannot map it. The kernel's verdict, not the grader's failure.
    text = reference_source("naive").text.replace("__global__", "__device__ float big[1ull << 34];\n__global__", 1)
    text = text.replace("g_out[blockIdx.x] = sdata[0];", "g_out[blockIdx.x] = sdata[0] + big[blockIdx.x];")
    notebook = write_notebook(tmp_path / "large.ipynb", naive_cell(text))
    options = GradeOptions(backend="cpu", seed=3, quick=True, measure_speed=False)
    [naive] = [stage for stage in grade_notebook(notebook, "large", options).stages if stage.stage == "naive"]
    assert naive.status is Status.CRASHED
    assert "the kernel could not be loaded (" in naive.message
    assert "/tmp" not in naive.message and "internal error" not in naive.message


def test_a_kernel_slowed_just_inside_each_case_s_limit_runs_out_the_stage_s_time(tmp_path: Path) -> None:
    # Each case well inside its own limit, the stage's cases together past theirs: the stage is timeout, and
    # grading goes on to the next stage, instead of a grading process held for 40 cases.
    spin = "if (threadIdx.x == 0 && blockIdx.x == 0) { for (volatile unsigned long long k = 0; k < 200000000ull; " \
           "k = k + 1) {} }\n    "
    text = reference_source("naive").text.replace("sdata[tid] = (i < n)", spin + "sdata[tid] = (i < n)", 1)
    options = GradeOptions(backend="cpu", seed=3, quick=True, measure_speed=False, stage_seconds=3.0)
    stages = graded_with_naive(tmp_path, text, options)
    naive = stages["naive"]
    assert naive.status is Status.TIMEOUT
    assert "runs ran past the 3 s they may take together" in naive.message and naive.hint == TOO_SLOW
    assert stages["anti_divergence"].status is Status.CORRECT


def test_a_kernel_that_spins_for_ever_at_one_size_only_is_a_timeout_at_its_first_limit(tmp_path: Path) -> None:
    # Correct at every size but one, where one thread spins for ever: on the CPU backend it keeps its worker busy,
    # which a stall of the machine cannot, so its first limit is the verdict, with no second try (which would
    # make it cost the grader three limits a stage), and the next stage is graded.
    spin = "if (n == 1000u && threadIdx.x == 0) { for (volatile int k = 0; k >= 0; k = k | 1) {} }\n    "
    text = reference_source("naive").text.replace("sdata[tid] = (i < n)", spin + "sdata[tid] = (i < n)", 1)
    options = GradeOptions(backend="cpu", seed=3, quick=True, measure_speed=False, case_seconds=2.0)
    stages = graded_with_naive(tmp_path, text, options)
    naive = stages["naive"]
    assert naive.status is Status.TIMEOUT, naive.message
    assert "n=1000" in naive.message and "ran past its 2.005 s limit" in naive.message, naive.message
    assert "second try" not in naive.message
    assert stages["anti_divergence"].status is Status.CORRECT


def test_a_kernel_whose_names_spell_out_to_hundreds_of_megabytes_is_its_stage_s_compile_error(tmp_path: Path) -> None:
    # Templates nested twelve deep: a library of kilobytes whose names, spelled out, run to hundreds of megabytes
    # (debug information, the symbols nm lists). Whichever file limit it meets first, compiling or checking the
    # build, the stage does not compile; it is never the grader's failure, and the next stage is graded.
    nest = "template <class... T> struct Nest {};\ntypedef Nest<int, int, int, int> L1;\n" + "".join(
        f"typedef Nest<L{k}, L{k}, L{k}, L{k}> L{k + 1};\n" for k in range(1, 12)
    ) + "template <class T> __device__ float pass(float x) { return x; }\n"
    text = nest + reference_source("naive").text.replace(
        "g_out[blockIdx.x] = sdata[0];", "g_out[blockIdx.x] = pass<L12>(sdata[0]);"
    )
    stages = graded_with_naive(tmp_path, text, GradeOptions(backend="cpu", seed=3, quick=True, measure_speed=False))
    assert stages["naive"].status is Status.COMPILE_ERROR, stages["naive"].message
    assert stages["anti_divergence"].status is Status.CORRECT
