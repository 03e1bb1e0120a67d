"""The source policy: what a kernel cell's CUDA C may hold, checked before any compiler sees it, on both backends.

A kernel computes its result from its input. It has no use for files, processes, the environment, the network,
inline assembly, code that runs when its library is loaded, the grader's runtime (names starting with `ag_`,
`__ag_` or `AG_`), the race checker's controls, or headers other than the C/C++ and CUDA toolkit ones. Each of
those is refused here, with the cell line, what was refused, why, and what to do. This is a first fence, not the
trust boundary: a hand-in that gets past it is still compiled and run inside the sandbox.

The check reads the source as the compiler's preprocessor does: trigraphs are refused, line splices
(backslash-newline) are joined, comments and literals are skipped, and digraphs (`%:`, `<:`) are read as the
punctuators they stand for. Token pasting (`##`), universal character names and raw strings are refused, so every
identifier the compiler will see is spelled out in the source and checked here, also inside `#define`s and
`#if 0` blocks. Messages name at most the offending token, never more of the source.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from autograder.errors import CompileError
from autograder.records import CompilerMessage, KernelSource

MAX_SOURCE_CHARS = 100_000
MAX_MESSAGES = 20
SHOWN_CHARS = 40  # at most this much of an offending token is quoted in a message
MAX_ATTRIBUTE_TOKENS = 64  # an allowed __attribute__((...)) is short; a longer one is refused unread

# Headers found through angle brackets in the C/C++ library and the CUDA toolkit; nothing else is included.
ALLOWED_HEADERS = frozenset(
    {
        "cuda.h",
        "cuda_runtime.h",
        "cuda_runtime_api.h",
        "device_launch_parameters.h",
        "math_constants.h",
        "cooperative_groups.h",
        "cooperative_groups/reduce.h",
        "cuda_fp16.h",
        "cuda_bf16.h",
        "cstdio",
        "stdio.h",
        "cmath",
        "math.h",
        "climits",
        "limits.h",
        "cfloat",
        "float.h",
        "cstdint",
        "stdint.h",
        "cstddef",
        "stddef.h",
        "cassert",
        "assert.h",
        "cstring",
        "string.h",
        "limits",
        "type_traits",
    }
)

# Directives allowed besides #include, #define/#undef and #pragma (checked on their own).
_PLAIN_DIRECTIVES = frozenset(
    {"if", "ifdef", "ifndef", "elif", "elifdef", "elifndef", "else", "endif", "error", "warning"}
)
_ALLOWED_PRAGMAS = frozenset({"unroll", "nounroll", "once"})
# __attribute__((...)) may name only these (with or without surrounding underscores).
_ALLOWED_ATTRIBUTES = frozenset({"aligned", "packed", "unused", "always_inline", "noinline"})

_RESERVED = re.compile(r"_*ag(?:_|$)", re.IGNORECASE)  # the grader's runtime: ag_, __ag_, AG_, namespace ag
_CUDA_BUILTINS = frozenset({"threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize", "dim3", "uint3"})

# Names refused wherever they appear, by what they do. A name is compared without its leading and trailing
# underscores and without a `__builtin_` or `__libc_` prefix, so `__builtin_fork` and `__libc_system` count too.
_WHY = {
    "process": "starts, signals or controls host processes and threads",
    "control": "leaves the kernel by a jump or ends the grader's process",
    "stack": "reaches the grader's call stack",
    "file": "reads or writes host files, or the grader's own input and output",
    "loader": "maps memory or loads code",
    "environment": "reads or changes the grader's environment",
    "network": "opens network connections",
    "checker": "reaches the race checker's instrumentation",
    "attribute": "is an attribute that runs code at load time, renames symbols or turns the race checker off",
}
_HOST_NAMES = {
    "process": r"system|popen|pclose|v?fork|clone3?|exec[lv]\w*|fexecve|posix_spawnp?|(?:tg|t)?kill|killpg|ptrace"
    r"|prctl|daemon|setsid|set[ug]id|sete[ug]id|setre[ug]id|setres[ug]id|waitpid|waitid|sigaction|sigqueue"
    r"|setitimer|pthread_\w+|thrd_create|syscall",
    "control": r"exit|quick_exit|Exit|atexit|at_quick_exit|on_exit|abort|terminate|setjmp|longjmp|sigsetjmp"
    r"|siglongjmp|[gs]etcontext|makecontext|swapcontext",
    "stack": r"frame_address|return_address|extract_return_addr|frob_return_addr|apply_args|eh_return|dwarf_cfa"
    r"|unwind_init",
    # Not the plain words a kernel may use as names (read, write, remove, stat, link, dup, pipe, puts): the sandbox
    # and the link-time check stop those calls, and refusing the words would refuse legal kernels.
    "file": r"f?open(?:64)?|openat(?:2|64)?|creat(?:64)?|fdopen|freopen(?:64)?|tmpfile(?:64)?|tmpnam(?:_r)?|tempnam"
    r"|mk[o]?stemps?|mkdtemp|rename(?:at2?)?|unlink(?:at)?|rmdir|mkdir(?:at)?|f?chdir|chroot"
    r"|f?chmod(?:at)?|[lf]?chown(?:at)?|symlink(?:at)?|readlink(?:at)?|f?truncate(?:64)?|pread(?:64)?"
    r"|pwrite(?:64)?|p?readv2?|p?writev2?|sendfile(?:64)?|dup[23]|pipe2|ioctl|fcntl|fwrite|fread|fputs|fputc"
    r"|v?fprintf|v?dprintf|fscanf|fgets|fgetc|gets|scanf|fflush|stdin|stdout|stderr|setv?buf"
    r"|f?opendir|readdir|scandir|[fl]stat(?:64|at)?|stat(?:64|at|x|vfs)|realpath|getcwd|memfd_create|shm_open"
    r"|shm_unlink|mkfifo(?:at)?|mknod(?:at)?|inotify_\w+",
    "loader": r"mmap(?:64)?|munmap|mremap|mprotect|pkey_mprotect|madvise|s?brk|dl(?:open|mopen|sym|vsym|close|error"
    r"|addr1?|info|_iterate_phdr)|process_vm_\w+",
    "environment": r"(?:secure_)?getenv|setenv|putenv|unsetenv|clearenv|environ|program_invocation_\w+|getauxval",
    "network": r"socket(?:pair)?|connect|bind|listen|accept4?|send(?:to|msg|mmsg)?|recv(?:from|msg|mmsg)?"
    r"|getaddrinfo|gethostbyname\w*",
    "checker": r"(?:tsan|asan|msan|ubsan|lsan|hwasan|sanitizer|gcov|llvm_profile)_\w*|Annotate\w*",
    "attribute": r"constructor|destructor|init_priority|ifunc|weakref|symver|externally_visible"
    r"|no_sanitize\w*|no_instrument_function|disable_sanitizer_instrumentation",
}
_HOST_PATTERNS = {category: re.compile(pattern) for category, pattern in _HOST_NAMES.items()}
# Symbols of the program's start-up, compared as written.
_STARTUP = re.compile(r"main|_init|_fini|__dso_handle|__libc_start_main|__gmon_start__|__cxa_\w+")

_ASM = frozenset({"asm", "_asm", "__asm", "__asm__"})
_PRAGMA_OPERATORS = frozenset({"_Pragma", "__pragma"})
_PROBES = frozenset(
    {
        *("__has_include", "__has_include__", "__has_include_next", "__has_include_next__"),
        *("__FILE__", "__BASE_FILE__", "__FILE_NAME__", "__TIMESTAMP__"),
    }
)
_ATTRIBUTE_KEYWORDS = frozenset({"__attribute__", "__attribute"})

_SPLICE = re.compile(r"\\[ \t\f\v]*\n")
_BAD_CHARACTER = re.compile(r"[\x00-\x08\x0e-\x1f\x7f\r\ud800-\udfff]|\?\?[=/'()!<>\-]")
_TOKEN = re.compile(
    r"""
      (?P<space>[ \t\f\v]+)
    | (?P<newline>\n)
    | (?P<comment>//[^\n]*|/\*.*?\*/)
    | (?P<open_comment>/\*)
    | (?P<raw>(?:u8|u|U|L)?R")
    | (?P<string>(?:u8|u|U|L)?"(?:[^"\\\n]|\\.)*")
    | (?P<char>(?:u8|u|U|L)?'(?:[^'\\\n]|\\.)*')
    | (?P<open_literal>(?:u8|u|U|L)?["'])
    | (?P<number>\.?[0-9](?:[eEpP][+-]|'?[A-Za-z0-9_.])*)
    | (?P<identifier>[A-Za-z_$][A-Za-z0-9_$]*)
    | (?P<punct>%:%:|\#\#|%:|<:|:>|<%|%>|::|[-+*/%<>=!&|^~?:;,.()\[\]{}\#])
    | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)
_HASH = frozenset({"#", "%:"})
_PASTE = frozenset({"##", "%:%:"})
_OPEN = {"(": ")", "[": "]", "<:": ":>", "{": "}", "<%": "%>"}
_INCLUDE_LINE = re.compile(r"[ \t\f\v]*<([A-Za-z0-9_./]+)>[ \t\f\v]*(?:/\*.*?\*/[ \t\f\v]*)*(?://.*)?")

Problem = tuple[int, str]  # (line of the kernel source, message)


@dataclass(frozen=True)
class _Token:
    kind: str  # identifier, number, string, char, punct, newline
    text: str
    line: int  # line of the kernel source, 1-based
    end: int  # offset just past the token in the spliced text


def check_source(source: KernelSource) -> None:
    """Raise CompileError, with a message per refused construct on its notebook cell line, unless `source` keeps
    to the policy."""
    problems = source_problems(source.text)
    if not problems:
        return
    messages = tuple(CompilerMessage("error", source.cell_line(line), text) for line, text in problems)
    first = messages[0]
    where = f"line {first.line}: " if first.line is not None else ""
    raise CompileError(f"refused before compiling: {where}{first.text}", messages)


def source_problems(text: str) -> list[Problem]:
    """What `text` holds against the policy, in source order (at most MAX_MESSAGES); empty when it keeps to it."""
    if len(text) > MAX_SOURCE_CHARS:
        return [(1, f"the kernel is {len(text)} characters long, more than the {MAX_SOURCE_CHARS} accepted; "
                    "a reduction kernel is far shorter: remove what it does not need")]
    text = text.replace("\r\n", "\n")
    problems = _character_problems(text)
    if not problems:
        logical, lines = _splice(text)
        tokens, problems = _lex(logical, lines)
        problems += _token_problems(tokens, logical)
    unique = list(dict.fromkeys(problems))
    return sorted(unique, key=lambda problem: problem[0])[:MAX_MESSAGES]


def _shown(token: str) -> str:
    return token if len(token) <= SHOWN_CHARS else token[:SHOWN_CHARS] + "..."


def _character_problems(text: str) -> list[Problem]:
    """Characters that would make the compiler read the source otherwise than this check does."""
    problems = []
    for match in _BAD_CHARACTER.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        found = match.group()
        if found.startswith("??"):
            message = (f"the trigraph `{found}` is refused: some compilers read it as another character, which could "
                       "hide code from this check; write the character itself")
        elif "\ud800" <= found <= "\udfff":
            message = "the kernel holds a character that is not valid Unicode (a lone surrogate); delete it"
        else:
            message = (f"the control character U+{ord(found):04X} is refused: the compiler may read it as a line "
                       "break or skip it; delete it")
        problems.append((line, message))
        if len(problems) == MAX_MESSAGES:
            break
    return problems


def _splice(text: str) -> tuple[str, list[int]]:
    """`text` with every backslash-newline removed, as the compiler joins lines, and the source line of each of
    its characters."""
    kept: list[str] = []
    lines: list[int] = []
    line, position = 1, 0
    for match in [*_SPLICE.finditer(text), None]:
        end = match.start() if match else len(text)
        for character in text[position:end]:
            kept.append(character)
            lines.append(line)
            line += character == "\n"
        if match:
            line += 1
            position = match.end()
    return "".join(kept), lines


def _lex(logical: str, lines: Sequence[int]) -> tuple[list[_Token], list[Problem]]:
    """The preprocessing tokens of the spliced text, less whitespace and comments, with a token per line end."""
    tokens: list[_Token] = []
    problems: list[Problem] = []
    for match in _TOKEN.finditer(logical):
        kind, text, line = match.lastgroup or "other", match.group(), lines[match.start()]
        if kind in ("space", "comment"):
            continue
        if kind == "open_comment":
            problems.append((line, "a /* comment is never closed; close it with */"))
            break
        if kind == "open_literal":
            problems.append((line, "a string or character literal is not closed on its line; close it"))
            break
        if kind == "raw":
            problems.append((line, "raw string literals (R\"...\") are refused: the compiler reads them before "
                                   "joining lines, so they could hide code from this check; use a plain string"))
            break
        if kind == "other":
            if text == "\\":
                problems.append((line, "a backslash outside a string or character literal is refused (universal "
                                       "character names can spell refused names); write names in plain ASCII"))
            elif not text.isascii():
                problems.append((line, f"the character U+{ord(text):04X} outside comments and strings is refused: "
                                       "write code in plain ASCII (comments and strings may hold any text)"))
            continue
        tokens.append(_Token(kind, text, line, match.end()))
    return tokens, problems


def _logical_lines(tokens: list[_Token]) -> list[list[_Token]]:
    rows: list[list[_Token]] = [[]]
    for token in tokens:
        if token.kind == "newline":
            rows.append([])
        else:
            rows[-1].append(token)
    return [row for row in rows if row]


def _token_problems(tokens: list[_Token], logical: str) -> list[Problem]:
    problems: list[Problem] = []
    for row in _logical_lines(tokens):
        if row[0].text in _HASH:
            problems += _directive_problems(row, logical)
        else:
            problems += _code_problems(row, in_define=False)
        if len(problems) >= MAX_MESSAGES:
            break  # enough to act on; a flood of problems must not cost the grader time
    return problems


def _directive_problems(row: list[_Token], logical: str) -> list[Problem]:
    line = row[0].line
    if len(row) == 1:
        return []  # the null directive
    name = row[1]
    if name.kind != "identifier":
        return [(line, "a `#` line that is no directive (a line marker, say) is refused: only #include <...>, "
                       "#define, #undef, #if/#ifdef/#else/#endif and #pragma unroll are allowed")]
    directive = name.text
    if directive == "include":
        return _include_problems(line, logical[name.end : _line_end(logical, name.end)])
    if directive in ("define", "undef"):
        problems = _macro_name_problems(row, directive)
        return problems + _code_problems(row[2:], in_define=directive == "define")
    if directive == "pragma":
        if len(row) < 3 or row[2].text not in _ALLOWED_PRAGMAS:
            return [(line, "this #pragma is refused: pragmas change how the compiler builds and checks the kernel; "
                           "only #pragma unroll (and nounroll, once) are allowed")]
        return _code_problems(row[3:], in_define=False)
    if directive in _PLAIN_DIRECTIVES:
        return _code_problems(row[2:], in_define=False)
    return [(line, f"`#{_shown(directive)}` is refused: only #include <...>, #define, #undef, "
                   "#if/#ifdef/#else/#endif and #pragma unroll are allowed in a kernel cell; remove it")]


def _line_end(logical: str, start: int) -> int:
    end = logical.find("\n", start)
    return len(logical) if end < 0 else end


def _include_problems(line: int, rest: str) -> list[Problem]:
    match = _INCLUDE_LINE.fullmatch(rest)
    if match is None:
        operand = rest.lstrip(" \t\f\v")
        form = "this #include"
        if operand.startswith('"'):
            form = "a quoted #include"
        elif re.match(r"[A-Za-z_]", operand):
            form = "an #include through a macro"
        return [(line, f"{form} is refused: a kernel cell may include only C/C++ and CUDA toolkit headers, by "
                       "angle brackets (#include <cuda_runtime.h>); paste your own helpers into the cell")]
    header = match.group(1)
    if header not in ALLOWED_HEADERS:
        return [(line, f"#include <{_shown(header)}> is refused: a kernel cell may include only these headers: "
                       + ", ".join(sorted(ALLOWED_HEADERS)))]
    return []


def _macro_name_problems(row: list[_Token], directive: str) -> list[Problem]:
    line = row[0].line
    if len(row) < 3 or row[2].kind != "identifier":
        return [(line, f"#{directive} must name a macro")]
    name = row[2].text
    if name.startswith("__") or re.match(r"_[A-Z]", name) or name in _CUDA_BUILTINS:
        return [(line, f"#{directive} {_shown(name)} is refused: the name belongs to the compiler or CUDA, and "
                       "redefining it changes what the grader checks; give your macro a name of your own")]
    return []


def _code_problems(row: list[_Token], in_define: bool) -> list[Problem]:
    """Problems of the tokens of one line of code, or of a directive's operands (a #define's body)."""
    problems: list[Problem] = []
    for index, token in enumerate(row):
        after = row[index + 1] if index + 1 < len(row) else None
        if _c_linkage_kernel(row, index):
            continue  # `extern "C" __global__`: a kernel with C linkage, which PyCUDA's tutorials write
        if token.text in _PASTE:
            problems.append((token.line, "token pasting (##) is refused: it can build names this check would "
                                         "refuse; write names out in full"))
        elif token.text in _HASH and not in_define:
            problems.append((token.line, "a stray `#` is refused: `#` starts a directive only at the start of a line"))
        elif token.kind == "identifier":
            message = _identifier_problem(token.text, after)
            if message is None and token.text in _ATTRIBUTE_KEYWORDS:
                message = _attribute_problem(row, index)
            if message is not None:
                problems.append((token.line, message))
    return problems


def _c_linkage_kernel(row: list[_Token], index: int) -> bool:
    """Whether row[index] is the `extern` of `extern "C" __global__`."""
    return [token.text for token in row[index : index + 3]] == ["extern", '"C"', "__global__"]


def _identifier_problem(name: str, after: _Token | None) -> str | None:
    shown = _shown(name)
    if _RESERVED.match(name):
        return (f"`{shown}` is refused: names starting with ag_, __ag_ or AG_ belong to the grader's runtime; "
                "rename it")
    if name in _ASM:
        return (f"`{shown}` is refused: inline assembly runs outside what the grader can check; write the kernel "
                "in CUDA C")
    if name in _PRAGMA_OPERATORS:
        return (f"`{shown}` is refused: pragmas change how the compiler builds and checks the kernel; only "
                "`#pragma unroll` is allowed")
    if name in _PROBES:
        return f"`{shown}` is refused: it reveals the grader's files or build paths; remove it"
    if name == "__declspec":
        return f"`{shown}` is refused: it is not CUDA; remove it"
    if name == "extern" and (after is None or after.text != "__shared__"):
        if after is not None and after.kind == "string":
            return ('`extern "C"` is refused here: only a `__global__` kernel may have C linkage; a kernel cell '
                    "declares nothing of the C library")
        return ("`extern` is refused here: it declares something defined elsewhere (the grader's runtime or the C "
                "library); a kernel cell uses it only as `extern __shared__`")
    if name == "operator" and after is not None and after.text in ("new", "delete"):
        return (f"`operator {after.text}` is refused: replacing the allocator changes the grader's own memory; "
                "remove it")
    if _STARTUP.fullmatch(name):
        return f"`{shown}` is refused: it is a symbol of the program's start-up, not of a kernel; rename it"
    category = _host_category(name)
    if category is not None:
        return (f"`{shown}` is refused: it {_WHY[category]}, which kernel code has no use for; if it is a name of "
                "your own, rename it")
    return None


def _host_category(name: str) -> str | None:
    bare = name.removeprefix("__builtin_").strip("_")
    bare = bare.removeprefix("libc_").strip("_")
    return next((category for category, pattern in _HOST_PATTERNS.items() if pattern.fullmatch(bare)), None)


def _attribute_problem(row: list[_Token], index: int) -> str | None:
    """Why the __attribute__ at `row[index]` is refused: it must be `__attribute__((name, ...))` on one line, each
    name allowed."""
    refused = (f"`{row[index].text}` is refused unless it is __attribute__((...)) on one line with only these "
               f"attributes: {', '.join(sorted(_ALLOWED_ATTRIBUTES))}; remove it")
    window = row[index + 1 : index + 1 + MAX_ATTRIBUTE_TOKENS]
    close = _group(window, 0)
    if close is None or window[0].text != "(" or window[1].text != "(" or _group(window, 1) != close - 1:
        return refused
    for item in _split_commas(window[2 : close - 1]):
        if not item:
            continue
        if item[0].kind != "identifier" or item[0].text.strip("_") not in _ALLOWED_ATTRIBUTES:
            return refused
        if len(item) > 1 and _group(item, 1) != len(item) - 1:
            return refused
    return None


def _group(row: list[_Token], start: int) -> int | None:
    """The index of the token closing the bracket that opens at `row[start]`, or None when it is not closed."""
    if start >= len(row) or row[start].text not in _OPEN:
        return None
    depth = 0
    for position in range(start, len(row)):
        text = row[position].text
        if text in _OPEN:
            depth += 1
        elif text in _OPEN.values():
            depth -= 1
            if depth == 0:
                return position
    return None


def _split_commas(tokens: list[_Token]) -> list[list[_Token]]:
    items: list[list[_Token]] = [[]]
    depth = 0
    for token in tokens:
        if token.text in _OPEN:
            depth += 1
        elif token.text in _OPEN.values():
            depth -= 1
        if token.text == "," and depth == 0:
            items.append([])
        else:
            items[-1].append(token)
    return items
