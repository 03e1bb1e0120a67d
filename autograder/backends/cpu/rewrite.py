"""The two source rewrites the CPU backend needs before g++ sees a kernel. Both keep every line where it was.

- `extern __shared__ T name[];` becomes a pointer to the runtime's dynamic shared memory.
- `__shared__ T name[N];` becomes a static reference into the runtime's shared arena, allocated once per
  program (per template instantiation), so the race checker sees every shared array in one place.
- Beside each, a read-only marker `__ag_shared_<name>` in the same scope tells the variable the rewrite made from
  the kernel's own `__device__` ones in the built library's symbol table (compiler.device_variables).

The rewrite works on tokens outside comments and strings; a declaration it cannot take apart is left to the
prelude's fallback (`#define __shared__ static`), which runs correctly but unchecked.

A declaration written through a macro (`#define SMEM extern __shared__ float`) shows only after preprocessing:
such a source is run through `g++ -E` first (`rewrite_source`), and the rewrite applies to the lines that came
from the student's file, whose `# line` markers keep every message on the student's line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_ATTRIBUTES = re.compile(r"\[\[.*?\]\]", re.DOTALL)  # attribute specifiers, [[...]]
# Specifiers that mean nothing on the CPU or that the rewrite supplies itself, the last three with what follows
# them in parentheses (`__align__(16)`, `alignas(sizeof(float4))`, `__attribute__((aligned(sizeof(float4))))`).
_DROPPED_WORDS = re.compile(r"\b(?:__shared__|extern|static)\b")
_DROPPED_CALLS = re.compile(r"\b(?:__align__|alignas|__attribute__)\s*\(")
_PARENTHESISED = re.compile(r"\(\s*([A-Za-z_]\w*)\s*\)(?=\s*(?:\[|,|$))")  # a declarator in parentheses
_TYPE_OF = re.compile(r"\b(?:decltype|__typeof__|__typeof|typeof)\s*\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)")


SHARED_MARKER = "__ag_shared_"  # the name of each rewritten __shared__ variable's marker, before the variable's


@dataclass(frozen=True)
class Rewritten:
    text: str
    dynamic_names: tuple[str, ...]  # the names of extern __shared__ arrays, for messages
    preprocessed: bool = False  # `text` is g++ -E output with the prelude in it: compile it without -include


def blank_comments_and_strings(source: str) -> str:
    """`source` with comments, string and character literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(source)
    while i < n:
        if source.startswith("//", i):
            j = source.find("\n", i)
            j = n if j < 0 else j
        elif source.startswith("/*", i):
            j = source.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif source[i] == "'" and _in_number(source, i):
            out.append(source[i])  # a digit separator, as in 1'024
            i += 1
            continue
        elif source[i] in "\"'":
            quote, j = source[i], i + 1
            while j < n and source[j] != quote and source[j] != "\n":
                j += 2 if source[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            out.append(source[i])
            i += 1
            continue
        out.append("".join(c if c == "\n" else " " for c in source[i:j]))
        i = j
    return "".join(out)


def _in_number(source: str, index: int) -> bool:
    """Whether the apostrophe at `index` lies inside a number (a preprocessing number starts with a digit, or a
    dot and a digit), where C++14 reads it as a digit separator."""
    start = index
    while start > 0 and (source[start - 1].isalnum() or source[start - 1] in "_.'"):
        start -= 1
    first = source[start : start + 2]
    return start < index and (first[:1].isdigit() or (first[:1] == "." and first[1:].isdigit()))


def rewrite_shared(source: str) -> Rewritten:
    """Rewrite every `__shared__` declaration of `source`, keeping line numbers."""
    code = blank_comments_and_strings(source)
    pieces: list[str] = []
    dynamic: list[str] = []
    position = 0
    for match in re.finditer(r"\b__shared__\b", code):
        if match.start() < position or _in_directive(code, match.start()):
            continue
        start = _declaration_start(code, match.start())
        end = _statement_end(code, match.end())
        if end < 0:
            break
        replacement = _rewrite_declaration(code[start:end], dynamic, _at_namespace_scope(code, start))
        if replacement is None:
            continue
        original = source[start : end + 1]
        pieces.append(source[position:start])
        pieces.append(replacement + "\n" * original.count("\n"))
        position = end + 1
    pieces.append(source[position:])
    return Rewritten("".join(pieces), tuple(dynamic))


def rewrite_source(source: str, preprocess: Callable[[str], str], file_name: str) -> Rewritten:
    """`source` rewritten for g++. `preprocess` runs `g++ -E` (with the prelude and AG_PREPROCESSING defined)
    on a file `file_name` holding its argument and returns the output; it is called only when a macro of
    `source` mentions `__shared__`."""
    if not _macro_mentions_shared(source):
        return rewrite_shared(source)
    return rewrite_preprocessed(preprocess(source), file_name)


def rewrite_preprocessed(preprocessed: str, file_name: str) -> Rewritten:
    """`rewrite_shared` over the runs of `g++ -E` output that come from `file_name`; the headers' lines are
    kept as they are. A `__shared__` the rewrite cannot take apart becomes `static`, as the prelude's fallback
    would have made it."""
    pieces: list[str] = []
    dynamic: list[str] = []
    for from_source, text in _runs_by_file(preprocessed, file_name):
        if from_source:
            rewritten = rewrite_shared(text)
            dynamic += rewritten.dynamic_names
            text = _shared_as_static(rewritten.text)
        pieces.append(text)
    return Rewritten("".join(pieces), tuple(dynamic), preprocessed=True)


_MARKER = re.compile(r'# \d+ "((?:[^"\\]|\\.)*)"')


def _runs_by_file(preprocessed: str, file_name: str) -> list[tuple[bool, str]]:
    """The output split into runs of lines, each marked whether it comes from `file_name`."""
    runs: list[tuple[bool, list[str]]] = []
    current = False
    for line in filter(None, re.split(r"(?<=\n)", preprocessed)):  # lines as a compiler counts them: at \n only
        marker = _MARKER.match(line)
        if marker:
            current = marker[1] == file_name
        if not runs or runs[-1][0] != current:
            runs.append((current, []))
        runs[-1][1].append(line)
    return [(from_source, "".join(lines)) for from_source, lines in runs]


def _shared_as_static(text: str) -> str:
    code = blank_comments_and_strings(text)
    starts = [m.start() for m in re.finditer(r"\b__shared__\b", code)]
    for start in reversed(starts):
        text = text[:start] + "static" + text[start + len("__shared__") :]
    return text


def _macro_mentions_shared(source: str) -> bool:
    code = blank_comments_and_strings(source).replace("\\\n", " ")
    return re.search(r"^[ \t]*#[ \t]*define\b.*\b__shared__\b", code, re.MULTILINE) is not None


def _in_directive(code: str, index: int) -> bool:
    line_start = code.rfind("\n", 0, index) + 1
    return code[line_start:index].lstrip().startswith("#")


def _declaration_start(code: str, index: int) -> int:
    """Where the declaration holding `index` begins: after the previous `;`, `{`, `}` or directive line."""
    i = index
    while i > 0 and code[i - 1] not in ";{}" and code[i - 2 : i] not in ("<%", "%>"):
        if code[i - 1] == "\n":
            line_start = code.rfind("\n", 0, i - 1) + 1
            if code[line_start : i - 1].lstrip().startswith("#"):
                break
        i -= 1
    while i < index and code[i].isspace():
        i += 1
    return i


def _statement_end(code: str, index: int) -> int:
    """The `;` that ends the declaration going on at `index`, past any braces of a type it defines
    (`__shared__ struct { float sum; int count; } totals;`); -1 where there is none."""
    depth = 0
    for position in range(index, len(code)):
        ch = code[position]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                return -1
        elif ch == ";" and depth == 0:
            return position
    return -1


def _dropped(declaration: str) -> str:
    """The declaration less the specifiers the rewrite drops (_DROPPED_WORDS, _DROPPED_CALLS with their balanced
    parentheses)."""
    text = _DROPPED_WORDS.sub(" ", declaration)
    while (found := _DROPPED_CALLS.search(text)) is not None:
        depth, end = 0, found.end() - 1
        for end in range(found.end() - 1, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        text = text[: found.start()] + " " + text[end + 1 :]
    return text


def _at_namespace_scope(code: str, index: int) -> bool:
    """Whether `index` lies outside every brace but a namespace's (named or anonymous) or a linkage block's."""
    scopes: list[bool] = []  # for each open brace: whether it opens a namespace
    for brace in re.finditer(r"[{}]|<%|%>", code[:index]):
        if brace.group() in ("{", "<%"):
            before = code[: brace.start()].rstrip()
            # (strings are blanked: `extern "C" {` reads `extern     {`)
            scopes.append(re.search(r"\bnamespace(?:\s+[A-Za-z_][\w:]*)?$|\bextern$", before) is not None)
        elif scopes:
            scopes.pop()
    return all(scopes)


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in text:
        if ch in "([<{":
            depth += 1
        elif ch in ")]>}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def _rewrite_declaration(declaration: str, dynamic: list[str], namespace_scope: bool) -> str | None:
    declaration = _ATTRIBUTES.sub(" ", declaration)  # [[maybe_unused]] and the like say nothing of the storage
    is_extern = re.search(r"\bextern\b", declaration) is not None
    body = " ".join(_dropped(declaration).split())
    body = _PARENTHESISED.sub(r"\1", body)  # `float (sdata)[256]` declares `sdata`
    declarators = _split_top_level(body)
    first = declarators[0]
    bracket = first.find("[")
    head = first if bracket < 0 else first[:bracket]
    if "=" in body or "(" in _TYPE_OF.sub("", head):
        return None  # an initialiser or a function pointer: leave it to the fallback
    names = list(_IDENTIFIER.finditer(head))
    if len(names) < 2:
        return None
    name = names[-1]
    base_type = head[: name.start()].rstrip()
    stars = ""
    while base_type.endswith(("*", "&")):
        stars = base_type[-1] + stars
        base_type = base_type[:-1].rstrip()
    entries = [(stars, name.group(), first[name.end() :].strip())]
    for other in declarators[1:]:
        parsed = re.fullmatch(r"\s*([*&\s]*)([A-Za-z_]\w*)\s*(.*?)\s*", other)
        if parsed is None:
            return None
        entries.append((parsed.group(1).replace(" ", ""), parsed.group(2), parsed.group(3)))
    out = []
    if "{" in base_type:  # a type defined here, maybe unnamed: named once, so that every use is the same type
        out.append(f"typedef {base_type} __ag_type_of_{name.group()};")
        base_type = f"__ag_type_of_{name.group()}"
    for pointer, variable, dims in entries:
        element = f"{base_type}{pointer}"
        # Each variable with static storage made here is the rewrite's, not a __device__ one of the kernel's: the
        # marker beside it, in the same scope, tells it in the symbol table (compiler.device_variables). The
        # marker is the name its initialiser passes, so the compiler keeps it exactly where it keeps the variable.
        # Read-only data: it takes no place among the variables, whose bounds reach to the next symbol.
        marker = f"{SHARED_MARKER}{variable}"
        if is_extern and not namespace_scope:  # a pointer of the function's own, no static storage
            out.append(f"{element} *const {variable} = reinterpret_cast<{element} *>(__ag_dynamic_shared);")
        elif is_extern:
            out.append(f'static const char {marker}[] = "{variable}"; static {element} *const {variable} = '
                       f"reinterpret_cast<{element} *>(__ag_dynamic_shared_of({marker}));")
        elif dims:
            out.append(
                f'static const char {marker}[] = "{variable}"; '
                f"static {element} (&{variable}){dims} = *reinterpret_cast<{element} (*){dims}>("
                f"__ag_static_shared(sizeof({element}{dims}), alignof({element}{dims}), {marker}));"
            )
        else:
            out.append(
                f'static const char {marker}[] = "{variable}"; '
                f"static {element} &{variable} = *reinterpret_cast<{element} *>("
                f"__ag_static_shared(sizeof({element}), alignof({element}), {marker}));"
            )
        if is_extern:
            dynamic.append(variable)
    return " ".join(out)
