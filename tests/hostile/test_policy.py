"""The source policy (autograder/policy.py) refuses hostile kernels before any compiler sees them.

Each kernel in tests/hostile/kernels/ is the naive reference kernel with one attack in front of it, and its second
line says where and what must be refused: `// refused at line N: <part of the message>`. A test fails when an
attack gets past the policy, when its message names another line, or when a message quotes more than the offending
token. Each attack is tried with no compiler asked and with the preprocessor of each backend asked which conditional
groups it skips (the group_*.cu kernels attack that question). Every kernel the project ships or tests as legitimate
must pass untouched.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from test_policy_groups import preprocessing  # tests/ is on the path, as the folder of its conftest

from autograder.errors import CompileError
from autograder.grade import GradeOptions, grade_notebook
from autograder.notebook import kernel_cell
from autograder.policy import MAX_MESSAGES, MAX_SOURCE_CHARS, check_source, source_problems
from autograder.records import KernelSource, SourceLocation, Status
from autograder.stages import STAGES

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = Path(__file__).parent / "kernels"
EXPECTED = re.compile(r"// refused at line (\d+): (.+)")
LEGITIMATE = sorted(
    [
        *(ROOT / "solutions" / "reduction" / "kernels").glob("*.cu"),
        *(ROOT / "tests" / "known").glob("*.cu"),
        *(ROOT / "tests" / "cpu_kernels").glob("*.cu"),
    ]
)


def refusal(text: str, location: SourceLocation | None = None, backend: str | None = None) -> CompileError:
    """The policy's refusal of `text`, asking `backend`'s preprocessor which groups it skips (or none)."""
    asked = preprocessing(backend) if backend else ()
    with pytest.raises(CompileError) as raised:
        check_source(KernelSource(text, location), *asked)
    return raised.value


@pytest.mark.parametrize("backend", [None, "cpu", "gpu"], ids=["no-compiler", "cpu", "gpu"])
@pytest.mark.parametrize("path", sorted(HOSTILE.glob("*.cu")), ids=lambda path: path.stem)
def test_a_hostile_kernel_is_refused_on_its_line(path: Path, backend: str | None) -> None:
    text = path.read_text()
    line, fragment = EXPECTED.fullmatch(text.splitlines()[1]).groups()
    messages = refusal(text, backend=backend).messages
    assert any(m.line == int(line) and fragment in m.text for m in messages), messages
    assert all(m.severity == "error" for m in messages)


@pytest.mark.parametrize("path", LEGITIMATE, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_every_legitimate_kernel_passes(path: Path) -> None:
    assert source_problems(path.read_text()) == []


def test_the_stubs_pass() -> None:
    for stage in STAGES:
        assert source_problems(stage.stub_source()) == [], stage.id


def test_what_looks_suspicious_in_comments_strings_and_allowed_forms_passes() -> None:
    kernel = r"""
#include <cuda_runtime.h>
#include <cooperative_groups.h>   // the toolkit's own
#include <cooperative_groups/reduce.h> /* and its reduce */
#define BLOCK 256
#define ALIGNED __attribute__((aligned(16)))
#if 0
    #include "old_helpers.cu"  // never compiled: g++ skips this group
#endif
// system("rm -rf /"); asm("nop"); #include "x.cu"; ag_clear_findings(); fopen
/* [[gnu::constructor]] extern "C" __attribute__((constructor)) */
template <unsigned int N>
__device__ __forceinline__ float twice(float x) { return 2.0f * x; }
struct ALIGNED pair { float a, b; };
__global__ void reduce_naive(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    alignas(16) float local[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const char *note = "asm system fopen ag_x \" // not a comment";
    char quote = '\'';
    unsigned int big = 1'000'000u, tid = threadIdx.x;
    #pragma unroll 4
    for (int k = 0; k < 4; ++k) local[k] = 0x1p-3f * k + 1e+2f;
    if (tid == 0 && n > big) printf("%s %c\n", note, quote);
    sdata[tid] = tid < n ? g_in[tid] : 0.0f;
    __syncthreads();
    if (tid == 0) g_out[blockIdx.x] = sdata[0] + local[0];
}
"""
    check_source(KernelSource(kernel), *preprocessing("cpu"))


def test_code_in_an_if_0_block_is_checked_where_no_compiler_tells_it_is_skipped() -> None:
    (message,) = refusal('#if 0\n#include "old_helpers.cu"\n#endif\n').messages
    assert message.line == 2 and "quoted #include" in message.text


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("int x; // a comment\rasm(\"nop\");\n", "control character U+000D"),  # a lone CR ends the comment for g++
        ("int a\0sm;\n", "control character U+0000"),
        ("int x; // \ud800\n", "not valid Unicode"),
        ("int x = 1; \x1b[2J\n", "control character U+001B"),
    ],
    ids=["lone-carriage-return", "null-byte", "lone-surrogate", "escape-sequence"],
)
def test_characters_the_compiler_may_read_otherwise_are_refused(text: str, fragment: str) -> None:
    (message,) = refusal(text).messages
    assert fragment in message.text and message.line == 1


def test_windows_line_ends_and_form_feeds_are_fine() -> None:
    assert source_problems("int x;\r\n\f// page\r\nint y;\r\n") == []


def test_messages_name_the_notebook_cell_line() -> None:
    # The kernel's string starts on line 3 of its cell: the kernel's line 3 is the cell's line 5.
    location = SourceLocation("hand-in.ipynb", "naive", cell_index=4, first_line=3)
    error = refusal('\nint x;\nasm("nop");\n', location)
    assert [m.line for m in error.messages] == [5]
    assert str(error).startswith("refused before compiling: line 5: `asm` is refused")


def test_a_message_quotes_at_most_the_offending_token() -> None:
    long_name = "ag_" + "x" * 500
    path = "a/" * 300 + "secret.h"
    for text in (f"int {long_name};\n", f"#include <{path}>\n", f"#{'z' * 400}\n"):
        for message in refusal(text).messages:
            assert "x" * 60 not in message.text and "a/" * 30 not in message.text and "z" * 60 not in message.text


def test_an_oversized_kernel_and_a_flood_of_problems_are_cut_short() -> None:
    (message,) = refusal("//" + "x" * MAX_SOURCE_CHARS).messages
    assert f"more than the {MAX_SOURCE_CHARS}" in message.text
    assert len(refusal('asm("nop");\n' * 500).messages) == MAX_MESSAGES


def test_a_refused_kernel_in_a_notebook_is_that_stage_s_compile_error(tmp_path: Path) -> None:
    # Through the whole grading pipeline: the policy runs before the compiler, on the CPU backend too.
    attack = (HOSTILE / "include_quoted_reference.cu").read_text()
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("hi"), kernel_cell("naive", attack)])
    path = tmp_path / "mallory.ipynb"
    nbformat.write(notebook, path)
    result = grade_notebook(path, "mallory", GradeOptions(backend="cpu", quick=True))
    naive = next(stage for stage in result.stages if stage.stage == "naive")
    assert naive.status is Status.COMPILE_ERROR and naive.points.total == 0
    # The kernel string opens on line 1 of the cell and its first line is empty: the #include is on cell line 4.
    assert naive.compiler[0].line == 4 and "quoted #include" in naive.message
    assert "shuffle.cu" not in naive.message


def test_plain_words_that_name_host_functions_are_legal_names_in_a_kernel() -> None:
    # read, write, remove, stat, link, signal, section: a kernel may name its own things so. Calls to the host
    # functions of those names are stopped by the link-time check and the sandbox (test_sandbox.py).
    text = (
        "__device__ float read(const float *p, unsigned int i, unsigned int n) { return i < n ? p[i] : 0.0f; }\n"
        "__global__ void reduce_naive(const float *g_in, float *g_out, unsigned int n)\n{\n"
        "    extern __shared__ float sdata[];\n"
        "    unsigned int tid = threadIdx.x, section = blockIdx.x, write = tid, signal = 0, remove = 0, stat = 0;\n"
        "    sdata[write] = read(g_in, section * blockDim.x + tid, n) + signal + remove + stat;\n}\n"
    )
    assert source_problems(text) == []


def test_plain_words_that_name_math_functions_are_legal_names_and_exact_math_is_legal() -> None:
    # A max2d kernel's corners (x0, y0, y1), a count of rounds (log), a norm: names; fmaxf, fabsf, sqrtf, fmaf and
    # floorf compute the same bits on a GPU as on the CPU analysis, and an #if on the architecture is asked of both
    # compilers. Calls of what does not compute the same are refused.
    text = (
        "__global__ void max2d(const float *g_in, float *g_out, unsigned int width, unsigned int height)\n{\n"
        "    unsigned int x0 = 2 * threadIdx.x, y0 = 2 * threadIdx.y, y1 = y0 + 1, log = 0, clock = 0;\n"
        "    float norm = fabsf(sqrtf(fmaf(1.0f, 2.0f, floorf(0.5f))));\n"
        "    g_out[0] = fmaxf(g_in[y0 * width + x0], g_in[y1 * width + x0]) + norm + log + clock;\n"
        "#if __CUDA_ARCH__ >= 700\n    __syncwarp();\n#endif\n}\n"
    )
    assert source_problems(text) == []
    for call in ("log(2.0f)", "powf(2.0f, 3.0f)", "__sinf(1.0f)", "rsqrtf(2.0f)", "clock()", "__builtin_expf(1.0f)"):
        refused = source_problems(text.replace("+ norm", f"+ {call}"))
        assert [line for line, _ in refused] == [5] and "a GPU computes it otherwise" in refused[0][1], call


PLATFORM_WAYS = {
    "in parentheses": "float g = (exp)(10.3f);",
    "called on the next line": "float g = exp\n        (10.3f);",
    "through a pointer": "float (*f)(float) = exp; float g = f(10.3f);",
    "through a macro": "float g = CALL(exp, 10.3f);",
    "as an argument": "float g = apply(exp, 10.3f);",
    "a name declared in another scope": "{ float exp = 1.0f; (void)exp; } float g = exp(10.3f);",
    "a version in code": "float g = __CUDA_ARCH__;",
    "a version through a macro": "float g = ARCH;",
}


@pytest.mark.parametrize("way", PLATFORM_WAYS)
def test_a_platform_dependent_function_or_version_is_refused_however_it_is_reached(way: str) -> None:
    text = (
        "#define CALL(f, x) f(x)\n#define ARCH (__CUDA_ARCH__ + 0)\n"
        "__device__ float apply(float (*f)(float), float x) { return f(x); }\n"
        "__global__ void reduce_naive(const float *g_in, float *g_out, unsigned int n)\n{\n"
        f"    {PLATFORM_WAYS[way]}\n    g_out[0] = g;\n}}\n"
    )
    refused = source_problems(text)
    assert refused and all(line in (6, 7) for line, _ in refused), refused
    reasons = ("is refused: a GPU computes it otherwise", "is refused outside #if")
    assert any(reason in why for _, why in refused for reason in reasons)


def test_names_a_cell_declares_as_its_own_are_not_the_math_functions() -> None:
    text = (
        "struct Totals { float log; };\n"
        "__device__ float norm(float v) { return v < 0 ? -v : v; }\n"
        "__global__ void max2d(const float *g_in, float *g_out, unsigned int width, unsigned int height)\n{\n"
        "    unsigned int x0 = 2 * threadIdx.x, y0 = 2 * threadIdx.y, y1 = y0 + 1, exp = 0;\n"
        "    Totals t; t.log = norm(g_in[y0 * width + x0]);\n"
        "    g_out[0] = fmaxf(t.log, g_in[y1 * width + x0]) + exp;\n}\n"
    )
    assert source_problems(text) == []


def test_a_kernel_with_c_linkage_is_legal_and_a_c_declaration_is_not() -> None:
    kernel = 'extern "C" __global__ void reduce_naive(const float *g_in, float *g_out, unsigned int n) {}\n'
    assert source_problems(kernel) == []
    assert any("C linkage" in text for _, text in source_problems('extern "C" float helper(float x);\n'))


@pytest.mark.parametrize("ending", ["", "\n", "\\\n", "\\"], ids=["no-line-end", "line-end", "splice", "backslash"])
def test_the_last_line_is_checked_however_it_ends(ending: str) -> None:
    (message,) = refusal('int x;\nstatic int pwned = system("id");' + ending).messages
    assert message.line == 2 and "`system` is refused" in message.text
