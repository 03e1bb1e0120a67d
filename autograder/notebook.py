"""Reading each stage's kernel source out of a notebook, without running any of it.

The cell format (the released notebook and the example hand-ins follow it):

- A stage's kernel cell is a code cell whose metadata carries `nbgrader.grade_id` equal to the stage id
  (`naive`, `anti_divergence`, ..., `max2d`).
- Its source is one assignment of a string literal to a name, for example::

      NAIVE_SOURCE = r\"\"\"
      __global__ void reduce_naive(const float *g_in, float *g_out, unsigned int n)
      { ... }
      \"\"\"

  Comments may surround it. Anything else (an f-string, a call, a second statement) is refused: the cell is
  parsed with `ast`, never executed.
"""

from __future__ import annotations

import ast
import codecs
import errno
import io
import json
import re
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from autograder.errors import NotebookError
from autograder.files import read_regular_file
from autograder.records import KernelSource, SourceLocation
from autograder.stages import STAGE_IDS, get_stage

# nbformat imports jsonschema, which builds the grammar of rfc3987_syntax as it imports it wherever that optional
# package is installed (nbgrader's dependencies bring it): a second of a core in every grading process and
# command, for the "iri" string formats, which no notebook schema uses. Without it, jsonschema leaves those
# formats unchecked.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]

import nbformat  # noqa: E402 (after the line above)
import nbformat.reader  # noqa: E402

NBGRADER_SCHEMA_VERSION = 3
MAX_NOTEBOOK_BYTES = 32 << 20  # a notebook with its outputs cleared is a few hundred KiB
MAX_CELL_CHARS = 200_000  # a kernel cell holds a few KiB; parsing a giant one would only cost time
# What a notebook's JSON may hold, counted before it is parsed (_refuse_too_many_items). The released notebook
# holds 168 objects and lists and about 1 000 values (commas); one with 30 MB of text outputs, 51 and 300 000
# (a value a line). Jupyter writes each line of a source or an output as one string on a line of its own, at
# least 10 bytes in a notebook's indentation, so a 32 MiB notebook it saved holds at most about 3.4 million
# values; objects and lists come a few to a cell or output, and 500 000 leave room for 20 000 cells. At these
# bounds a parse takes at most about 250 MB and 2 s (objects) or 300 MB and 1.5 s (values); a bomb of empty
# objects under MAX_NOTEBOOK_BYTES took 5.7 GB and 41 s.
MAX_JSON_CONTAINERS = 500_000
MAX_JSON_VALUES = 4_000_000
# What the text of a string literal has besides plain characters: its escapes (those Python decodes; an unknown one
# such as \\q is plain text), a backslash-newline and a newline. An r-string has only newlines.
_STRING_PARTS = re.compile(
    r"\\(?:N\{[^}]*\}|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{1,3}|[\n\\'\"abfnrtv])|\n"
)
_RAW_STRING_PARTS = re.compile(r"\n")
# A JSON string, escapes and all; an unterminated one runs to the end of the text, so no text makes it backtrack.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)


@dataclass(frozen=True)
class StageCell:
    """What a notebook holds for one stage: its kernel source, or why there is none.

    Exactly one of `source` and `problem` is set, unless the stage is simply absent or untouched (then
    `attempted` is False and both may be None).
    """

    stage: str
    source: KernelSource | None
    problem: str | None
    attempted: bool


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """The notebook at `path`, or a NotebookError that says why it cannot be read.

    A hand-in is untrusted: the file is opened without following a symbolic link, must be a regular file of at most
    MAX_NOTEBOOK_BYTES, and every message names the file and the reason, never what the file holds.
    """
    name = path.name
    try:
        raw = read_regular_file(path, MAX_NOTEBOOK_BYTES)
    except FileNotFoundError:
        raise NotebookError(f"{name}: no such notebook") from None
    except OSError as error:
        if error.errno == errno.EINVAL:
            raise NotebookError(f"{name}: not a notebook file (a folder or a special file)") from None
        if error.errno == errno.EFBIG:
            raise NotebookError(
                f"{name}: larger than {MAX_NOTEBOOK_BYTES >> 20} MiB; clear the outputs and save it again"
            ) from None
        why = "a symbolic link, which the grader never follows" if error.errno == errno.ELOOP else error.strerror
        raise NotebookError(f"{name}: cannot be read ({why or 'an error of the file system'})") from None
    try:
        text = raw.decode("utf-8-sig")  # a byte order mark, which some editors write, is no part of the JSON
        _refuse_too_many_items(name, text)
        document = json.loads(text)  # parsed once: nbformat.reader.reads would parse it again
        if not isinstance(document, dict):
            raise NotebookError(f"{name}: not a readable notebook (its JSON is not an object with a list of cells)")
        major, minor = nbformat.reader.get_version(document)
        if major not in nbformat.versions:
            raise nbformat.NBFormatError(f"unsupported nbformat version {major}")
        notebook = nbformat.versions[major].to_notebook_json(document, minor=minor)
    except NotebookError:
        raise
    except UnicodeDecodeError:
        raise NotebookError(f"{name}: not a readable notebook (not UTF-8 text)") from None
    except Exception as error:  # nbformat and json raise many kinds for a damaged file, and their text quotes it
        raise NotebookError(f"{name}: not a readable notebook ({_unreadable_reason(error)})") from None
    if notebook.get("nbformat") != 4 or not isinstance(notebook.get("cells"), list):
        raise NotebookError(f"{name}: not a notebook of format 4 with a list of cells; save it with a current Jupyter")
    return notebook


def _refuse_too_many_items(name: str, text: str) -> None:
    """Refuse, before parsing it, JSON that would hold far more objects, lists or values than a notebook does
    (MAX_JSON_CONTAINERS, MAX_JSON_VALUES): a parsed empty object costs about 490 bytes and 3 microseconds.

    Counted at C speed on the text with its strings taken out: a comma stands for one value more, a brace or a
    bracket for one object or list.
    """
    structure = _JSON_STRING.sub("", text)
    counts = (
        (structure.count("{") + structure.count("["), MAX_JSON_CONTAINERS, "objects and lists"),
        (structure.count(","), MAX_JSON_VALUES, "values"),
    )
    for count, bound, what in counts:
        if count > bound:
            raise NotebookError(
                f"{name}: not a readable notebook (its JSON holds {count:,} {what}, more than the {bound:,} a "
                "notebook may hold; clear the outputs and save it again)"
            )


def _unreadable_reason(error: Exception) -> str:
    if isinstance(error, RecursionError):
        return "nested too deeply"
    if isinstance(error, (json.JSONDecodeError, nbformat.reader.NotJSONError)):
        return "not JSON"
    if isinstance(error, nbformat.NBFormatError):
        return "an unknown notebook format version"
    return "not in the notebook format: open it in Jupyter and save it again"


def stage_cells(path: Path, notebook: nbformat.NotebookNode | None = None) -> dict[str, StageCell]:
    """Every stage's cell in the notebook at `path`, keyed by stage id, in catalogue order.

    A notebook whose cells are not of the format's types raises NotebookError: a hand-in of any shape gets its
    student a verdict, never a failure of the grader.
    """
    notebook = notebook if notebook is not None else read_notebook(path)
    try:
        found: dict[str, list[int]] = {}
        for index, cell in enumerate(notebook.cells):
            grade_id = _grade_id(cell)
            if grade_id in STAGE_IDS:
                found.setdefault(grade_id, []).append(index)
        return {stage_id: _stage_cell(path, notebook, stage_id, found.get(stage_id, [])) for stage_id in STAGE_IDS}
    except (AttributeError, TypeError, KeyError, ValueError, RecursionError) as error:
        raise NotebookError(f"{path.name}: its cells are not in the notebook format ({type(error).__name__})") from None


def _grade_id(cell: object) -> str | None:
    """A cell's nbgrader grade_id; None where the cell, its metadata or the id is not of the format's types."""
    metadata = cell.get("metadata") if isinstance(cell, dict) else None
    nbgrader = metadata.get("nbgrader") if isinstance(metadata, dict) else None
    grade_id = nbgrader.get("grade_id") if isinstance(nbgrader, dict) else None
    return grade_id if isinstance(grade_id, str) else None


def _stage_cell(path: Path, notebook: nbformat.NotebookNode, stage_id: str, indices: list[int]) -> StageCell:
    if not indices:
        return StageCell(stage_id, None, f"no cell has grade_id '{stage_id}'", attempted=False)
    if len(indices) > 1:
        cells = ", ".join(str(i + 1) for i in indices)
        problem = f"cells {cells} all have grade_id '{stage_id}'; keep exactly one"
        return StageCell(stage_id, None, problem, attempted=True)
    index = indices[0]
    cell = notebook.cells[index]
    where = f"{path.name}, cell {index + 1} ('{stage_id}')"
    if cell.get("cell_type") != "code":
        return StageCell(stage_id, None, f"{where} is not a code cell", attempted=True)
    if not isinstance(cell.get("source"), str):
        return StageCell(stage_id, None, f"{where}: its source is not text", attempted=True)
    if len(cell["source"]) > MAX_CELL_CHARS:
        problem = f"{where}: {len(cell['source'])} characters, more than the {MAX_CELL_CHARS} a kernel cell may hold"
        return StageCell(stage_id, None, problem, attempted=True)
    try:
        text, cell_lines = kernel_literal_lines(cell["source"])
    except NotebookError as error:
        return StageCell(stage_id, None, f"{where}: {error}", attempted=True)
    if is_untouched(stage_id, text):
        return StageCell(stage_id, None, None, attempted=False)
    location = SourceLocation.of_lines(path.name, stage_id, index, cell_lines)
    return StageCell(stage_id, KernelSource(text=text, location=location), None, attempted=True)


def kernel_literal_lines(cell_source: str) -> tuple[str, tuple[int, ...]]:
    """The string literal a kernel cell assigns, and the cell line each of its lines starts on.

    Raises NotebookError naming the line when the cell is not exactly one string-literal assignment.
    """
    # Python reads a carriage return, alone or before a newline, as a newline, inside strings too: so does the map.
    cell_source = cell_source.replace("\r\n", "\n").replace("\r", "\n")
    try:
        tree = ast.parse(cell_source)
    except SyntaxError as error:
        where = f"line {error.lineno}: " if error.lineno else ""
        raise NotebookError(f"{where}Python syntax error ({error.msg})") from None
    except (ValueError, RecursionError, MemoryError):  # a null byte, a lone surrogate; nesting too deep to parse
        raise NotebookError(
            "the cell cannot be read as Python: it holds a null byte, a lone surrogate or absurdly deep nesting"
        ) from None
    statements = tree.body
    if not statements:
        raise NotebookError("the cell holds no kernel: assign the CUDA source to a name, as a string literal")
    if len(statements) > 1:
        raise NotebookError(
            f"line {statements[1].lineno}: the cell must hold only the kernel's string assignment; "
            "move other code to another cell"
        )
    statement = statements[0]
    # One assignment to one name: not `a = b = ...`, `a.b = ...`, `a[0] = ...` or `a, b = ...`.
    targets = statement.targets if isinstance(statement, ast.Assign) else [getattr(statement, "target", None)]
    one_name = len(targets) == 1 and isinstance(targets[0], ast.Name)
    value = statement.value if one_name and isinstance(statement, (ast.Assign, ast.AnnAssign)) else None
    if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
        raise NotebookError(
            f"line {statement.lineno}: the kernel must be a plain string literal assigned to a name "
            '(r"""..."""); the grader never runs notebook code, so calls, f-strings and names are not allowed'
        )
    if not value.value.isascii():
        try:
            value.value.encode("utf-8")
        except UnicodeEncodeError:
            raise NotebookError(
                f"line {value.lineno}: the kernel holds a character that is not valid Unicode (a lone surrogate, "
                "from an escape such as \\ud800); delete it"
            ) from None
    return value.value, _line_starts(_assigned_strings(cell_source))


def _assigned_strings(cell_source: str) -> list[tokenize.TokenInfo]:
    """The tokens of the string literals a kernel cell assigns (one, or several side by side): those after its
    last `=`, since what follows that is the value, which holds no `=`."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(cell_source).readline))
    except (tokenize.TokenError, SyntaxError):  # the cell parsed, so not expected: still a verdict, never a crash
        raise NotebookError("the cell cannot be read as Python tokens") from None
    assignment = max(index for index, token in enumerate(tokens) if token.exact_type == tokenize.EQUAL)
    return [token for token in tokens[assignment + 1 :] if token.type == tokenize.STRING]


def _line_starts(strings: list[tokenize.TokenInfo]) -> tuple[int, ...]:
    """The cell line each line of the text of `strings` starts on: that of its first character, or of the
    newline that ends it where it is empty (the last line: the closing quote's)."""
    starts: list[int] = []
    line_started = False
    for token in strings:
        for is_newline, cell_line in _string_parts(token):
            if not line_started:
                starts.append(cell_line)
            line_started = not is_newline
    if not line_started:
        starts.append(strings[-1].end[0])
    return tuple(starts)


def _string_parts(token: tokenize.TokenInfo) -> Iterator[tuple[bool, int]]:
    """For each part of a string literal's text, in order: whether it is a newline, and the cell line it is on.

    A newline of the cell inside triple quotes is one of the text too; an escape such as \\n is one on the same
    cell line; a backslash-newline (outside an r-string) is a cell line and no text.
    """
    literal = token.string
    prefix = len(literal) - len(literal.lstrip("rRuU"))
    quotes = 3 if literal[prefix : prefix + 3] in ('"""', "'''") else 1
    body = literal[prefix + quotes : len(literal) - quotes]
    parts = _RAW_STRING_PARTS if "r" in literal[:prefix].lower() else _STRING_PARTS
    cell_line = token.start[0]
    done = 0
    for part in parts.finditer(body):
        if part.start() > done:
            yield False, cell_line
        done = part.end()
        if part.group() == "\\\n":
            cell_line += 1
        elif part.group() == "\n":
            yield True, cell_line
            cell_line += 1
        else:
            yield codecs.decode(part.group(), "unicode_escape") == "\n", cell_line
    if done < len(body):
        yield False, cell_line


def is_untouched(stage_id: str, text: str) -> bool:
    """True when `text` is empty or still the released stub of the stage (whitespace aside)."""
    compact = "".join(text.split())
    return not compact or compact == "".join(get_stage(stage_id).stub_source().split())


def kernel_cell(stage_id: str, kernel: str, variable: str | None = None) -> nbformat.NotebookNode:
    """A kernel cell in the contract's format, as the released notebook and the example hand-ins hold it."""
    name = variable or f"{stage_id.upper()}_SOURCE"
    body = kernel if kernel.startswith("\n") else "\n" + kernel
    cell = nbformat.v4.new_code_cell(f'{name} = r"""{body}"""\n')
    cell.metadata["nbgrader"] = {
        "grade": False,
        "grade_id": stage_id,
        "locked": False,
        "schema_version": NBGRADER_SCHEMA_VERSION,
        "solution": True,
        "task": False,
    }
    return cell
