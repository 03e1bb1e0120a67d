"""A GPU worker kept from one student to the next (autograder.executors): nothing a student's kernels do can
change a later student's verdict. Each attack is handed in by a student graded just before a clean one, in the
same process, so the clean student's kernels run in whatever the attacker's left behind; its grades must be
those it gets alone, in fresh workers."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import nbformat
import pytest
from expectations import unsampled_blocks

from autograder import executors
from autograder.batch import grade_class
from autograder.errors import GraderError, KernelFault
from autograder.grade import GradeOptions, _student_run, grade_notebook, worker_options
from autograder.isolation import worker_kind
from autograder.notebook import kernel_cell, stage_cells
from autograder.pipeline.student import _contained, grade_student
from autograder.records import KernelSource, Status
from autograder.references import reference_source
from autograder.sandbox import Sandbox
from autograder.stages import STAGE_IDS, get_stage
from autograder.verify import loaded

ROOT = Path(__file__).resolve().parents[2]
KNOWN = ROOT / "tests" / "known"
OPTIONS = GradeOptions(backend="gpu", seed=20261124, quick=True, case_seconds=5.0, per_element_seconds=1e-6)


def mutant(stage_id: str, old: str, new: str) -> str:
    text = reference_source(stage_id).text
    assert old in text, f"{old!r} is not in the {stage_id} reference"
    return text.replace(old, new, 1)


CRASHES = (KNOWN / "far_out_of_bounds_write.cu").read_text()  # first_add: an illegal address, SIGSEGV on a CPU
HANGS = (KNOWN / "infinite_loop.cu").read_text()  # naive
WRITES_PAST_OUTPUT = mutant("unrolled_warp", "            g_out[blockIdx.x] = v;\n",
                            "            g_out[blockIdx.x] = v;\n            g_out[blockIdx.x + gridDim.x] = 0.0f;\n")
# {stage: kernel}: each attack on a kept worker, and whether the worker may then serve the next student.
ATTACKS = {
    # Writes its read-only input while reading it: every later call of this context must see fresh inputs.
    "writes_its_input": ({"naive": mutant("naive", "__syncthreads();\n", "__syncthreads();\n"
                                          "    if (i < n) ((float *)g_in)[i] = 7.0f;\n")}, True),
    # State in __device__ memory that outlives its launches: its module must go with its student.
    "keeps_device_state": ({"shuffle": (KNOWN / "cached_across_calls.cu").read_text()}, True),
    # Writes far past its output, into whatever else the context has mapped there.
    "writes_far_past_its_output": ({"first_add": mutant("first_add", "g_out[blockIdx.x] = sdata[0];",
                                                        "g_out[blockIdx.x] = sdata[0]; "
                                                        "g_out[gridDim.x + (blockIdx.x << 16) + tid] = 1e30f;")},
                                   False),
    # An illegal address: a sticky error that ends the context, and the worker's process with it. The process
    # started after it ran none of the attacker's kernels, and serves the next student.
    "sticky_error": ({"first_add": CRASHES}, True),
    # Never ends: stopped at its time limit, with its process. The same.
    "never_ends": ({"naive": HANGS}, True),
    # Reads one past its input, the commonest bug of a class: a read changes no memory, so the worker is kept.
    "reads_past_its_input": ({"sequential": mutant("sequential", "(i < n)", "(i <= n)")}, True),
    # Hides a write out of bounds behind more reads out of bounds than the CPU analysis tells of one launch. The
    # write puts back what it read, so the output guards see nothing: only the analysis can tell it wrote.
    "hides_a_write_behind_stray_reads": ({"first_add": mutant("first_add", "    sdata[tid] = sum;\n", (
        "    if (i == 0) {\n        float total = 0.0f, kept = g_out[gridDim.x + 1];\n"
        + "".join(f"        total += g_in[n + {k}];\n" for k in range(300))
        + "        if (total == -1.0e30f) kept = total;\n        g_out[gridDim.x + 1] = kept;\n    }\n"
        "    sdata[tid] = sum;\n"))}, False),
    # Crashes (an illegal address ends the worker's process), then hands in clean kernels: the process started
    # after the crash ran only those, and serves the next student.
    "crashes_then_hands_in_clean_kernels": (
        {stage_id: CRASHES if stage_id == "first_add" else f"// own\n{reference_source(stage_id).text}"
         for stage_id in STAGE_IDS}, True),
}


def notebook(folder: Path, student: str, kernels: dict[str, str]) -> Path:
    path = folder / f"{student}.ipynb"
    cells = [kernel_cell(stage_id, kernels.get(stage_id, get_stage(stage_id).stub_source())) for stage_id in STAGE_IDS]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    return path


def clean_kernels() -> dict[str, str]:
    """A complete correct hand-in whose kernels no attacker shares (the class memo would share their results)."""
    alice = stage_cells(ROOT / "examples" / "submissions" / "alice.ipynb")
    return {stage_id: f"// clean\n{cell.source.text}" for stage_id, cell in alice.items() if cell.source}


def grades(result) -> str:
    """What a later student's verdict is: statuses, correctness points and findings, cases. Not its timings,
    which vary from run to run."""
    fields = [[s.stage, s.status, s.points.correctness, s.points.penalty, s.points.technique,
               sorted((f.kind, f.line) for f in s.findings), [(c.label, c.passed) for c in s.cases]]
              for s in result.stages]
    return json.dumps(fields, default=str)


@pytest.fixture(autouse=True)
def no_kept_workers():
    executors.close_kept()
    yield
    executors.close_kept()


@pytest.mark.gpu
@pytest.mark.parametrize("attack", ATTACKS)
def test_an_attack_in_a_kept_worker_changes_no_later_students_verdict(attack: str, tmp_path: Path) -> None:
    kernels, keeps = ATTACKS[attack]
    notebook(tmp_path, "a_attacker", kernels)
    clean = notebook(tmp_path, "b_clean", clean_kernels())
    alone = grade_notebook(clean, "b_clean", OPTIONS)  # fresh workers, then closed
    executors.close_kept()
    # The attacker alone, in this process: whether its worker is kept for the next student.
    grade_notebook(tmp_path / "a_attacker.ipynb", "a_attacker", OPTIONS, share=True)
    assert bool(executors._kept.get(worker_kind("gpu", worker_options(OPTIONS), Sandbox(OPTIONS.sandbox), ()))) == keeps
    executors.close_kept()
    # The class: the attacker first, the clean student next, in the same process and workers where kept.
    run = grade_class(tmp_path, tmp_path / "results", OPTIONS)
    assert not run.failures
    shared = next(result for result in run.results if result.student == "b_clean")
    assert grades(shared) == grades(alone)


@pytest.mark.gpu
def test_a_kept_worker_holds_nothing_of_its_last_student(tmp_path: Path) -> None:
    grade_notebook(notebook(tmp_path, "clean", clean_kernels()), "clean", OPTIONS, share=True)
    kept = [worker for workers in executors._kept.values() for worker, _ in workers]
    # The GPU worker and one session per compute-sanitizer tool wait for the next student, holding no kernel.
    assert len(kept) == 4
    for worker in kept:
        assert worker.alive and worker.call(loaded, timeout=60) == 0
        assert worker.log_size() == 0


def clean_after(backend: str, kernels: dict[str, str]) -> tuple[bool, int, dict[str, Status]]:
    """Grade `kernels` (the reference, commented, where a stage has none) as one student, alone: whether the
    pipeline lets its main worker's last process serve the next student, how often that worker was restarted,
    and the statuses."""
    options = replace(OPTIONS, backend=backend)
    sources = {stage_id: KernelSource(kernels.get(stage_id, f"// own\n{reference_source(stage_id).text}"))
               for stage_id in STAGE_IDS}
    results = {}
    with _student_run(options, None, share=False) as run:
        clean = grade_student(run, STAGE_IDS, sources, {}, results)
        restarts = run.worker.restarts
    return clean, restarts, {stage_id: result.status for stage_id, result in results.items()}


BACKENDS = [
    pytest.param("cpu", marks=pytest.mark.skipif(shutil.which("g++") is None, reason="the CPU backend needs g++")),
    pytest.param("gpu", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ending", ["crash", "hang"])
def test_the_process_started_after_a_crash_or_a_hang_serves_the_next_student_where_the_rest_was_clean(
    backend: str, ending: str
) -> None:
    """A crash or a hang ends the process it happens in, and its context. The process started after it ran
    only the student's later kernels: clean, it may serve the next student, as a clean student's would. A hang
    on a GPU ends two: it is confirmed by a second try in a fresh process (Worker.call_each). On the CPU backend
    the spinning kernel kept its worker busy, which a stall of the machine cannot: no second try."""
    stage_id, kernel = ("first_add", CRASHES) if ending == "crash" else ("naive", HANGS)
    clean, restarts, statuses = clean_after(backend, {stage_id: kernel})
    assert statuses[stage_id] is (Status.CRASHED if ending == "crash" else Status.TIMEOUT)
    assert restarts == (2 if (ending, backend) == ("hang", "gpu") else 1) and clean
    assert all(status is Status.CORRECT for stage, status in statuses.items() if stage != stage_id)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_process_a_later_kernel_wrote_out_of_bounds_in_serves_no_one(backend: str) -> None:
    """The process started after a crash is not kept where a later kernel of the student wrote past its output
    in it; nor, with no crash, the one process that ran such a kernel."""
    clean, restarts, statuses = clean_after(backend, {"first_add": CRASHES, "unrolled_warp": WRITES_PAST_OUTPUT})
    assert statuses["first_add"] is Status.CRASHED and statuses["unrolled_warp"] is Status.INCORRECT
    assert restarts == 1 and not clean
    clean, restarts, statuses = clean_after(backend, {"unrolled_warp": WRITES_PAST_OUTPUT})
    assert restarts == 0 and not clean


@pytest.mark.skipif(shutil.which("g++") is None, reason="the CPU backend needs g++")
@pytest.mark.parametrize("error", [GraderError("internal error in run_case"), KernelFault("died"), ValueError("bug")])
def test_a_process_a_stage_s_grading_failed_in_serves_no_one(error: Exception) -> None:
    """A stage whose grading raised, after its kernel may have run, leaves no finding to judge the process by:
    the process it may have run in is not kept, whatever the stage's verdict."""

    def fails() -> None:
        raise error

    with _student_run(replace(OPTIONS, backend="cpu"), None, share=False) as run:
        result = _contained(run, get_stage("sequential"), fails)
        assert result.status in (Status.CRASHED, Status.GRADER_ERROR)
        assert run.failed_in == {run.worker.restarts}
        assert not grade_student(run, [], {}, {}, {})


@pytest.mark.gpu
@pytest.mark.parametrize("ending", ["compile_error_after_its_cases", "wrong_only_when_timed"])
def test_a_process_whose_kernel_s_grading_ended_without_a_finding_serves_no_one(ending: str) -> None:
    """A kernel that wrote past its output and then failed the CPU analysis's compile (an intrinsic only nvcc
    knows), or one that is wrong only at the timed size: the stage's findings do not tell what it did in the
    process it ran in, which is then not kept."""
    if ending == "compile_error_after_its_cases":
        kernel = WRITES_PAST_OUTPUT.replace("g_out[blockIdx.x + gridDim.x] = 0.0f;",
                                            "g_out[blockIdx.x + gridDim.x] = (float)__usad(tid, 1u, 0u);")
    else:
        # Wrong only in blocks that the timing size's sampled blocks leave out (autograder.at_scale).
        first, last = unsampled_blocks(OPTIONS, "unrolled_warp")
        unsampled = f"n == 67108864u && blockIdx.x >= {first} && blockIdx.x <= {last}"
        kernel = mutant("unrolled_warp", "g_out[blockIdx.x] = v;", f"g_out[blockIdx.x] = {unsampled} ? 0.0f : v;")
    clean, restarts, statuses = clean_after("gpu", {"unrolled_warp": kernel})
    assert statuses["unrolled_warp"] is (Status.COMPILE_ERROR if ending.startswith("compile") else Status.INCORRECT)
    assert restarts == 0 and not clean
