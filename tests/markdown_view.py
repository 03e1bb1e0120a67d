"""Markdown pages as a permissive viewer shows them: CommonMark with raw HTML allowed (as some LMS plugins do),
GitHub's tables and strikethrough."""

from __future__ import annotations

import re
from collections import Counter
from html import unescape

from markdown_it import MarkdownIt

_VIEWER = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
_VIEWER.validateLink = lambda url: True  # markdown-it drops javascript: links itself; a plugin may not


def as_html(markdown: str) -> str:
    return _VIEWER.render(markdown)


def elements(markdown: str) -> Counter[str]:
    """The HTML elements the viewer makes of `markdown`, counted by name."""
    return Counter(re.findall(r"<([A-Za-z][A-Za-z0-9]*)", as_html(markdown)))


def shown_text(markdown: str) -> str:
    """The text a reader sees, white space collapsed."""
    return " ".join(unescape(re.sub(r"<[^>]*>", " ", as_html(markdown))).split())
