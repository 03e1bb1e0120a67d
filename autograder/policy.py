"""The source policy: what a kernel cell's CUDA C may hold, checked before any compiler sees it, on both backends.

A kernel computes its result from its input. It has no use for files, processes, the environment, the network,
inline assembly, code that runs when its library is loaded, the grader's runtime (names starting with `ag_`,
`__ag_` or `AG_`), the race checker's controls, or headers other than the C/C++ and CUDA toolkit ones. Each of
those is refused here, with the cell line, what was refused, why, and what to do. This is a first fence, not the
trust boundary: a hand-in that gets past it is still compiled and run inside the sandbox.

The check reads the source as the compilers' preprocessor (GCC's, which nvcc runs too) does: line splices
(backslash-newline) are joined, comments and literals are skipped, a quote not closed on its line runs to the end of
the line as one token (GCC's CPP_OTHER), digraphs (`%:`, `<:`) are read as the punctuators they stand for, and
trigraphs are left as they are (g++ -std=gnu++17 and nvcc replace none). Token pasting (`##`), universal character
names and raw strings are refused, so every identifier the compiler will see is spelled out in the source and
checked here, also inside `#define`s. Refused wherever it lies: an apostrophe that follows both a digit and a
non-ASCII character (or a backslash) in one run of word characters, as `1é'x`: whether GCC reads it as a digit
separator or as a quote depends on which characters it takes into identifiers, and this check does not guess.
Messages name at most the offending token, never more of the source.

Text in a conditional group that the preprocessor skips (`#if 0`, the `#else` of a true `#if`, ...) is never
compiled, and may hold anything. Which groups are skipped is asked of the compilers' own preprocessors, never
guessed, whenever the source has a conditional and nothing is refused outside every group: it is preprocessed in
the sandbox with `#error <nonce> <group>` after every conditional directive (and an `#else` holding one where a
chain has none), by g++ with the CPU prelude under the flags of each of the CPU backend's builds and by nvcc for
sm_90 and for the GPU's own architecture, whichever backend grades: so a hand-in gets one verdict on both backends,
wherever both compilers are installed. `#error` cannot be silenced by a pragma or changed by a macro, and fires
inside a macro call's arguments too. What lies in a group whose marker fires under none of them is dropped;
everything else stays refused. Every group is checked as if it were compiled where no sandbox is given, where no
compiler is here, and where the answer could be wrong: the preprocessor reports any other error (a missing header
stops it early), the markers that fire are not one group of each chain whose enclosing group is taken, a chain is
not closed, or the source uses `__LINE__` (the markers move lines; in a directive, it is refused).

The compilers must also agree: a conditional whose groups one compiler (or one of the CPU backend's builds) takes
and another skips is refused, as are the macros that tell them apart (`__NVCC__`, `__SANITIZE_THREAD__`, ...),
even where nvcc is not here to be asked. Otherwise the GPU would run one kernel and the race analysis, which g++
builds, check another.
"""

from __future__ import annotations

import re
import secrets
import tempfile
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from autograder.errors import BackendUnavailable, CompileError, GraderError
from autograder.records import CompilerMessage, DeviceInfo, KernelSource
from autograder.sandbox import Sandbox

MAX_SOURCE_CHARS = 100_000
MAX_MESSAGES = 20
SHOWN_CHARS = 40  # at most this much of an offending token is quoted in a message
MAX_ATTRIBUTE_TOKENS = 64  # an allowed __attribute__((...)) is short; a longer one is refused unread
SOURCE_NAME = "kernel.cu"  # the name both backends compile the source under

# Headers found through angle brackets in the C/C++ library and the CUDA toolkit; nothing else is included.
ALLOWED_HEADERS = frozenset(
    {
        "cuda.h",
        "cuda_runtime.h",
        "cuda_runtime_api.h",
        "device_launch_parameters.h",
        "vector_types.h",
        "vector_functions.h",
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

# The directives that open, continue and close conditional groups; the preprocessor follows them even in groups it
# skips. Directives allowed besides these, #include, #define/#undef and #pragma (checked on their own):
_OPENING = frozenset({"if", "ifdef", "ifndef"})
_CONTINUING = frozenset({"elif", "elifdef", "elifndef", "else"})
_PLAIN_DIRECTIVES = frozenset({*_OPENING, *_CONTINUING, "endif", "error", "warning"})
_ALLOWED_PRAGMAS = frozenset({"unroll", "nounroll", "once"})
# __attribute__((...)) may name only these (with or without surrounding underscores).
_ALLOWED_ATTRIBUTES = frozenset({"aligned", "packed", "unused", "always_inline", "noinline"})
# In a standard attribute, [[...]] (or a namespaced one, [[gnu::...]]), these too: they change no code's place.
_ALLOWED_STANDARD_ATTRIBUTES = _ALLOWED_ATTRIBUTES | {"maybe_unused", "nodiscard", "likely", "unlikely",
                                                      "fallthrough", "deprecated"}
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
# Macros that tell the compilers (or the CPU backend's two builds) apart: code chosen by them is not the code
# checked. Refused by name, so also where nvcc is not installed to be asked (_split_problems).
_COMPILER_NAMES = re.compile(r"__NVCC__|__CUDACC_VER_\w+|__CUDACC_RTC__|__SANITIZE_\w+__|__clang\w*|__NVCOMPILER\w*")
# Functions whose result on a GPU the grader's CPU analysis does not reproduce bit for bit: the GPU's approximate
# intrinsics and transcendental math (its own approximations, not glibc's), and its clocks. A kernel could tell
# the two apart by them and run code on the GPU that the analysis never saw (races, technique). Compared without
# leading underscores or `__builtin_` (so `__expf` is `expf`). Refused wherever it appears (a function pointer, a
# macro's argument), except a plain word (`log`, `y0`, `norm`, `clock`) that the cell declares as its own
# (_platform_dependent). Exact math (fmaxf, fabsf, sqrtf, fmaf, floorf, ...) is allowed.
_PLATFORM = re.compile(
    r"(?:exp(?:2|10|m1)?|log(?:2|10|1p|b)?|pow|sin|cos|tan|sincos|sinpi|cospi|sincospi|a?sinh?|a?cosh?|a?tanh?"
    r"|atan2|erfc?|erfc?inv|erfcx|[lt]gamma|r?cbrt|r?hypot|r?norm(?:3d|4d)?|normcdf(?:inv)?|[jy][01n]"
    r"|cyl_bessel_i[01]|rsqrt|fdivide)f?|clock(?:64)?|globaltimer"
)
# The versions of the GPU and of CUDA: the CPU backend's are its own (ag_prelude.h). In an #if the compilers are
# asked which code each builds (_split_problems); in code, a kernel could choose its code by them unseen.
_VERSIONS = frozenset({"__CUDA_ARCH__", "CUDART_VERSION", "CUDA_VERSION", "__CUDA_API_VERSION"})
_PRAGMA_OPERATORS = frozenset({"_Pragma", "__pragma"})
_THREAD_LOCAL = frozenset({"thread_local", "__thread", "_Thread_local"})
_PROBES = frozenset(
    {
        *("__has_include", "__has_include__", "__has_include_next", "__has_include_next__"),
        *("__FILE__", "__BASE_FILE__", "__FILE_NAME__", "__TIMESTAMP__"),
    }
)
_ATTRIBUTE_KEYWORDS = frozenset({"__attribute__", "__attribute"})

_SPLICE = re.compile(r"\\[ \t\f\v]*\n")
_BAD_CHARACTER = re.compile(r"[\x00-\x08\x0e-\x1f\x7f\r\ud800-\udfff]")
# GCC's preprocessing tokens. A number runs on through digit separators (an apostrophe followed by a digit, letter,
# `_` or `$`), and an unclosed quote runs to the end of its line (GCC's CPP_OTHER).
_TOKEN = re.compile(
    r"""
      (?P<space>[ \t\f\v]+)
    | (?P<newline>\n)
    | (?P<comment>//[^\n]*|/\*.*?\*/)
    | (?P<open_comment>/\*)
    | (?P<raw>(?:u8|u|U|L)?R")
    | (?P<string>(?:u8|u|U|L)?"(?:[^"\\\n]|\\.)*")
    | (?P<char>(?:u8|u|U|L)?'(?:[^'\\\n]|\\.)*')
    | (?P<unclosed>(?:u8|u|U|L)?["'][^\n]*)
    | (?P<number>\.?[0-9](?:[eEpP][+-]|[A-Za-z0-9_$.]|'+(?=[A-Za-z0-9_$]))*)
    | (?P<identifier>[A-Za-z_$][A-Za-z0-9_$]*)
    | (?P<punct>%:%:|\#\#|%:|<:|:>|<%|%>|::|[-+*/%<>=!&|^~?:;,.()\[\]{}\#])
    | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)
# A run of characters a number or an identifier may take in, where GCC's reading of an apostrophe depends on which
# non-ASCII characters (or universal character names) it takes into identifiers.
_WORD_RUN = re.compile(r"[A-Za-z0-9_$.'\\+\-\u0080-\U0010ffff]+")
_UNSURE_CHARACTER = re.compile(r"[\\\u0080-\U0010ffff]")
_LITERAL_PREFIX = re.compile(r"u8|u|U|L")
_HASH = frozenset({"#", "%:"})
_PASTE = frozenset({"##", "%:%:"})
_DIGRAPHS = {"<%": "{", "%>": "}", "<:": "[", ":>": "]", "%:": "#", "%:%:": "##"}
_OPEN = {"(": ")", "[": "]", "<:": ":>", "{": "}", "<%": "%>"}
_SQUARE = frozenset({"[", "<:"})
# Attributes that place code or data (in an executable section, in .init_array, as another symbol), refused in
# their scoped form (`gnu::section`, `using gnu: section`) however the brackets around them were spelled; as plain
# names they are a kernel's own.
_PLACING = frozenset({"section", "alias"})
_INCLUDE_LINE = re.compile(r"[ \t\f\v]*<([A-Za-z0-9_./]+)>[ \t\f\v]*(?:/\*.*?\*/[ \t\f\v]*)*(?://.*)?")

Problem = tuple[int, str]  # (line of the kernel source, message)
# Preprocesses a source in every way its backend compiles it and returns what the compiler said each time.
Preprocess = Callable[[str], list[str]]


@dataclass(frozen=True)
class _Token:
    kind: str  # identifier, number, string, char, unclosed, punct, newline, other
    text: str
    line: int  # line of the kernel source, 1-based
    start: int  # offset of the token in the spliced text
    end: int  # offset just past the token in the spliced text


@dataclass(frozen=True)
class _Row:
    """A logical line: its tokens, and where it starts and ends in the spliced text."""

    tokens: list[_Token]
    start: int  # just past the line end before it (0 for the first line)
    end: int  # offset of the line end that closes it


@dataclass(frozen=True)
class _Spliced:
    """The source with its line splices joined, and where each character of it comes from."""

    text: str
    origins: list[int]  # offset in the source of each character of `text`, and of its end
    line_ends: list[int]  # offsets of the source's newlines

    def line(self, offset: int) -> int:
        """The source line of the character at `offset` in `text`."""
        return bisect_left(self.line_ends, self.origins[offset]) + 1


@dataclass
class _Chain:
    """An #if ... #endif: its groups (branch numbers), in order, and the group it lies in (None: the top level)."""

    parent: int | None
    branches: list[int] = field(default_factory=list)
    has_else: bool = False


@dataclass(frozen=True)
class _Groups:
    """The conditional groups of a source: the branch each logical line lies in, and where the markers go."""

    branch_of_row: list[int | None]  # the innermost group of each row; None at the top level
    chains: list[_Chain]
    markers: list[tuple[int, int, bool]]  # (offset in the source, branch, whether an #else goes before the marker)
    closed: bool  # every #elif, #else and #endif belongs to an open #if, and every #if is closed


@dataclass(frozen=True)
class _Found:
    line: int
    text: str
    branch: int | None  # the conditional group it lies in; None where it is refused whatever the preprocessor skips


def check_source(source: KernelSource, sandbox: Sandbox | None = None, device: DeviceInfo | None = None) -> None:
    """Raise CompileError, with a message per refused construct on its notebook cell line, unless `source` keeps
    to the policy. Given the `sandbox` (and the `device` the source will be built for), the compilers'
    preprocessors tell which conditional groups are skipped (only when something is refused inside one); without
    it every group is checked."""
    preprocess = _preprocessor(sandbox, device) if sandbox is not None else None
    problems = source_problems(source.text, preprocess)
    if not problems:
        return
    messages = tuple(CompilerMessage("error", source.cell_line(line), text) for line, text in problems)
    first = messages[0]
    where = f"line {first.line}: " if first.line is not None else ""
    raise CompileError(f"refused before compiling: {where}{first.text}", messages)


def source_problems(text: str, preprocess: Preprocess | None = None) -> list[Problem]:
    """What `text` holds against the policy, in source order (at most MAX_MESSAGES); empty when it keeps to it.
    What lies in conditional groups that `preprocess` shows to be skipped is left out."""
    if len(text) > MAX_SOURCE_CHARS:
        return [(1, f"the kernel is {len(text)} characters long, more than the {MAX_SOURCE_CHARS} accepted; "
                    "a reduction kernel is far shorter: remove what it does not need")]
    text = text.replace("\r\n", "\n")
    found = _character_problems(text)
    if not found:
        text += "\n"  # the compiler ends the last line, even one without a line end or ending in a line splice
        spliced = _splice(text)
        tokens, found = _lex(spliced)
        rows = _rows(tokens, len(spliced.text))
        groups = _groups(rows, spliced)
        found += _token_problems(rows, groups, spliced.text)
        # Which groups each compiler takes: asked only where that can change the verdict (a source refused
        # outside every group is refused whatever they say).
        if preprocess is not None and groups.chains and all(problem.branch is not None for problem in found):
            each = _fired_by_each(text, tokens, groups, preprocess)
            if each is not None:
                taken = set().union(*each)
                found = [problem for problem in found if problem.branch is None or problem.branch in taken]
                found += _split_problems(text, groups, each)
            elif any(token.text == "__LINE__" for row in rows if row.tokens[0].text in _HASH for token in row.tokens):
                found.append(_Found(_marker_line(text, groups.markers[0][0]), _UNTOLD, None))
    unique = list(dict.fromkeys((problem.line, problem.text) for problem in found))
    return sorted(unique, key=lambda problem: problem[0])[:MAX_MESSAGES]


def token_rows(text: str) -> list[list[tuple[str, str]]] | None:
    """The preprocessing tokens of `text`, a list per logical line, each as (kind, spelling), a digraph spelled as
    the punctuator it stands for (`<%` as `{`); None where the text holds what this check cannot read (the policy
    refuses it). For autograder.backends.gpu_batch, which must see every brace and identifier the compiler sees."""
    text = text.replace("\r\n", "\n")
    if _character_problems(text):
        return None
    spliced = _splice(text + "\n")
    tokens, found = _lex(spliced)
    if found:
        return None
    return [[(token.kind, _DIGRAPHS.get(token.text, token.text)) for token in row.tokens]
            for row in _rows(tokens, len(spliced.text))]


def _shown(token: str) -> str:
    return token if len(token) <= SHOWN_CHARS else token[:SHOWN_CHARS] + "..."


def _character_problems(text: str) -> list[_Found]:
    """Characters that would make the compiler read the source otherwise than this check does."""
    problems = []
    for match in _BAD_CHARACTER.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        found = match.group()
        if "\ud800" <= found <= "\udfff":
            message = "the kernel holds a character that is not valid Unicode (a lone surrogate); delete it"
        else:
            message = (f"the control character U+{ord(found):04X} is refused: the compiler may read it as a line "
                       "break or skip it; delete it")
        problems.append(_Found(line, message, None))
        if len(problems) == MAX_MESSAGES:
            break
    return problems


def _splice(text: str) -> _Spliced:
    """`text` with every backslash-newline removed, as the compiler joins lines."""
    pieces: list[str] = []
    origins: list[int] = []
    position = 0
    for match in [*_SPLICE.finditer(text), None]:
        end = match.start() if match else len(text)
        pieces.append(text[position:end])
        origins.extend(range(position, end))
        if match:
            position = match.end()
    origins.append(len(text))
    line_ends = [match.start() for match in re.finditer("\n", text)]
    return _Spliced("".join(pieces), origins, line_ends)


def _lex(spliced: _Spliced) -> tuple[list[_Token], list[_Found]]:
    """The preprocessing tokens of the spliced text, less whitespace and comments, with a token per line end; and
    what makes the rest of the text unreadable (refused wherever it lies, and read no further)."""
    unsure = _unsure_apostrophes(spliced.text)
    tokens: list[_Token] = []
    for match in _TOKEN.finditer(spliced.text):
        kind, text, line = match.lastgroup or "other", match.group(), spliced.line(match.start())
        if kind in ("space", "comment"):
            continue
        if kind == "open_comment":
            return tokens, [_Found(line, "a /* comment is never closed; close it with */", None)]
        if kind == "raw":
            return tokens, [_Found(line, "raw string literals (R\"...\") are refused: the compiler reads them "
                                         "before joining lines, so they could hide code from this check; use a "
                                         "plain string", None)]
        if any(unsure[match.start() + index] for index in _apostrophes(kind, text)):
            return tokens, [_Found(line, "an apostrophe next to a digit and a non-ASCII character (or a backslash) "
                                         "is refused: whether the compiler reads it as a digit separator or as a "
                                         "quote depends on the character; put a space before the apostrophe", None)]
        tokens.append(_Token(kind, text, line, match.start(), match.end()))
    return tokens, []


def _unsure_apostrophes(text: str) -> bytearray:
    """Marks each character of `text` that follows, in one run of characters a number or an identifier may take in,
    both a digit and a non-ASCII character or a backslash. GCC takes such a character into a number or an
    identifier only if it may appear in identifiers, so an apostrophe after it may be a digit separator to GCC
    where this check reads a quote, or the other way round."""
    unsure = bytearray(len(text))
    for run in _WORD_RUN.finditer(text):
        digit = re.search("[0-9]", run.group())
        character = _UNSURE_CHARACTER.search(run.group())
        if digit and character:
            first = run.start() + max(digit.start(), character.start()) + 1
            unsure[first : run.end()] = b"\x01" * (run.end() - first)
    return unsure


def _apostrophes(kind: str, text: str) -> list[int]:
    """Where in a token its digit separators are, or the apostrophe that opens it."""
    if kind == "number":
        return [index for index, character in enumerate(text) if character == "'"]
    if kind in ("char", "unclosed"):
        opening = _LITERAL_PREFIX.match(text)
        index = opening.end() if opening else 0
        return [index] if text[index] == "'" else []
    return []


def _rows(tokens: list[_Token], end: int) -> list[_Row]:
    """The logical lines of `tokens`; the last one ends at `end` where the lexer stopped before a line end."""
    rows: list[_Row] = []
    current: list[_Token] = []
    start = 0
    for token in tokens:
        if token.kind != "newline":
            current.append(token)
            continue
        if current:
            rows.append(_Row(current, start, token.start))
        current, start = [], token.end
    if current:
        rows.append(_Row(current, start, end))
    return rows


def _conditional(row: _Row) -> str | None:
    """The name of the conditional directive `row` is, if it is one."""
    tokens = row.tokens
    if len(tokens) > 1 and tokens[0].text in _HASH and tokens[1].kind == "identifier":
        name = tokens[1].text
        return name if name in _OPENING or name in _CONTINUING or name == "endif" else None
    return None


def _groups(rows: list[_Row], spliced: _Spliced) -> _Groups:
    """The conditional groups, read as the preprocessor reads them, whether or not it skips them; and a marker
    after each conditional directive, with an #else before the #endif of a chain that has none."""
    branch_of_row: list[int | None] = []
    chains: list[_Chain] = []
    markers: list[tuple[int, int, bool]] = []
    open_chains: list[_Chain] = []
    closed = True
    count = 0

    def open_branch(chain: _Chain, offset: int, with_else: bool) -> None:
        nonlocal count
        chain.branches.append(count)
        markers.append((offset, count, with_else))
        count += 1

    for row in rows:
        innermost = open_chains[-1].branches[-1] if open_chains else None
        directive = _conditional(row)
        after = spliced.origins[row.end] + 1
        if directive in _OPENING:
            branch_of_row.append(innermost)
            chains.append(_Chain(innermost))
            open_chains.append(chains[-1])
            open_branch(chains[-1], after, with_else=False)
        elif directive in _CONTINUING or directive == "endif":
            if not open_chains or (open_chains[-1].has_else and directive != "endif"):
                closed = False  # the preprocessor refuses it
                branch_of_row.append(innermost)
                continue
            chain = open_chains[-1]
            branch_of_row.append(chain.parent)
            if directive == "endif":
                open_chains.pop()
                if not chain.has_else:
                    before = spliced.origins[row.start - 1] + 1 if row.start else 0
                    open_branch(chain, before, with_else=True)
            else:
                chain.has_else = directive == "else"
                open_branch(chain, after, with_else=False)
        else:
            branch_of_row.append(innermost)
    return _Groups(branch_of_row, chains, markers, closed and not open_chains)


@dataclass(frozen=True)
class _Cell:
    """What the whole cell tells about its names: the names it declares itself (and which of them as functions),
    and the macros that stand for a version (`_VERSIONS`)."""

    declared: frozenset[str] = frozenset()
    functions: frozenset[str] = frozenset()
    versions: frozenset[str] = _VERSIONS


# Tokens after which a name is being declared: a type, a pointer or a reference; and the first tokens of a
# declaration, after which a `,` at its own level starts another name (`int a = 0, log = 1;`).
_SIZED = frozenset(f"{kind}{bits}_t" for kind in ("int", "uint") for bits in (8, 16, 32, 64))
_DECLARING = _SIZED | {"float", "double", "int", "unsigned", "signed", "long", "short", "char", "bool", "auto", "void",
                       "size_t", "uint", "dim3", "half", "*", "&"}
_OPENING_A_DECLARATION = _DECLARING | {"const", "static", "volatile", "register", "__shared__", "__device__",
                                       "__constant__"}


def _cell(rows: list[_Row]) -> _Cell:
    declared: set[str] = set()
    functions: set[str] = set()
    versions = set(_VERSIONS)
    for row in rows:
        tokens = row.tokens
        opener, depth = None, 0  # the first token of the statement, and the parentheses open in it
        for index, token in enumerate(tokens):
            before = tokens[index - 1] if index else None
            after = tokens[index + 1] if index + 1 < len(tokens) else None
            if token.text in (";", "{", "}"):
                opener, depth = None, 0
                continue
            opener = opener or token.text
            depth += {"(": 1, ")": -1}.get(token.text, 0)
            if token.kind != "identifier" or before is None:
                continue
            listed = before.text == "," and depth == 0 and opener in _OPENING_A_DECLARATION
            if before.text in _DECLARING or listed:
                declared.add(token.text)
                if after is not None and after.text == "(":
                    functions.add(token.text)
    defines = [row.tokens for row in rows if len(row.tokens) > 2 and row.tokens[0].text in _HASH
               and row.tokens[1].text == "define" and row.tokens[2].kind == "identifier"]
    grown = True
    while grown:  # a macro that stands for a version, or for another such macro
        grown = False
        for tokens in defines:
            if tokens[2].text not in versions and any(token.text in versions for token in tokens[3:]):
                versions.add(tokens[2].text)
                grown = True
    return _Cell(frozenset(declared), frozenset(functions), frozenset(versions))


def _token_problems(rows: list[_Row], groups: _Groups, logical: str) -> list[_Found]:
    found: list[_Found] = []
    top_level = 0
    cell = _cell(rows)
    for row, branch in zip(rows, groups.branch_of_row, strict=True):
        tokens = row.tokens
        if tokens[0].text in _HASH:
            problems = _directive_problems(tokens, logical, cell)
        else:
            problems = _code_problems(tokens, in_define=False, cell=cell)
        found += [_Found(line, text, branch) for line, text in problems]
        top_level += len(problems) if branch is None else 0
        if top_level >= MAX_MESSAGES:
            break  # enough to act on, and none of it can be dropped; a flood must not cost the grader time
    return found


def _fired_by_each(text: str, tokens: list[_Token], groups: _Groups, preprocess: Preprocess) -> list[set[int]] | None:
    """The conditional groups each compiler (and flag set) compiles; None where that cannot be told."""
    if not groups.closed or any(token.text == "__LINE__" for token in tokens):
        return None  # the preprocessor refuses an unclosed chain; a condition on __LINE__ sees the moved lines
    nonce = secrets.token_hex(16)
    try:
        logs = preprocess(_marked(text, groups.markers, nonce))
    except (GraderError, OSError):
        return None
    marker = re.compile(rf": error: #error {nonce} (\d+)$")
    each: list[set[int]] = []
    for log in logs:
        fired: set[int] = set()
        for line in log.splitlines():
            match = marker.search(line)
            if match:
                fired.add(int(match.group(1)))
            elif "error" in line.lower():
                return None  # an error of the source's own, or a fatal one after which no marker fires
        if not _fits(fired, groups.chains):
            return None
        each.append(fired)
    return each


_SPLIT = ("chooses different code for different compilers: nvcc builds what the GPU runs, g++ what the grader "
          "checks for races and bounds, and both must see the same kernel; remove the condition")
_UNTOLD = ("`__LINE__` in a directive of a cell with #if or #ifdef is refused: the grader cannot tell which code "
           "each compiler compiles; remove one of them")


def _split_problems(text: str, groups: _Groups, each: list[set[int]]) -> list[_Found]:
    """A problem at the first conditional directive whose groups some compiler takes and another does not."""
    differing = set().union(*each) - set.intersection(*each) if each else set()
    chain = next((chain for chain in groups.chains if differing.intersection(chain.branches)), None)
    if chain is None:
        return []
    offset = next(offset for offset, branch, _ in groups.markers if branch == chain.branches[0])
    return [_Found(_marker_line(text, offset), f"this conditional directive {_SPLIT}", chain.parent)]


def _marker_line(text: str, offset: int) -> int:
    """The line of the directive a marker follows."""
    return text.count("\n", 0, offset)


def _marked(text: str, markers: list[tuple[int, int, bool]], nonce: str) -> str:
    """`text` with an `#error <nonce> <branch>` line at each marker's offset, after an `#else` where it asks for
    one. The markers are in source order, so a marker after an #if comes before the #else added at its #endif."""
    pieces = []
    position = 0
    for offset, branch, with_else in sorted(markers, key=lambda marker: marker[0]):
        pieces += [text[position:offset], "#else\n" if with_else else "", f"#error {nonce} {branch}\n"]
        position = offset
    pieces.append(text[position:])
    return "".join(pieces)


def _fits(fired: set[int], chains: list[_Chain]) -> bool:
    """Whether the groups whose markers fired are a choice the preprocessor could have made among `chains`: one
    group of each chain whose enclosing group is taken, none of the others."""
    for chain in chains:
        taken = chain.parent is None or chain.parent in fired
        if len(fired.intersection(chain.branches)) != int(taken):
            return False
    return True


def _preprocessor(sandbox: Sandbox, device: DeviceInfo | None) -> Preprocess:
    """Preprocesses a source in `sandbox` with every command by which a backend compiles it."""

    def preprocess(text: str) -> list[str]:
        logs = []
        with tempfile.TemporaryDirectory(prefix="autograder-policy-") as directory:
            folder = Path(directory)
            (folder / SOURCE_NAME).write_text(text)
            for argv, seconds, readable in _preprocess_commands(device):
                result = sandbox.run_tool([*argv, SOURCE_NAME, "-o", "/dev/null"], folder, seconds, readable=readable)
                logs.append(result.stderr)
        return logs

    return preprocess


POLICY_ARCH = "sm_90"  # nvcc's architecture for the policy wherever no GPU says another: the H200's and H100's


def _preprocess_commands(device: DeviceInfo | None) -> list[tuple[list[str], float, tuple[Path, ...]]]:
    """The `-E` commands that preprocess a kernel as each backend compiles it, with their time limits and the
    folders they read: g++ with the CPU prelude under each of the CPU backend's builds, and nvcc for POLICY_ARCH
    and the GPU's own architecture. Asking all of them, not only the backend's own, gives a hand-in one verdict
    on both backends. Raises BackendUnavailable where neither compiler is here."""
    from autograder.backends.cpu.compiler import (
        CHECK_FLAGS,
        COMMON_FLAGS,
        COMPILE_SECONDS,
        PRELUDE_FLAGS,
        RUNTIME_DIR,
        find_compiler,
    )
    from autograder.backends.gpu import NVCC_OPTIONS, NVCC_SECONDS, find_nvcc

    commands = []
    try:
        compiler, _ = find_compiler()
    except BackendUnavailable:
        pass
    else:
        # The plain build, the instrumented one (it defines __SANITIZE_THREAD__), and the __shared__ rewrite's g++ -E.
        for flags in ((), CHECK_FLAGS, ("-DAG_PREPROCESSING",)):
            argv = [compiler, *COMMON_FLAGS, *flags, "-E", *PRELUDE_FLAGS, "-x", "c++"]
            commands.append((argv, COMPILE_SECONDS, (RUNTIME_DIR,)))
    nvcc = find_nvcc()
    if nvcc is not None:
        archs = {POLICY_ARCH}
        if device is not None and device.backend == "gpu" and device.compute_capability:
            archs.add("sm_" + device.compute_capability.replace(".", ""))
        plain = ("-Xcompiler", "-fdiagnostics-plain-output")  # no source lines quoted under the messages
        for arch in sorted(archs):
            commands.append(([nvcc, "--cubin", f"-arch={arch}", *NVCC_OPTIONS, *plain, "-E"], NVCC_SECONDS, ()))
    if not commands:
        raise BackendUnavailable("neither g++ nor nvcc is here to preprocess with")
    return commands


def _directive_problems(row: list[_Token], logical: str, cell: _Cell) -> list[Problem]:
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
        # A macro's own name is not checked as a use of a version; its body is, where the macro is used.
        return problems + _code_problems(row[2:], in_define=directive == "define", cell=cell, versions_ok=True)
    if directive == "pragma":
        if len(row) < 3 or row[2].text not in _ALLOWED_PRAGMAS:
            return [(line, "this #pragma is refused: pragmas change how the compiler builds and checks the kernel; "
                           "only #pragma unroll (and nounroll, once) are allowed")]
        return _code_problems(row[3:], in_define=False, cell=cell)
    if directive in _PLAIN_DIRECTIVES:
        return _code_problems(row[2:], in_define=False, cell=cell, versions_ok=True)
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


def _code_problems(
    row: list[_Token], in_define: bool, cell: _Cell = _Cell(), versions_ok: bool = False
) -> list[Problem]:
    """Problems of the tokens of one line of code, or of a directive's operands (a #define's body, an #if's
    condition: where the versions may be read, `versions_ok`)."""
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
        elif token.kind == "unclosed":
            problems.append((token.line, "a string or character literal is not closed on its line; close it"))
        elif token.kind == "other" and token.text == "\\":
            problems.append((token.line, "a backslash outside a string or character literal is refused (universal "
                                         "character names can spell refused names); write names in plain ASCII"))
        elif token.kind == "other" and not token.text.isascii():
            problems.append((token.line, f"the character U+{ord(token.text):04X} outside comments and strings is "
                                         "refused: write code in plain ASCII (comments and strings may hold any "
                                         "text)"))
        elif token.text in _SQUARE and after is not None and after.text in _SQUARE:
            message = _standard_attribute_problem(row, index)
            if message is not None:
                problems.append((token.line, message))
        elif token.kind == "identifier":
            message = _identifier_problem(token.text, after)
            if message is None and token.text in cell.versions and not versions_ok:
                message = (f"`{token.text}` is refused outside #if: the version it stands for on a GPU is not the "
                           "grader's CPU analysis's, so code chosen by it would not be the code the grader checks; "
                           "choose with #if, where both compilers are asked which code they build")
            before = row[index - 1] if index else None
            if message is None and _platform_dependent(token.text, before, after, cell):
                message = (f"`{_shown(token.text)}` is refused: a GPU computes it otherwise than the grader's CPU "
                           "analysis of the same kernel (approximate or transcendental math, clocks), so code chosen "
                           "by its result would not be the code the grader checks; a reduction needs none of it "
                           "(fmaxf, fabsf, sqrtf and the like are fine). If it is a name of your own, declare it with "
                           "its type in the cell (`int log = 0;`) or rename it")
            if message is None and token.text in _ATTRIBUTE_KEYWORDS:
                message = _attribute_problem(row, index)
            if message is None and index and row[index - 1].text in (":", "::") and token.text.strip("_") in _PLACING:
                message = (f"`{_shown(token.text)}` is refused as an attribute (`gnu::{token.text.strip('_')}`): it "
                           "puts code where the grader does not check it")
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
    if _COMPILER_NAMES.fullmatch(name):
        return (f"`{shown}` is refused: it tells the compilers apart, and the grader checks with g++ the kernel "
                "nvcc builds for the GPU: both must compile the same code")
    if name == "__declspec":
        return f"`{shown}` is refused: it is not CUDA; remove it"
    if name in _THREAD_LOCAL:
        return (f"`{shown}` is refused: a GPU has no thread-local storage, and on the CPU backend it would keep "
                "state between launches where no check sees it (red team); use a local variable")
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


def _platform_dependent(name: str, before: _Token | None, after: _Token | None, cell: _Cell) -> bool:
    """Whether `name` is one of `_PLATFORM`'s functions. A plain word (`log`, `y0`, `norm`) is the cell's own
    where it declares it: called, as a function it declares; otherwise as anything it declares, or a member."""
    if not _PLATFORM.fullmatch(name.removeprefix("__builtin_").lstrip("_")):
        return False
    if name.startswith("_") or name.endswith("f"):  # a builtin, an intrinsic or a float function: no one's name
        return True
    if before is not None and before.text in (".", "->"):
        return False
    if after is not None and after.text == "(":
        return name not in cell.functions
    return name not in cell.declared


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
    return None if _only_allowed(window[2 : close - 1], _ALLOWED_ATTRIBUTES, scoped=False) else refused


def _standard_attribute_problem(row: list[_Token], index: int) -> str | None:
    """Why the attribute specifier `[[...]]` opening at `row[index]` is refused: it must close on its line and
    name only allowed attributes, each perhaps in a namespace (`gnu::unused`) and with arguments."""
    refused = (f"`[[...]]` is refused unless it closes on its line and names only these attributes: "
               f"{', '.join(sorted(_ALLOWED_STANDARD_ATTRIBUTES))}; remove it")
    close = _group(row, index)
    if close is None or _group(row, index + 1) != close - 1:
        return refused
    return None if _only_allowed(row[index + 2 : close - 1], _ALLOWED_STANDARD_ATTRIBUTES, scoped=True) else refused


def _only_allowed(tokens: list[_Token], allowed: frozenset[str], scoped: bool) -> bool:
    """Whether an attribute list names only `allowed` attributes (`scoped`: perhaps as `gnu::name`), each with at
    most one bracketed group of arguments."""
    for item in _split_commas(tokens):
        if scoped and len(item) > 2 and item[0].kind == "identifier" and item[1].text == "::":
            item = item[2:]
        if not item:
            continue
        if item[0].kind != "identifier" or item[0].text.strip("_") not in allowed:
            return False
        if len(item) > 1 and _group(item, 1) != len(item) - 1:
            return False
    return True


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
