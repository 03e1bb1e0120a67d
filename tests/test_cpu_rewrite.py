"""The CPU backend's source handling, without running kernels: the __shared__ rewrite and compiler messages."""

from __future__ import annotations

from autograder.backends.cpu.compiler import (
    SOURCE_NAME,
    data_objects,
    device_variables,
    parameter_names,
    parse_diagnostics,
)
from autograder.backends.cpu.rewrite import (
    blank_comments_and_strings,
    rewrite_preprocessed,
    rewrite_shared,
    rewrite_source,
)
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


def test_alignment_arguments_with_parentheses_are_dropped_too() -> None:
    # The CUDA samples' idiom: an alignment written as a sizeof. Left in place, it made the rewrite fall back to
    # unchecked statics, or g++ refuse what nvcc accepts.
    for spec in ("__align__(sizeof(float))", "alignas(sizeof(float4))", "__align__((16))"):
        text = rewrite_shared(f"void k() {{\n    extern __shared__ {spec} unsigned char raw[];\n"
                              f"    __shared__ {spec} float sdata[1024];\n}}\n").text
        assert "unsigned char *const raw = reinterpret_cast<unsigned char *>(__ag_dynamic_shared);" in text, spec
        assert "static float (&sdata)[1024]" in text and "__align__" not in text and "alignas" not in text, spec


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


def test_digit_separators_are_numbers_and_character_literals_are_blanked() -> None:
    assert blank_comments_and_strings("int a = 1'024; char c = 'x'; float f = .5'0f; u8'a'; 0x1'F;") == (
        "int a = 1'024; char c =    ; float f = .5'0f; u8   ; 0x1'F;"
    )


def test_a_source_is_preprocessed_only_when_a_macro_declares_shared_memory() -> None:
    calls: list[str] = []

    def preprocess(text: str) -> str:
        calls.append(text)
        return PREPROCESSED

    plain = "#define N 256\n__global__ void k() {\n    extern __shared__ float s[];\n}\n"
    assert not rewrite_source(plain, preprocess, SOURCE_NAME).preprocessed and calls == []
    with_macro = "#define SMEM \\\n    extern __shared__ float\n__global__ void k() {\n    SMEM s[];\n}\n"
    rewritten = rewrite_source(with_macro, preprocess, SOURCE_NAME)
    assert calls == [with_macro] and rewritten.preprocessed and rewritten.dynamic_names == ("s",)


# g++ -E output: the prelude's lines, then the student's file with a macro expanded on its own line.
PREPROCESSED = (
    '# 0 "kernel.cu"\n'
    '# 1 "/runtime/ag_prelude.h" 1\n'
    "struct dim3 { unsigned x; };\n"
    "int __shared__;\n"
    '# 2 "kernel.cu" 2\n'
    "\n"
    "__global__ void k() {\n"
    "    extern __shared__ float s[];\n"
    "    __shared__ float (*odd)(int);\n"
    '    const char *text = "__shared__";\n'
    "}\n"
)


def test_only_the_students_lines_of_preprocessed_output_are_rewritten() -> None:
    rewritten = rewrite_preprocessed(PREPROCESSED, SOURCE_NAME)
    lines = rewritten.text.splitlines()
    assert len(lines) == len(PREPROCESSED.splitlines())
    assert lines[:5] == PREPROCESSED.splitlines()[:5]  # the header keeps its own `__shared__`
    assert lines[7] == "    float *const s = reinterpret_cast<float *>(__ag_dynamic_shared);"
    # What the rewrite cannot take apart becomes static, as the prelude's fallback makes it; strings stay.
    assert lines[8] == "    static float (*odd)(int);"
    assert lines[9] == '    const char *text = "__shared__";'
    assert rewritten.dynamic_names == ("s",)


def test_the_device_variables_are_the_librarys_data_but_the_compilers_and_the_rewrites() -> None:
    """compiler.device_variables over `nm --defined-only -S -p` (and its `-C` twin): a kernel's own objects,
    whatever their scope; not guard variables, vtables, the C runtime's, the runtime's or the rewrite's `__shared__`
    arrays (told by their markers); and all of a name where a scope holds more of it than markers."""
    listing = [  # (symbol, demangled, kind)
        ("armed", "armed", "B"),
        ("_ZN4keep11first_blockE", "keep::first_block", "B"),
        ("_Z4keptIN2ns1SEE", "kept<ns::S>", "u"),
        ("_ZZ1fvE5local", "f()::local", "b"),
        ("_ZZ1fvE5sdata", "f()::sdata", "b"),
        ("_ZZ1fvE17__ag_shared_sdata", "f()::__ag_shared_sdata", "r"),
        ("_ZGVZ1fvE5sdata", "guard variable for f()::sdata", "b"),
        ("_ZZ1gvE3buf", "g()::buf", "b"),
        ("_ZZ1gvE3buf_0", "g()::buf", "b"),
        ("_ZZ1gvE15__ag_shared_buf", "g()::__ag_shared_buf", "r"),
        ("_ZL4tile", "tile", "b"),
        ("_ZL16__ag_shared_tile", "__ag_shared_tile", "r"),
        ("_ZTV1S", "vtable for S", "V"),
        ("__ag_kernel", "__ag_kernel", "B"),
        ("completed.0", "completed.0", "b"),
        ("table", "table", "r"),
    ]
    symbols = "\n".join(f"0000000000004000 0000000000000004 {kind} {symbol}" for symbol, _, kind in listing)
    demangled = "\n".join(f"0000000000004000 0000000000000004 {kind} {name}" for _, name, kind in listing)
    symbols += "\n0000000000003dc8 d _DYNAMIC"
    demangled += "\n0000000000003dc8 d _DYNAMIC"
    assert device_variables(data_objects(symbols, demangled)) == [
        "armed", "_ZN4keep11first_blockE", "_Z4keptIN2ns1SEE", "_ZZ1fvE5local", "_ZZ1gvE3buf", "_ZZ1gvE3buf_0"
    ]
