"""A student's GPU stages compiled by one nvcc run, each exactly as it compiles alone, or else alone.

Most of what nvcc costs a kernel is fixed: `gcc -E` and cicc reading the host headers of `cuda_runtime.h`, about
0.25 s of a core for any kernel (bench/nvcc_batch.py). A student's stages in one run cost that once.

Each stage goes into a namespace of its own (`ag_<stage>`), its text starting again at line 1 of a file of its
own (`kernel_<stage>.cu`, by which nvcc's messages are told apart; a batched stage cannot ask its file's name),
and each macro it defines is put back as it was after it (`#pragma push_macro`, `pop_macro`). What a namespace could
change, and how each is ruled out (a stage that is not ruled in is compiled alone):

- **Names.** A name a stage declares in its namespace hides a global one of the same name (a header's `max`),
  where alone it would add an overload or clash. Every identifier a stage spells outside braces is declared a
  namespace after the last stage (`namespace max {}`): that fails wherever the headers declare the name, and
  the batch is not used. Names a stage declares at namespace scope from inside braces are probed too: those
  of `extern __shared__`, the name after every `struct`, `class` and `union` (in a class's body it declares a
  class of the namespace), and every name where a block-scope function declaration could declare it (`int
  fminf(float);` in a function is the namespace's `fminf`: `_declarator`); `friend`, `enum`, `using`, another
  `extern` and an anonymous union at namespace scope are refused; a stage's macros hold no identifier or brace
  (two red teams found the ways in). A header's namespace (`std`) would not make that declaration fail, so a
  stage spelling one is compiled alone; so is one spelling such a name that starts with `_` (reserved: the
  compiler's own names and builtins).
- **Qualified names** (`::`, `namespace`) and what tells a function's namespace or its file
  (`__PRETTY_FUNCTION__`, `__FILE__`, ...): refused.
- **The preprocessor.** No directive but `#define` of a macro whose replacement holds no identifier, brace or
  `#`, and `#pragma unroll` with at most a number: no includes, conditionals or `#undef` that could reach
  another stage. Every parenthesis and bracket a stage or a macro opens, it closes: a macro's call cannot run
  past the stage's end.
- **Printing.** A kernel that names `printf` is compiled alone: compute-sanitizer runs any module that can
  print alone (autograder.sanitizer.can_print), and a batch holds every stage's code.
- **What the compiler says.** A stage that nvcc says anything about (an error or a warning in its file, or a
  probe of a name it spells) is compiled alone, so it gets its own messages on its own lines, and the rest are
  tried once more; a message about no stage (a ptxas warning) sends every stage alone.
- **The module.** The cubin is loaded once per stage, as each stage's own was; one with more than
  `GLOBAL_BYTES` of device variables is not used, and a stage whose kernel is not in it is compiled alone.

Not ruled out: a kernel's `__device__` variables lie at other addresses in a batch's module than in its own,
as they do between a GPU and the CPU analysis's build (a kernel that tells them by an address: README,
"Not closed").

A stage's Build then holds the batch's cubin and, in `details["symbols"]`, its kernel's symbol in the
namespace, which the GPU backend looks it up by.
"""

from __future__ import annotations

import io
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from autograder import errors
from autograder.backends.gpu import NVCC_SECONDS, nvcc_cubin
from autograder.build import defined_symbols
from autograder.policy import token_rows
from autograder.records import Build, KernelSource
from autograder.sandbox import Sandbox
from autograder.stages import Stage

GLOBAL_BYTES = 1 << 20  # device variables a batch's cubin may hold, loaded once per stage

# Refused anywhere in a batched stage (see the module's docstring).
_REFUSED = frozenset({
    "namespace", "::", "using", "friend", "enum", "printf", "vprintf", "__PRETTY_FUNCTION__", "__FUNCSIG__",
    "__COUNTER__", "__FILE__", "__BASE_FILE__", "__FILE_NAME__", "__INCLUDE_LEVEL__", "__builtin_FILE",
    "__builtin_FUNCTION",
})
# Spelled outside braces without declaring a name there: keywords, and the CUDA keywords' macros.
_KEYWORDS = frozenset({
    "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch",
    "char", "char8_t", "char16_t", "char32_t", "class", "compl", "concept", "const", "consteval", "constexpr",
    "constinit", "const_cast", "continue", "decltype", "default", "delete", "do", "double", "dynamic_cast",
    "else", "explicit", "export", "extern", "false", "float", "for", "goto", "if", "inline", "int", "long",
    "mutable", "new", "noexcept", "not", "not_eq", "nullptr", "operator", "or", "or_eq", "private", "protected",
    "public", "register", "reinterpret_cast", "requires", "return", "short", "signed", "sizeof", "static",
    "static_assert", "static_cast", "struct", "switch", "template", "this", "thread_local", "throw", "true",
    "try", "typedef", "typeid", "typename", "union", "unsigned", "virtual", "void", "volatile", "wchar_t",
    "while", "xor", "xor_eq", "__attribute__", "__restrict__", "__restrict", "__inline__", "__volatile__",
    "__global__", "__device__", "__host__", "__shared__", "__constant__", "__managed__", "__forceinline__",
    "__noinline__", "__launch_bounds__", "__align__", "__grid_constant__",
})


@dataclass(frozen=True)
class Plan:
    """What a stage needs in a batch: the macros it defines, and the names it spells outside braces."""

    macros: tuple[str, ...]
    names: frozenset[str]


def plan(text: str) -> Plan | None:
    """The stage's Plan, or None where it must be compiled alone."""
    rows = token_rows(text)
    if rows is None:
        return None
    macros: list[str] = []
    code: list[tuple[str, str]] = []
    for row in rows:
        spelled = [spelling for _, spelling in row]
        if spelled[0] != "#":
            code += row
        elif spelled[1:3] == ["pragma", "unroll"]:
            if len(row) > 4 or (len(row) == 4 and row[3][0] != "number"):
                return None  # an operand other than a number could ask what tells a batch apart
        elif spelled[1:2] == ["define"] and len(row) > 2 and row[2][0] == "identifier" and _inert(row[3:]):
            macros.append(spelled[2])
        else:
            return None
    names = _names(code)
    return None if names is None else Plan(tuple(dict.fromkeys(macros)), names)


def _inert(body: list[tuple[str, str]]) -> bool:
    """Whether a macro's replacement can neither declare nor open anything: no names or braces, and its
    parentheses and brackets closed (a macro call cannot reach past the stage's end)."""
    opening = any(kind == "identifier" or spelling in ("{", "}", "#", "##") for kind, spelling in body)
    return _closed(body) and not opening


def _closed(tokens: list[tuple[str, str]]) -> bool:
    opened = []
    for _, spelling in tokens:
        if spelling in _PAIRS:
            opened.append(_PAIRS[spelling])
        elif spelling in _PAIRS.values() and (not opened or opened.pop() != spelling):
            return False
    return not opened


def _names(code: list[tuple[str, str]]) -> frozenset[str] | None:
    """Every name the stage's code could declare at namespace scope, or None where it must be compiled alone:
    the identifiers outside braces, those of an `extern __shared__` declaration, and the name after every
    `struct`, `class` or `union` (in a class's body it declares a class of the namespace)."""
    if not _closed(code):
        return None
    names: set[str] = set()
    opened: list[str] = []
    in_extern: int | None = None  # the nesting of an `extern __shared__` whose `;` is still to come
    tag: tuple[str, int] | None = None  # a struct, class or union keyword whose name is still to come, and its nesting
    for index, (kind, spelling) in enumerate(code):
        if spelling in _REFUSED or kind in ("other", "unclosed"):
            return None
        if spelling == "extern":
            if code[index + 1 : index + 2] != [("identifier", "__shared__")]:
                return None
            in_extern = len(opened)
        elif spelling in ("struct", "class", "union"):
            tag = spelling, len(opened)
        elif tag is not None and tag[1] == len(opened) and (spelling in _TAG_ENDS or kind == "identifier"):
            if spelling == "{" and tag[0] == "union" and "{" not in opened:
                return None  # an anonymous union's members are the namespace's names
            if kind == "identifier" and spelling not in _KEYWORDS:
                names.add(spelling)
            if kind != "identifier" or spelling not in _KEYWORDS:
                tag = None
        if kind == "identifier" and spelling not in _KEYWORDS and ("{" not in opened or in_extern is not None
                                                                   or _declarator(code, index)):
            names.add(spelling)
        if spelling == ";" and in_extern == len(opened):
            in_extern = None
        elif spelling in _PAIRS:
            opened.append(spelling)
        elif spelling in _PAIRS.values():
            opened.pop()
    if any(name.startswith("_") for name in names):
        return None  # reserved: the compiler's own names and builtins
    return frozenset(names)


def _declarator(code: list[tuple[str, str]], index: int) -> bool:
    """Whether the identifier at `index`, inside braces, may be the name of a block-scope function declaration,
    which declares a member of the namespace (red team): `int fminf(float, float);`, `int (fminf)(float);`, or,
    where the type could be a function type, `F fminf;` or `decltype(g) fminf;`. Told by the token before it,
    past `*`, `&`, `(` and cv-qualifiers: a type keyword with `(` or `)` after the name, a name that starts no
    statement or expression (where no `(` came between: `f(g(x))` is a call), `>`, or the `)` of `decltype(...)`.
    A name followed by `.` or `->` is an object's. Seen more often than declared (`a * fminf(x)`), which costs
    only the batch."""
    if code[index + 1 : index + 2] in ([("punct", ".")], [("punct", "->")]):
        return False
    before, parenthesised = index - 1, False
    while before >= 0 and code[before][1] in ("*", "&", "&&", "(", "const", "volatile", "__restrict__", "__restrict"):
        parenthesised |= code[before][1] == "("
        before -= 1
    if before < 0:
        return False
    kind, spelling = code[before]
    if spelling == ")":
        depth = 0
        for opening in range(before, -1, -1):
            depth += {")": 1, "(": -1}.get(code[opening][1], 0)
            if depth == 0:
                return opening > 0 and code[opening - 1][1] in _TYPE_OPERATORS
        return False
    if (kind != "identifier" and spelling != ">") or spelling in _STATEMENT_WORDS:
        return False
    if before > 0 and code[before - 1][1] in (".", "->"):
        return False  # a member (`blockIdx.x * blockDim.x`): an expression
    if spelling in _KEYWORDS:  # int, float, unsigned, auto, ...: a function only where a parameter list follows
        return code[index + 1 : index + 2] in ([("punct", "(")], [("punct", ")")])
    return not parenthesised


_STATEMENT_WORDS = frozenset({"if", "while", "for", "switch", "return", "case", "goto", "else", "do", "throw",
                              "sizeof", "alignof", "new", "delete", "not", "and", "or", "bitand", "bitor", "xor",
                              "compl", "and_eq", "or_eq", "xor_eq", "not_eq", "typeid", "noexcept",
                              "static_assert", "decltype", "__typeof__", "__typeof", "typeof"})
_TYPE_OPERATORS = frozenset({"decltype", "__typeof__", "__typeof", "typeof", "__decltype"})
_PAIRS = {"(": ")", "[": "]", "{": "}"}
_TAG_ENDS = frozenset({"{", ";", ",", ")", "]"})  # after struct, class or union: no name comes (an anonymous one)


def namespace_of(stage: Stage) -> str:
    return f"ag_{stage.id}"


def source(items: Sequence[tuple[Stage, str, Plan]]) -> str:
    """The batch: every stage in its namespace, its macros put back after it, then the names declared."""
    parts = []
    for stage, text, stage_plan in items:
        push = "".join(f'#pragma push_macro("{macro}")\n' for macro in stage_plan.macros)
        pop = "".join(f'#pragma pop_macro("{macro}")\n' for macro in stage_plan.macros)
        # Two line ends: a stage that ends in a backslash or a // comment cannot take the brace into its line.
        parts.append(f'{push}namespace {namespace_of(stage)} {{\n#line 1 "{file_of(stage)}"\n{text}\n\n}}\n{pop}')
    names = sorted(set().union(*(stage_plan.names for _, _, stage_plan in items)))
    return "".join(parts) + f'#line 1 "{PROBES}"\n' + "".join(f"namespace {name} {{}}\n" for name in names)


PROBES = "ag_probes.cu"  # the file the probes' lines are told by in nvcc's messages, a name a line


def file_of(stage: Stage) -> str:
    """The file a stage's lines are told by in a batch (nvcc's messages, the line table): one of its own."""
    return f"kernel_{stage.id}.cu"


def build_together(
    items: Sequence[tuple[Stage, KernelSource]], nvcc: str, arch: str, sandbox: Sandbox, options: tuple[str, ...]
) -> dict[str, Build]:
    """The Builds of those of `items` (stages that passed the source policy) that compiled in one batch, by stage;
    the rest must be compiled alone. A stage nvcc's messages are about (its own file's, or a probe's of a name it
    spells) is left out and the rest tried once more: one stage's mistake costs that stage its batch, not all."""
    header_names = header_namespaces(nvcc, arch, sandbox, options)
    if header_names is None:
        return {}
    planned = [
        (stage, kernel, stage_plan)
        for stage, kernel in items
        if (stage_plan := plan(kernel.text)) is not None and not stage_plan.names & header_names
    ]
    for _ in range(2):
        if len(planned) < 2:
            return {}
        text = source([(stage, kernel.text, stage_plan) for stage, kernel, stage_plan in planned])
        try:
            cubin, log = nvcc_cubin(KernelSource(text), nvcc, arch, sandbox, options)
        except errors.CompileError as error:
            cubin, log = b"", error.log
        except (errors.GraderError, OSError):  # each stage alone then gets its own error
            return {}
        if cubin and not log.strip():
            break
        named = _stages_named(log, text, planned)  # each compiled alone, with its own messages; the rest again
        if not named:
            return {}
        planned = [item for item in planned if item[0].id not in named]
    else:
        return {}
    if global_bytes(cubin) > GLOBAL_BYTES:
        return {}
    defined = defined_symbols(cubin)
    builds = {}
    for stage, kernel, _ in planned:
        symbol = stage.mangled_in(namespace_of(stage))
        if symbol in defined:
            builds[stage.id] = Build("gpu", stage.id, kernel, (), (("kernel.cubin", cubin),), {"symbols": (symbol,)})
    return builds


def _stages_named(log: str, text: str, planned: Sequence[tuple[Stage, KernelSource, Plan]]) -> set[str] | None:
    """The stages nvcc's messages are about: each message names a stage's own file, or a probe of a name the
    stage spells; None where a message is about neither (a ptxas warning, say: then no stage is batched). A
    stage can forge such a line (a `static_assert` message may hold a line end), but only to send stages alone:
    a batch is used only where nvcc says nothing at all."""
    names = [line.split()[1] for line in text[text.index(f'#line 1 "{PROBES}"\n') :].split("\n")[1:] if line]
    files = {file_of(stage): stage.id for stage, _, _ in planned}
    named = set()
    for line in log.splitlines():
        found = _DIAGNOSTIC.match(line)
        if found is None:
            if _NOT_A_DIAGNOSTIC.match(line):
                continue  # a message's source line, its caret or its context, nvcc's summary
            return None
        if found["file"] == PROBES and 0 < int(found["line"]) <= len(names):
            name = names[int(found["line"]) - 1]
            named |= {stage.id for stage, _, stage_plan in planned if name in stage_plan.names}
        elif found["file"] in files:
            named.add(files[found["file"]])
        else:
            return None
    return named


_DIAGNOSTIC = re.compile(r"(?P<file>[^\s(]+)\((?P<line>\d+)\): (?:catastrophic error|error|warning)\b")
_NOT_A_DIAGNOSTIC = re.compile(r"$|\s|Remark: |\d+ errors? detected in the compilation of ")


def header_namespaces(nvcc: str, arch: str, sandbox: Sandbox, options: tuple[str, ...]) -> frozenset[str] | None:
    """Every name the headers nvcc includes declare a namespace, read once a process from an empty kernel
    preprocessed as a stage is; None (no batch, and asked again next time) where that fails."""
    key = (nvcc, arch, sandbox, options)
    if key not in _HEADER_NAMESPACES:
        found = _header_namespaces(*key)
        if found is None:
            return None
        _HEADER_NAMESPACES[key] = found
    return _HEADER_NAMESPACES[key]


_HEADER_NAMESPACES: dict[tuple, frozenset[str]] = {}


def _header_namespaces(nvcc: str, arch: str, sandbox: Sandbox, options: tuple[str, ...]) -> frozenset[str] | None:
    with tempfile.TemporaryDirectory(prefix="autograder-batch-") as directory:
        folder = Path(directory)
        (folder / "kernel.cu").write_text("")
        argv = [nvcc, "--cubin", f"-arch={arch}", *options, "-E", "-o", "kernel.ii", "kernel.cu"]
        try:
            result = sandbox.run_tool(argv, folder, NVCC_SECONDS)
            text = (folder / "kernel.ii").read_text() if result.returncode == 0 else None
        except (errors.GraderError, OSError):
            text = None
    return None if text is None else frozenset(re.findall(r"\bnamespace\s+([A-Za-z_$][\w$]*)", text))


def global_bytes(cubin: bytes) -> int:
    """The bytes of device variables in a cubin (its .nv.global sections); all of them where it cannot be read."""
    try:
        elf = ELFFile(io.BytesIO(cubin))
        return sum(section["sh_size"] for section in elf.iter_sections() if section.name.startswith(".nv.global"))
    except (ELFError, ValueError, KeyError):
        return GLOBAL_BYTES + 1
