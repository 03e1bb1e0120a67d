"""Templates and tables shared by the published pages.

Pages are Jinja2 templates in `autograder/templates/`. HTML pages are self-contained: inline CSS, charts as
data URIs, and a Content-Security-Policy that forbids every fetch, so a page that would need the network
shows the gap at once instead of working only on a connected machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2


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


def markdown_table(table: Table) -> str:
    """GitHub-flavoured Markdown; pipes in cells are escaped so a message cannot break the table."""
    if not table.rows:
        return "_(none)_"

    def cell(text: str) -> str:
        return " ".join(str(text).split()).replace("|", "\\|") or " "

    lines = ["| " + " | ".join(cell(c) for c in table.columns) + " |"]
    lines.append("|" + "|".join("---:" if table.is_numeric(i) else "---" for i in range(len(table.columns))) + "|")
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


_ENVIRONMENT = jinja2.Environment(
    loader=jinja2.PackageLoader("autograder", "templates"),
    autoescape=jinja2.select_autoescape(enabled_extensions=("html", "html.j2"), default_for_string=False),
    undefined=jinja2.StrictUndefined,  # a misspelt variable is a bug, not an empty cell
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)
_ENVIRONMENT.filters["md_table"] = markdown_table


def render(template: str, **context: Any) -> str:
    return _ENVIRONMENT.get_template(template).render(**context)


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
