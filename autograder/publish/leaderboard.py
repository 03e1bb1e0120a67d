"""The class leaderboard: a pandas table of every student, ranked, written as CSV, Markdown and HTML.

Ranking: total score first, then the bandwidth of the student's fastest verified 1-D kernel (correct, no
findings), so that among equal scores the faster code wins; results without timings (the CPU backend) tie on
speed and are ranked by score alone. The optional open stage has its own ranking: bandwidth as a fraction of
CUB (`cupy.sum`) on the same GPU, or plain GB/s where the calibration has no CUB figure for a GPU.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from autograder import __version__
from autograder.publish.figures import (
    Ceilings,
    all_figures,
    best_verified,
    fmt_number,
    load_ceilings,
    speed_series,
    stage_figures,
)
from autograder.publish.plots import (
    BandwidthEntry,
    Chart,
    bandwidth_ceiling,
    score_distribution,
    stage_speedups,
)
from autograder.publish.pseudonyms import pseudonyms, resolve_salt
from autograder.publish.render import Table, markdown_table, render, write_text
from autograder.publish.results import load_results, results_folder
from autograder.records import Status, StudentResult
from autograder.spreadsheets import csv_text
from autograder.stages import STAGES, Stage

RANKED_STAGES: tuple[Stage, ...] = tuple(stage for stage in STAGES if not stage.optional)
OPEN_STAGES: tuple[Stage, ...] = tuple(stage for stage in STAGES if stage.optional)
BY_CUB = "fraction of CUB"
BY_GBPS = "GB/s"


@dataclass(frozen=True)
class Leaderboard:
    """The ranked tables and what a reader must know about them."""

    board: pd.DataFrame  # one row per student, best first
    open_board: pd.DataFrame  # one row per verified, measured open-stage kernel, best first
    open_basis: str  # BY_CUB or BY_GBPS
    notes: tuple[str, ...]  # caveats shown above the tables: no timings, no CUB figure, mixed GPUs


def build_leaderboard(results: Sequence[StudentResult], names: dict[str, str], ceilings: Ceilings) -> Leaderboard:
    """The leaderboard of `results`, each student shown under `names[student]`."""
    rows = [_student_row(result, names[result.student]) for result in results]
    board = _ranked(pd.DataFrame(rows, columns=_board_columns()), ["total", "best_gbps"])
    open_rows = [row for result in results for row in _open_rows(result, names[result.student], ceilings)]
    open_board = pd.DataFrame(open_rows, columns=_open_columns())
    missing_cub = sorted(set(open_board["device"][open_board["cub_gbps"].isna()]))
    open_basis = BY_GBPS if missing_cub else BY_CUB
    open_board = _ranked(open_board, ["cub_fraction" if open_basis == BY_CUB else "gbps"])
    return Leaderboard(board, open_board, open_basis, _notes(results, missing_cub))


def _board_columns() -> list[str]:
    columns = ["rank", "name", "device", "total", "max_total", "best_stage", "best_ms", "best_gbps"]
    for stage in RANKED_STAGES:
        columns += [f"{stage.id}_status", f"{stage.id}_ms", f"{stage.id}_gbps", f"{stage.id}_speedup"]
    return columns


def _open_columns() -> list[str]:
    return ["rank", "name", "device", "stage", "ms", "gbps", "cub_gbps", "cub_fraction", "peak_gbps",
            "peak_fraction"]


def _student_row(result: StudentResult, name: str) -> dict[str, object]:
    best = best_verified(result)
    row: dict[str, object] = {
        "rank": 0,
        "name": name,
        "device": result.device.name,
        "total": result.total,
        "max_total": result.max_total,
        "best_stage": best.stage.id if best else None,
        "best_ms": best.yours.median_ms if best and best.yours else math.nan,
        "best_gbps": best.yours.gbps if best and best.yours else math.nan,
    }
    for figures in (stage_figures(result, stage) for stage in RANKED_STAGES):
        shown = figures.yours if figures.status is Status.CORRECT else None
        row[f"{figures.stage.id}_status"] = figures.state if shown is None else "measured"
        row[f"{figures.stage.id}_ms"] = shown.median_ms if shown else math.nan
        row[f"{figures.stage.id}_gbps"] = shown.gbps if shown else math.nan
        speedup = figures.speedup if shown else None
        row[f"{figures.stage.id}_speedup"] = speedup if speedup is not None else math.nan
    return row


def _open_rows(result: StudentResult, name: str, ceilings: Ceilings) -> list[dict[str, object]]:
    rows = []
    for stage in OPEN_STAGES:
        figures = stage_figures(result, stage)
        if not (figures.verified and figures.yours):
            continue
        cub = ceilings.cub_for(result.device.name)
        peak = ceilings.peak_for(result.device.name)
        gbps = figures.yours.gbps
        rows.append({
            "rank": 0, "name": name, "device": result.device.name, "stage": stage.id,
            "ms": figures.yours.median_ms, "gbps": gbps,
            "cub_gbps": cub if cub else math.nan, "cub_fraction": gbps / cub if cub else math.nan,
            "peak_gbps": peak if peak else math.nan, "peak_fraction": gbps / peak if peak else math.nan,
        })
    return rows


def _ranked(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Sorted best first (higher is better for every key; a missing number ranks last), with competition
    ranks (1, 2, 2, 4): rows equal on every key share a rank and are listed by name."""
    if frame.empty:
        return frame
    ordered = frame.sort_values(keys + ["name"], ascending=[False] * len(keys) + [True], na_position="last")
    ordered = ordered.reset_index(drop=True)
    # NaN never equals NaN, so missing numbers become a sentinel below every real value before comparing.
    key_rows = list(ordered[keys].fillna(-math.inf).itertuples(index=False, name=None))
    ranks = [1]
    for position in range(1, len(key_rows)):
        ranks.append(ranks[-1] if key_rows[position] == key_rows[position - 1] else position + 1)
    ordered["rank"] = ranks
    return ordered


def _notes(results: Sequence[StudentResult], missing_cub: list[str]) -> tuple[str, ...]:
    notes = []
    unmeasured = sum(1 for r in results if not any(f.measured for f in all_figures(r)))
    if unmeasured:
        notes.append(f"{unmeasured} of {len(results)} results have no timings (CPU backend, or nothing correct): "
                     "their speed is not measured and they are ranked by score only.")
    gpus = Counter(r.device.name for r in results if r.device.backend == "gpu")
    if len(gpus) > 1:
        notes.append("Results come from several GPU models (" + ", ".join(sorted(gpus)) + "): speeds of "
                     "different GPUs are not comparable.")
    if missing_cub:
        notes.append("The calibration has no CUB (cupy.sum) figure for " + ", ".join(missing_cub) + ": the open "
                     "stage is ranked by GB/s instead of by its fraction of CUB.")
    return tuple(notes)


def display_table(board: pd.DataFrame, grouped: bool) -> Table:
    """The board for people. `grouped`: stage titles as header groups over short columns (HTML); otherwise
    each column carries the stage id (Markdown has no header groups)."""
    columns = ["Rank", "Name", "Score", "Fastest verified"]
    groups: list[tuple[str, int]] = [("", 4)]
    for stage in RANKED_STAGES:
        prefix = "" if grouped else f"{stage.id} "
        columns += [f"{prefix}ms", f"{prefix}GB/s", f"{prefix}speedup"]
        groups.append((f"{stage.number}. {stage.title}", 3))
    rows = []
    for row in board.itertuples(index=False):
        record = row._asdict()
        best = (f"{fmt_number(record['best_gbps'], 4)} GB/s ({record['best_stage']})"
                if isinstance(record["best_stage"], str) else "not measured")
        cells = [str(record["rank"]), str(record["name"]),
                 f"{record['total']:g} / {record['max_total']:g}", best]
        for stage in RANKED_STAGES:
            if record[f"{stage.id}_status"] != "measured":
                cells += [str(record[f"{stage.id}_status"]), "", ""]
                continue
            speedup = record[f"{stage.id}_speedup"]
            cells += [fmt_number(record[f"{stage.id}_ms"], 4), fmt_number(record[f"{stage.id}_gbps"], 4),
                      f"{fmt_number(speedup)}x" if not math.isnan(speedup) else ""]
        rows.append(cells)
    numeric = [True, False, True, True] + [True] * (3 * len(RANKED_STAGES))
    return Table(columns, rows, groups if grouped else (), numeric, name="board")


def open_table(open_board: pd.DataFrame) -> Table:
    columns = ["Rank", "Name", "GPU", "ms", "GB/s", "% of CUB", "% of peak"]
    rows = [[str(r.rank), str(r.name), str(r.device), fmt_number(r.ms, 4), fmt_number(r.gbps, 4),
             _percent(r.cub_fraction), _percent(r.peak_fraction)] for r in open_board.itertuples(index=False)]
    return Table(columns, rows, numeric=[True, False, False, True, True, True, True], name="open-board")


def _percent(fraction: float) -> str:
    return "" if math.isnan(fraction) else f"{100 * fraction:.1f}%"


def charts(results: Sequence[StudentResult], board: pd.DataFrame, ceilings: Ceilings, top: int) -> list[Chart]:
    """The page's charts: scores always; speedups and bandwidth only where something was measured."""
    max_total = max((r.max_total for r in results), default=0.0)
    drawn = [score_distribution([r.total for r in results], max_total)]
    per_student = [all_figures(r) for r in results]
    steps, versus = speed_series(per_student, RANKED_STAGES)
    if any(s.values for s in steps + versus):
        drawn.append(stage_speedups(steps, versus, "The class's speedups", "speedups"))
    measured = board[board["best_gbps"].notna()].sort_values("best_gbps", ascending=False).head(top)
    if not measured.empty:
        entries = [BandwidthEntry(str(r.name), float(r.best_gbps), str(r.device))
                   for r in measured.itertuples(index=False)]
        devices = {e.device for e in entries}
        cub = {d: v for d in devices if (v := ceilings.cub_for(d))}
        peak = {d: v for d in devices if (v := ceilings.peak_for(d))}
        drawn.append(bandwidth_ceiling(entries, cub, peak))
    return drawn


def write_leaderboard(
    board: Leaderboard, results: Sequence[StudentResult], ceilings: Ceilings, out: Path, title: str, top: int,
    pseudonymous: bool,
) -> list[Path]:
    """leaderboard.csv, leaderboard-open.csv, leaderboard.md and leaderboard.html in `out`."""
    written = [write_text(out / name, csv_text(table, float_format="%.6g"))
               for name, table in (("leaderboard.csv", board.board), ("leaderboard-open.csv", board.open_board))]
    context = {
        "title": title,
        "version": __version__,
        "students": len(results),
        "pseudonymous": pseudonymous,
        "notes": board.notes,
        "open_basis": board.open_basis,
        "open_stage": OPEN_STAGES[0] if OPEN_STAGES else None,
        "open_table": open_table(board.open_board),
    }
    written.append(write_text(out / "leaderboard.md", render(
        "leaderboard.md.j2", board_table=markdown_table(display_table(board.board, grouped=False)), **context)))
    written.append(write_text(out / "leaderboard.html", render(
        "leaderboard.html.j2", board_table=display_table(board.board, grouped=True),
        charts=charts(results, board.board, ceilings, top), **context)))
    return written


def main(
    results_path: Path,
    out: Path | None = None,
    *,
    use_pseudonyms: bool = True,
    salt: str | None = None,
    salt_file: Path | None = None,
    calibrations: Sequence[Path] = (),
    cub_gbps: float | None = None,
    peak_gbps: float | None = None,
    top: int = 10,
    title: str = "Parallel reduction: class leaderboard",
) -> list[Path]:
    """Read the results, build the leaderboard and write it; the files written, for the command to list."""
    results = load_results(results_path)
    folder = results_folder(results_path)
    if use_pseudonyms:
        names = pseudonyms([r.student for r in results], resolve_salt(folder, salt, salt_file))
    else:
        names = {r.student: r.student for r in results}
    ceilings = load_ceilings(calibrations, cub_gbps, peak_gbps, {r.device.name for r in results})
    board = build_leaderboard(results, names, ceilings)
    return write_leaderboard(board, results, ceilings, out or folder / "leaderboard", title, top, use_pseudonyms)
