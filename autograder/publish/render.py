"""Templates and tables shared by the published pages.

Pages are Jinja2 templates in `autograder/templates/`. HTML pages are self-contained: inline CSS, charts as
data URIs, and a Content-Security-Policy that forbids every fetch, so a page that would need the network
shows the gap at once instead of working only on a connected machine.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from autograder.errors import GraderError


@dataclass(frozen=True)
class Table:
    """A table for people: formatted cells, with optional header groups (a stage over its three columns)."""

    columns: Sequence[str]
    rows: Sequence[Sequence[str]]
    groups: Sequence[tuple[str, int]] = ()  # (label, number of columns it spans), HTML only
    numeric: Sequence[bool] = field(default=())  # right-aligned columns
    name: str = "table"  # the CSS class and the browser tests' handle

    def is_numeric(self, index: int) -> bool:
        return index < len(self.numeric) and self.numeric[index]


class Markdown(str):
    """Text that is Markdown already (a rendered table): a Markdown template writes it as it is."""


# Outside words an underscore opens or closes emphasis; between two letters or digits it cannot (CommonMark).
_MARKDOWN_SYNTAX = re.compile(r"[\\`*\[\]#|~]|(?<![^\W_])_|_(?![^\W_])")
_HTML_SYNTAX = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def markdown_text(text: object) -> Markdown:
    """`text` as Markdown that shows it as it is, one line: nothing in it can make HTML, a link, an image, a code
    span, emphasis, a heading or a table cell.

    The one rule for every piece of text a Markdown page shows (student ids, compiler messages, kernel lines,
    anything read from a result file): runs of white space become one space; `&`, `<` and `>` become HTML
    entities, which every Markdown renderer passes on as text; a backslash goes before `\\`, a backtick, `*`,
    `[`, `]`, `#`, `|`, `~`, and before `_` except between two letters or digits. Parentheses and `!` stay as
    they are: without a bracket they make no link or image.
    """
    line = " ".join(str(text).split())
    line = "".join(_HTML_SYNTAX.get(character, character) for character in line)
    return Markdown(_MARKDOWN_SYNTAX.sub(lambda match: "\\" + match.group(0), line))


def markdown_table(table: Table) -> Markdown:
    """GitHub-flavoured Markdown; every cell is `markdown_text`, so a message cannot break out of its cell."""
    return Markdown(_table(table, markdown_text))


def text_table(table: Table) -> str:
    """The same table for a terminal (the pytest plugin's failure text): each cell on one line, its pipes escaped,
    nothing else, so that a student reads `sdata[16]` as the kernel has it."""
    return _table(table, lambda text: " ".join(str(text).split()).replace("|", "\\|"))


def _table(table: Table, cell: Callable[[str], str]) -> str:
    if not table.rows:
        return "_(none)_"

    def shown(text: object) -> str:
        return cell(str(text)) or " "

    lines = ["| " + " | ".join(shown(c) for c in table.columns) + " |"]
    lines.append("|" + "|".join("---:" if table.is_numeric(i) else "---" for i in range(len(table.columns))) + "|")
    lines += ["| " + " | ".join(shown(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


def _markdown_value(value: object) -> Markdown:
    """What a `{{ ... }}` of a Markdown template writes: text escaped, rendered Markdown as it is."""
    return value if isinstance(value, Markdown) else markdown_text(value)


_SETTINGS: dict[str, Any] = {
    "loader": jinja2.PackageLoader("autograder", "templates"),
    "undefined": jinja2.StrictUndefined,  # a misspelt variable is a bug, not an empty cell
    "trim_blocks": True,
    "lstrip_blocks": True,
    "keep_trailing_newline": True,
}
_HTML = jinja2.Environment(autoescape=True, **_SETTINGS)
# Markdown has no autoescape of its own: every value goes through markdown_text unless it is Markdown already.
_MARKDOWN = jinja2.Environment(autoescape=False, finalize=_markdown_value, **_SETTINGS)
_MARKDOWN.filters["md_table"] = markdown_table


def render(template: str, **context: Any) -> str:
    """A page from `template`: a `.md.j2` template escapes as Markdown, any other as HTML."""
    environment = _MARKDOWN if template.endswith(".md.j2") else _HTML
    return environment.get_template(template).render(**context)


class OutputError(GraderError):
    """A page or export cannot be written where it should go."""


def write_text(path: Path, text: str) -> Path:
    """Write `text` to `path`, making its folder; a folder that is a file, or that cannot be written, stops the
    command with the path named."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        blocker = next((f for f in (path.parent, *path.parent.parents) if f.exists() and not f.is_dir()), None)
        reason = f"{blocker} is not a folder" if blocker else error.strerror
        raise OutputError(f"cannot write {path} ({reason}); give an --out folder that can be written") from None
    return path
