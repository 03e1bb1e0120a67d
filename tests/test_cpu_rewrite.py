"""The CPU backend's source handling, without running kernels: the __shared__ rewrite and compiler messages."""

from __future__ import annotations

from autograder.backends.cpu.compiler import SOURCE_NAME, parameter_names, parse_diagnostics
from autograder.backends.cpu.rewrite import blank_comments_and_strings, declares_device_variables, rewrite_shared
from autograder.records import KernelSource, SourceLocation


def test_extern_shared_becomes_a_pointer_to_the_dynamic_arena() -> None:
    rewritten = rewrite_shared("void k() {\n    extern __shared__ float sdata[];\n}\n")
    assert "float *const sdata = reinterpret_cast<float *>(__ag_dynamic_shared);" in rewritten.text
    assert rewritten.dynamic_names == ("sdata",)


def test_static_shared_becomes_a_reference_into_the_arena_keeping_lines() -> None:
    source = (
        "template <unsigned B>\nvoid k() {\n"
        "    __shared__ volatile float sums[B / 32], other[2];\n"
        "    static __shared__ __align__(16) int\n        grid[4][8];\n"
        "    __shared__ unsigned int count;\n"
        "    int after = 1;\n}\n"
    )
    text = rewrite_shared(source).text
    assert text.count("\n") == source.count("\n")
    assert text.splitlines()[6] == "    int after = 1;"
    assert "static volatile float (&sums)[B / 32] = *reinterpret_cast<volatile float (*)[B / 32]>(" in text
    assert "static volatile float (&other)[2]" in text
    assert "static int (&grid)[4][8]" in text and "__align__" not in text
    assert "static unsigned int &count = *reinterpret_cast<unsigned int *>(" in text


def test_shared_in_comments_strings_and_directives_is_left_alone() -> None:
    source = '// __shared__ float a[2];\nconst char *s = "__shared__ int x;";\n#define SHARED __shared__\n'
    assert rewrite_shared(source).text == source
    assert "__shared__" not in blank_comments_and_strings(source).split("\n")[0]


def test_prelude_errors_are_put_on_the_students_line() -> None:
    source = KernelSource("line1\nline2\nline3\n", SourceLocation("nb.ipynb", "naive", 2, 10))
    log = (
        "/x/ag_prelude.h:80:12: error: no matching function for call to "
        "'__ag_shuffle(int, <unnamed enum>, unsigned int, float*, int)'\n"
        f"{SOURCE_NAME}:3:15: note: in expansion of macro '__shfl_down_sync'\n"
        f"{SOURCE_NAME}:2:5: warning: unused variable 'x' [-Wunused-variable]\n"
    )
    error, warning = parse_diagnostics(log, source)
    assert (error.severity, error.line) == ("error", 12)
    assert "__ag_" not in error.text and "a warp shuffle (" in error.text
    assert (warning.severity, warning.line) == ("warning", 11)


def test_parameter_names_come_from_the_kernel_definition() -> None:
    source = "__global__ void reduce_naive(const float * __restrict__ input, float *out, unsigned n) {}"
    assert parameter_names(source, "reduce_naive", 3) == ("input", "out", "n")
    assert parameter_names("nothing here", "reduce_naive", 3) == ("g_in", "g_out", "n")


def test_device_variables_are_told_from_device_functions() -> None:
    assert declares_device_variables("__device__ unsigned int count = 0;\n__global__ void k() {}")
    assert declares_device_variables("__constant__ float weights[16];")
    assert not declares_device_variables("__device__ float twice(float x) { return 2 * x; }")
    assert not declares_device_variables("__global__ void k() { __device__ int x; }\n// __device__ int y;")
