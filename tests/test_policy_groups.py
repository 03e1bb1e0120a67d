"""The source policy and what the compiler never compiles: comments, and conditional groups its preprocessor skips.

Students leave notes in comments and `#if 0` blocks: English with apostrophes and unbalanced quotes, non-ASCII
text, backslashes, `??` punctuation, `#` at the start of a line, names of host functions, old code with quoted
includes and `fprintf(stderr, ...)`. The compilers accept all of it (a warning at most), so the policy must too:
each kernel below is the sequential reference kernel with such text in it, and it must pass the policy with the
backend's preprocessor asked, and really compile, with g++ through the CPU backend and with nvcc where it is
installed. The attacks on the way the preprocessor is asked are in tests/hostile/kernels/group_*.cu; the ones
that depend on a backend's own macros are here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autograder.backends.cpu.compiler import find_compiler
from autograder.backends.gpu import find_nvcc
from autograder.build import Builder
from autograder.errors import BackendUnavailable, CompileError, GraderError
from autograder.policy import Preprocess, check_source, source_problems
from autograder.records import DeviceInfo, KernelSource
from autograder.references import reference_source
from autograder.sandbox import Sandbox, SandboxUnavailable
from autograder.stages import get_stage

SEQUENTIAL = get_stage("sequential")
GPU_ARCH = "9.0"  # what the policy asks nvcc for: --cubin -arch=sm_90


def preprocessing(backend: str) -> tuple[Sandbox, DeviceInfo]:
    """The sandbox and the device with which the policy asks `backend`'s preprocessor; skips the test where that
    compiler or the sandbox is missing."""
    sandbox = Sandbox()
    try:
        sandbox.require()
    except SandboxUnavailable as unavailable:
        pytest.skip(str(unavailable))
    if backend == "gpu":
        if find_nvcc() is None:
            pytest.skip("nvcc is not installed")
        return sandbox, DeviceInfo("gpu", "nvcc", compute_capability=GPU_ARCH)
    try:
        version = find_compiler()[1]
    except BackendUnavailable as unavailable:
        pytest.skip(str(unavailable))
    return sandbox, DeviceInfo("cpu", "CPU backend", versions=(("g++", version),))


def refused_lines(text: str, backend: str | None) -> list[int]:
    """The lines the policy refuses in `text`, asking `backend`'s preprocessor (or none)."""
    asked = preprocessing(backend) if backend else ()
    try:
        check_source(KernelSource(text), *asked)
    except CompileError as refused:
        return [message.line for message in refused.messages]
    return []


def with_notes(before_kernel: str = "", in_body: str = "") -> str:
    """The sequential reference kernel with `before_kernel` in front of it and `in_body` after its first
    __syncthreads()."""
    text = reference_source("sequential").text
    kernel = text.index("__global__")
    body = text.index("__syncthreads();") + len("__syncthreads();\n")
    return text[:kernel] + before_kernel + text[kernel:body] + in_body + text[body:]


NOTES = {
    "if-0-prose": with_notes(
        "#if 0\n"
        "this isn't compiled: ... { \"\n"
        "Don't use atomicAdd here, it's slow; the 'tree' is faster. She said \"try it\n"
        "1'000'000 floats of 0x1p-3f, 1'024 threads' worth: isn't that it?\n"
        "Caf\u00e9 na\u00efve \u00fcber \u03bb-calculus, \u65e5\u672c\u8a9e \U0001f680 done \U0001f600\n"
        "C:\\Users\\me\\kernels\\old.cu and a \\n that is no escape\n"
        "Does this work?? Who knows??! (really??) ??= ??/\n"
        "Paste tokens: a ## b; #x stringizes\n"
        "# TODO: unroll the last warp\n"
        "#1 rule: no prints in the kernel\n"
        "#include \"notes.h\"\n"
        "#include <my_helpers.cuh>\n"
        "#frobnicate the widget\n"
        "system(\"nvidia-smi\"); fopen(\"log.txt\", \"w\"); asm(\"trap;\"); ag_clear_findings();\n"
        "#endif\n"
    ),
    "comments-and-strings": with_notes(
        "// does this work??) and what about this??!  ??= ??( ??< ??'\n"
        "// a comment whose trigraph would be a line splice: it ends here ??/\n"
        "// a /* inside a line comment, and a */ too\n"
        "// R\"(a raw string in a comment)\" and a lone R\"\n"
        "/* it's \"unbalanced, caf\u00e9 \U0001f600 \u2014 \u2192 \u2705, C:\\temp\\, ## and #include \"x.h\" */\n",
        in_body="    if (n == 0) printf(\"caf\u00e9 \u2014 \U0001f600 it's \\\"%c\\\" \\\\ ??!\\n\", '\\'');\n",
    ),
    "debug-block": with_notes(
        in_body=(
            "#ifdef DEBUG\n"
            "    if (tid == 0) fprintf(stderr, \"block %u: %f\\n\", blockIdx.x, sdata[0]); // can't run on a GPU\n"
            "#endif\n"
            "#ifndef __CUDA_ARCH__\n"
            "    printf(\"host pass: this isn't device code\\n\"); exit(1);\n"
            "#endif\n"
        )
    ),
    "else-and-elif": with_notes(
        "#if 1\n"
        "#define HALF(x) ((x) / 2)\n"
        "#else\n"
        "we'd use a shift here, but it's the same\n"
        "#endif\n"
        "#if 0\n"
        "the first idea didn't work\n"
        "#elif 0\n"
        "neither did the second: fopen(\"trace\")\n"
        "#elifdef NOT_DEFINED\n"
        "nor this one's \"third\n"
        "#elifndef __CUDACC__\n"
        "host code: system(\"date\")\n"
        "#else\n"
        "#define UNUSED_NOTE 1\n"
        "#endif\n"
    ),
    "nested": with_notes(
        "#ifdef NOT_DEFINED\n"
        "outer notes aren't compiled\n"
        "#if 1\n"
        "  nor are these, though their #if is true: it's inside a skipped group\n"
        "#else\n"
        "  #include \"old.cu\"\n"
        "#endif\n"
        "#else\n"
        "#if 0\n"
        "  inner notes: don't\n"
        "#endif\n"
        "#endif\n"
    ),
    "spelled-differently": with_notes(
        "%:if 0\n"
        "a digraph #if: it's skipped\n"
        "%:endif\n"
        "#i\\\n"
        "f 0\n"
        "a directive split by a line splice: it's skipped\n"
        "#endif\n"
        "/* a comment before the directive */ #  if 0\n"
        "spaces after the hash: it's skipped\n"
        "  #   endif\n"
        "#if !defined(__CUDACC__)\n"
        "host-only: both backends define __CUDACC__, so this isn't compiled\n"
        "#endif\n"
    ),
}


@pytest.mark.parametrize("name", NOTES)
@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_notes_the_compiler_never_compiles_pass(name: str, backend: str) -> None:
    assert refused_lines(NOTES[name], backend) == []


@pytest.mark.parametrize("name", NOTES)
def test_a_kernel_with_notes_compiles_with_g_plus_plus(name: str, cache_dir: Path) -> None:
    sandbox, device = preprocessing("cpu")
    build = Builder(device, sandbox, {"cache_dir": str(cache_dir)}).build(SEQUENTIAL, KernelSource(NOTES[name]))
    assert build.backend == "cpu" and build.stage_id == SEQUENTIAL.id


@pytest.mark.parametrize("name", NOTES)
def test_a_kernel_with_notes_compiles_with_nvcc(name: str) -> None:
    sandbox, device = preprocessing("gpu")
    build = Builder(device, sandbox).build(SEQUENTIAL, KernelSource(NOTES[name]))
    assert build.backend == "gpu" and build.file("kernel.cubin")


def test_notes_in_groups_are_refused_where_no_compiler_is_asked() -> None:
    # Without the sandbox and a device, nothing tells which groups are skipped: every group is checked as code.
    assert 4 in refused_lines(NOTES["if-0-prose"], None)
    assert refused_lines(NOTES["comments-and-strings"], None) == []  # comments and strings need no compiler


def _never(text: str) -> list[str]:
    raise AssertionError("the preprocessor ran")


@pytest.mark.parametrize(
    "text",
    [
        reference_source("sequential").text,
        NOTES["comments-and-strings"],
        'static int pwned = system("id");\n',
        '#if 0\n#endif\nstatic int pwned = system("id");\n',
        "#if 0\nit's never closed\n",
        "#if 0\n__LINE__ isn't used here\n#endif\n",
    ],
    ids=["clean", "comments-and-strings", "refused-outside-groups", "no-problem-in-groups", "unclosed", "__LINE__"],
)
def test_the_preprocessor_runs_only_where_groups_can_change_the_verdict(text: str) -> None:
    source_problems(text, _never)


def _fire_markers(text: str, last_only: bool = False) -> str:
    """What the preprocessor would say if every marker in `text` fired, or only the last one."""
    markers = [f"kernel.cu:1:2: error: {line}\n" for line in text.splitlines() if line.startswith("#error ")]
    return "".join(markers[-1:] if last_only else markers)


def _fail(text: str) -> list[str]:
    raise GraderError("the sandbox cannot start")


@pytest.mark.parametrize(
    "preprocess",
    [
        _fail,
        lambda text: [""],  # no marker fired: not even the top level's chain took a group
        lambda text: [_fire_markers(text)],  # both groups of the chain taken
        lambda text: [_fire_markers(text, last_only=True) + "kernel.cu:9:1: error: something else\n"],
    ],
    ids=["cannot-run", "nothing-fired", "everything-fired", "another-error"],
)
def test_where_the_preprocessor_cannot_tell_every_group_is_checked(preprocess: Preprocess) -> None:
    assert source_problems("#if 0\nit's\n#endif\n", preprocess) == [
        (2, "a string or character literal is not closed on its line; close it")
    ]


PWNED = 'static int pwned = system("touch /tmp/pwned");\n'


@pytest.mark.parametrize(
    "text",
    [
        # nvcc defines __NVCC__ and compiles for sm_90 (and the GPU's own architecture); the CPU prelude has sm_80.
        f"#ifdef __NVCC__\n{PWNED}#endif\n",
        f"#if __CUDA_ARCH__ >= 900\n{PWNED}#endif\n",
        # The CPU backend's instrumented build defines __SANITIZE_THREAD__, its plain build does not.
        f"#ifdef __SANITIZE_THREAD__\n{PWNED}#endif\n",
        f"#ifndef __SANITIZE_THREAD__\n{PWNED}#endif\n",
        # A macro that mentions __shared__ makes the CPU backend preprocess with __shared__ undefined first.
        f"#define SHARED_SUMS extern __shared__ float\n#ifndef __shared__\n{PWNED}#endif\n",
    ],
    ids=["__NVCC__", "__CUDA_ARCH__", "__SANITIZE_THREAD__", "not-__SANITIZE_THREAD__", "__shared__-undefined"],
)
def test_a_group_any_compiler_compiles_is_refused_on_both_backends(text: str) -> None:
    # Every compiler is asked whichever backend grades, so a hand-in gets one verdict on both.
    if find_nvcc() is None:
        pytest.skip("nvcc is not installed: the nvcc-only groups are taken by it alone")
    line = text.splitlines().index(PWNED.strip()) + 1
    for backend in ("cpu", "gpu"):
        assert line in refused_lines(text, backend), backend


def test_the_reported_hand_in_passes_through_the_builder(cache_dir: Path) -> None:
    # Issue 19: a correct kernel with an #if 0 block of English text was refused on every stage.
    sandbox, device = preprocessing("cpu")
    text = with_notes("#if 0\nthis isn't compiled: ... { \"\n#endif\n")
    assert refused_lines(text, None) == [4]
    Builder(device, sandbox, {"cache_dir": str(cache_dir)}).build(SEQUENTIAL, KernelSource(text))


# Sources whose compilers take different groups, each group clean on its own: the GPU would run one kernel and the
# race analysis (g++) check another. (line of the directive that splits them)
SPLITS = {
    "by-name": (with_notes("#ifdef __NVCC__\n#define STEP 1\n#else\n#define STEP 2\n#endif\n"), 3),
    "by-architecture": (with_notes("#if __CUDA_ARCH__ >= 900\n#define STEP 1\n#else\n#define STEP 2\n#endif\n"), 3),
    "through-a-macro": (with_notes("#define NEW_GPU (__CUDA_ARCH__ > 850)\n#if NEW_GPU\n#define STEP 1\n#endif\n"), 4),
    "instrumented-build": (with_notes("", "#if defined(__SANITIZE_THREAD__)\n    __syncthreads();\n#endif\n"), None),
    "line-and-condition": (with_notes("#if __LINE__ > 1 && __CUDA_ARCH__ == 800\n#define STEP 1\n#endif\n"), 3),
}


@pytest.mark.parametrize("name", SPLITS)
@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_code_that_each_compiler_compiles_differently_is_refused(name: str, backend: str) -> None:
    if find_nvcc() is None:
        pytest.skip("nvcc is not installed: what it compiles cannot be compared")
    text, line = SPLITS[name]
    refused = refused_lines(text, backend)
    assert refused and (line is None or line in refused), refused


def test_compiler_names_are_refused_even_where_no_compiler_is_asked() -> None:
    assert refused_lines(SPLITS["by-name"][0], None) == [3]
    assert refused_lines(with_notes("#ifdef __SANITIZE_THREAD__\n#endif\n"), None) == [3]


def test_conditions_every_compiler_takes_alike_pass() -> None:
    text = with_notes("#ifndef STEP\n#define STEP 2\n#endif\n#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700\n"
                      "#define FULL_MASK 0xffffffffu\n#endif\n")
    for backend in ("cpu", "gpu"):
        assert refused_lines(text, backend) == [], backend
