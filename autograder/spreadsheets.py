"""The CSV files a TA opens in a spreadsheet (grades, exports, leaderboards): no cell can run there as a formula.

A student id, a notebook's name or a message comes from a hand-in, and a spreadsheet takes a cell that starts
with `=`, `+`, `-`, `@`, a tab or a carriage return for a formula (CSV injection: `=HYPERLINK(...)` as a name).
Such text cells are written with a leading apostrophe, as OWASP recommends, which spreadsheets show as text;
numbers, and numbers written as text (`-2.5`), stay as they are.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value: Any) -> Any:
    """`value` as a spreadsheet may show it without running it."""
    if not isinstance(value, str) or not value.startswith(FORMULA_START):
        return value
    try:
        float(value)
    except ValueError:
        return f"'{value}"
    return value if value == value.strip() else f"'{value}"  # a plain number, such as -2.5


def neutralised(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with every text cell that a spreadsheet would run made plain text."""
    return frame.map(safe_cell)


def csv_text(frame: pd.DataFrame, float_format: str | None = None) -> str:
    """`frame` as CSV text that is safe to open in a spreadsheet."""
    return neutralised(frame).to_csv(index=False, float_format=float_format)
