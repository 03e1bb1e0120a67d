"""The test data stays usable: reference kernels, known-wrong kernels and the example class.

Every kernel file defines exactly its stage's kernel with the catalogue's signature and compiles with nvcc
(where nvcc is installed); tests/known/cases.toml and examples/submissions/EXPECTED.toml describe exactly the
files that exist; and the example notebooks are what examples/make_examples.py generates from the references.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from autograder.notebook import stage_cells
from autograder.records import FINDING_KINDS, PerfVerdict, Status
from autograder.stages import MAX2D_BASELINE, STAGE_IDS, STAGES, Stage, get_stage

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_DIR = ROOT / "solutions" / "reduction" / "kernels"
KNOWN_DIR = ROOT / "tests" / "known"
EXAMPLES_DIR = ROOT / "examples" / "submissions"
REFERENCE_STAGES: tuple[Stage, ...] = (*STAGES, MAX2D_BASELINE)
STATUSES = {status.value for status in Status}
PERF_VERDICTS = {verdict.value for verdict in PerfVerdict}
# The kernels need sm_70 or later (__syncwarp, independent thread scheduling); CUDA 13 compiles for sm_75 and up,
# and older toolkits know sm_75 too.
NVCC_ARCH = "sm_75"


def load_toml(path: Path) -> dict[str, Any]:
    with path.open("rb") as handle:
        return tomllib.load(handle)


KNOWN_CASES: list[dict[str, Any]] = load_toml(KNOWN_DIR / "cases.toml")["case"]
EXPECTED: dict[str, Any] = load_toml(EXAMPLES_DIR / "EXPECTED.toml")


def load_make_examples() -> ModuleType:
    """examples/make_examples.py as a module: examples/ is not a package."""
    spec = importlib.util.spec_from_file_location("make_examples", ROOT / "examples" / "make_examples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def without_comments(source: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", "", source, flags=re.DOTALL)


def kernel_definitions(source: str) -> list[tuple[str, str]]:
    """(name, parameter list) of every __global__ function defined in `source`, comments removed."""
    code = without_comments(source)
    pattern = r"__global__\s+void\s+(\w+)\s*\(([^)]*)\)\s*\{"
    return [(name, normalise(params)) for name, params in re.findall(pattern, code)]


def normalise(params: str) -> str:
    """A parameter list with one spelling of whitespace, so formatting differences do not count."""
    params = re.sub(r"\s+", " ", params.strip())
    return re.sub(r"\s*([*,])\s*", r"\1", params)


def signature_params(stage: Stage) -> str:
    return normalise(stage.signature.split("(", 1)[1].rsplit(")", 1)[0])


def expected_statuses(entry: dict[str, Any], backend: str) -> set[str]:
    """The statuses a case or example stage may get on `backend` ("gpu" or "cpu")."""
    value = entry.get(f"status_{backend}", entry.get("status"))
    assert value is not None, f"{entry}: needs `status`, or both `status_gpu` and `status_cpu`"
    return {value} if isinstance(value, str) else set(value)


# Every kernel file with the stage it must implement.
KERNEL_FILES: list[tuple[Path, Stage]] = [
    *((REFERENCE_DIR / f"{stage.id}.cu", stage) for stage in REFERENCE_STAGES),
    *((KNOWN_DIR / case["file"], get_stage(case["stage"])) for case in KNOWN_CASES),
]


def test_every_stage_has_exactly_one_reference_kernel() -> None:
    wanted = {f"{stage.id}.cu" for stage in REFERENCE_STAGES}
    present = {path.name for path in REFERENCE_DIR.glob("*.cu")}
    assert present == wanted, f"missing: {sorted(wanted - present)}, not in the catalogue: {sorted(present - wanted)}"


@pytest.mark.parametrize(("path", "stage"), KERNEL_FILES, ids=[str(path.relative_to(ROOT)) for path, _ in KERNEL_FILES])
def test_kernel_file_defines_exactly_its_stage_kernel(path: Path, stage: Stage) -> None:
    definitions = kernel_definitions(path.read_text())
    assert definitions == [(stage.kernel_name, signature_params(stage))], (
        f"{path.name} must define only `{stage.signature}`; it defines {definitions}"
    )


def test_cases_toml_lists_every_known_file_once() -> None:
    listed = [case["file"] for case in KNOWN_CASES]
    assert len(listed) == len(set(listed)), "a file is listed twice in cases.toml"
    assert set(listed) == {path.name for path in KNOWN_DIR.glob("*.cu")}


@pytest.mark.parametrize("case", KNOWN_CASES, ids=[case["name"] for case in KNOWN_CASES])
def test_known_case_is_well_formed(case: dict[str, Any]) -> None:
    assert case["name"] == Path(case["file"]).stem
    assert case["stage"] in {stage.id for stage in REFERENCE_STAGES}
    for backend in ("gpu", "cpu"):
        assert expected_statuses(case, backend) <= STATUSES
    # A known-wrong kernel must be caught somewhere: by its status on some backend, or by a finding.
    caught = (expected_statuses(case, "gpu") | expected_statuses(case, "cpu")) != {Status.CORRECT.value}
    assert caught or case["findings"]
    assert set(case["findings"]) <= set(FINDING_KINDS)
    assert case["why"].strip()


def nvcc_errors(path: Path, out_dir: Path) -> str | None:
    """nvcc's diagnostics for `path`, or None when it compiled without any.

    A device-only compile to a cubin, as PyCUDA does: the kernels have no host code.
    """
    result = subprocess.run(
        ["nvcc", f"-arch={NVCC_ARCH}", "-cubin", str(path), "-o", str(out_dir / f"{path.stem}.cubin")],
        capture_output=True,
        text=True,
        check=False,
    )
    diagnostics = (result.stdout + result.stderr).strip()
    return diagnostics or (None if result.returncode == 0 else f"exit status {result.returncode}")


def compile_all(paths: list[Path], out_dir: Path) -> dict[Path, str | None]:
    # One nvcc per file, several at once: a single compile takes a second or two.
    with ThreadPoolExecutor() as pool:
        return dict(zip(paths, pool.map(lambda path: nvcc_errors(path, out_dir), paths), strict=True))


requires_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


@requires_nvcc
def test_reference_and_known_kernels_compile_cleanly(tmp_path: Path) -> None:
    results = compile_all([path for path, _ in KERNEL_FILES], tmp_path)
    failures = {str(path.relative_to(ROOT)): errors for path, errors in results.items() if errors}
    assert not failures, f"nvcc reported diagnostics: {failures}"


def test_example_notebooks_are_what_the_generator_writes(tmp_path: Path) -> None:
    generated = {path.name: path.read_bytes() for path in load_make_examples().build_class(tmp_path)}
    committed = {path.name: path.read_bytes() for path in EXAMPLES_DIR.glob("*.ipynb")}
    assert sorted(committed) == sorted(generated)
    stale = [name for name in generated if committed[name] != generated[name]]
    assert not stale, f"run `.venv/bin/python examples/make_examples.py`: {stale} differ from the generated ones"


def test_expected_toml_describes_every_student_and_stage() -> None:
    students = [student.name for student in load_make_examples().CLASS]
    assert sorted(EXPECTED) == sorted(students)
    for student in students:
        assert EXPECTED[student]["shows"].strip()
        stages = {key for key, value in EXPECTED[student].items() if isinstance(value, dict)}
        assert stages == set(STAGE_IDS), f"{student}: EXPECTED.toml must list exactly the stages {STAGE_IDS}"
        for stage_id in STAGE_IDS:
            entry = EXPECTED[student][stage_id]
            gpu, cpu = expected_statuses(entry, "gpu"), expected_statuses(entry, "cpu")
            assert gpu | cpu <= STATUSES, f"{student}.{stage_id}"
            assert set(entry["findings"]) <= set(FINDING_KINDS), f"{student}.{stage_id}"
            assert entry["perf"] in PERF_VERDICTS, f"{student}.{stage_id}"
            # Speed is measured only for a stage that is correct on the GPU.
            if gpu != {Status.CORRECT.value}:
                assert entry["perf"] == PerfVerdict.NOT_MEASURED.value, f"{student}.{stage_id}"


@pytest.mark.parametrize("student", sorted(EXPECTED))
def test_expected_statuses_match_what_the_notebook_holds(student: str) -> None:
    """The statuses that can be read off the notebook alone agree with EXPECTED.toml."""
    cells = stage_cells(EXAMPLES_DIR / f"{student}.ipynb")
    for stage_id, cell in cells.items():
        expected = expected_statuses(EXPECTED[student][stage_id], "gpu")
        if not cell.attempted:
            assert expected == {Status.NOT_ATTEMPTED.value}, f"{student}.{stage_id} is not attempted"
        elif cell.problem is not None:
            assert expected == {Status.INVALID_CELL.value}, f"{student}.{stage_id}: {cell.problem}"
        else:
            assert Status.NOT_ATTEMPTED.value not in expected and Status.INVALID_CELL.value not in expected
            assert cell.source is not None
            stage = get_stage(stage_id)
            definitions = kernel_definitions(cell.source.text)
            assert definitions == [(stage.kernel_name, signature_params(stage))], f"{student}.{stage_id}"


@requires_nvcc
def test_example_kernels_compile_exactly_where_expected(tmp_path: Path) -> None:
    sources: dict[Path, str] = {}
    for student in EXPECTED:
        for stage_id, cell in stage_cells(EXAMPLES_DIR / f"{student}.ipynb").items():
            # A kernel whose code is the reference's (comments aside) is already compiled by the test above.
            reference = without_comments((REFERENCE_DIR / f"{stage_id}.cu").read_text()).split()
            if cell.source is not None and without_comments(cell.source.text).split() != reference:
                path = tmp_path / f"{student}.{stage_id}.cu"
                path.write_text(cell.source.text)
                sources[path] = f"{student}.{stage_id}"
    results = compile_all(list(sources), tmp_path)
    for path, errors in results.items():
        student, stage_id = sources[path].split(".")
        expects_error = expected_statuses(EXPECTED[student][stage_id], "gpu") == {Status.COMPILE_ERROR.value}
        if expects_error:
            assert errors and "error" in errors, f"{sources[path]} should not compile"
        else:
            assert errors is None, f"{sources[path]}: {errors}"
