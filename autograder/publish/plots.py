"""The charts of the published pages, drawn by matplotlib into SVG that the pages carry inline.

Figures are made with `matplotlib.figure.Figure`, never pyplot, so no GUI backend and no global state is
touched; text is drawn as paths, so a chart looks the same in any browser without its fonts; and the SVG ids
come from a fixed salt, so the same data gives the same file.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure

_RC = {"svg.fonttype": "path", "svg.hashsalt": "autograder", "font.size": 9.0}
_YOURS = "#3b6fb6"
_REFERENCE = "#e08a2c"
_CEILING = "#b03a2e"
_CUB = "#2e8b57"


@dataclass(frozen=True)
class Chart:
    """One chart: its SVG text and a sentence that describes it for people who cannot see it."""

    name: str  # a file-name stem: "scores", "speedups", ...
    alt: str
    svg: str

    @property
    def data_uri(self) -> str:
        # A data URI rather than inline <svg>: each chart keeps its own id space, so two charts on one page
        # cannot capture each other's clip paths.
        return "data:image/svg+xml;base64," + base64.b64encode(self.svg.encode("utf-8")).decode("ascii")


@dataclass(frozen=True)
class StageSeries:
    """Per stage, the class's values (or one student's) and the reference lines to draw over them."""

    label: str
    values: Sequence[float]
    required: float | None = None  # the rubric's bound: the required speedup, the slowest allowed ratio
    reference: float | None = None  # the reference kernel's own value, where known


def _render(figure: Figure) -> str:
    buffer = io.StringIO()
    with matplotlib.rc_context(_RC):
        figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    return buffer.getvalue()


def _figure(width: float, height: float, columns: int = 1) -> tuple[Figure, list[Axes]]:
    with matplotlib.rc_context(_RC):
        figure = Figure(figsize=(width, height), layout="constrained")
        axes = figure.subplots(1, columns, squeeze=False)[0]
    return figure, list(axes)


def score_distribution(totals: Sequence[float], max_total: float) -> Chart:
    figure, (axes,) = _figure(6.0, 2.8)
    top = max_total if max_total > 0 else max(totals, default=1.0) or 1.0
    bins = min(20, max(5, len(totals)))
    axes.hist(list(totals), bins=bins, range=(0.0, top), color=_YOURS, edgecolor="white")
    axes.set_xlabel(f"total score (of {top:g})")
    axes.set_ylabel("students")
    axes.yaxis.get_major_locator().set_params(integer=True)
    axes.set_title("Distribution of total scores")
    mean = sum(totals) / len(totals) if totals else 0.0
    axes.axvline(mean, color=_REFERENCE, linestyle="--", label=f"mean {mean:.1f}")
    axes.legend(loc="upper left", frameon=False)
    return Chart("scores", f"Histogram of {len(totals)} total scores out of {top:g}; mean {mean:.1f}.",
                 _render(figure))


def stage_speedups(
    steps: Sequence[StageSeries], versus_reference: Sequence[StageSeries], title: str, name: str
) -> Chart:
    """Left: each stage's speedup over its baseline, with the required speedup and the reference's own step.
    Right: reference time / the student's time, where 1 means as fast as the reference kernel.

    With one value per stage (one student) the points are bars; with a class they are a strip of dots.
    """
    figure, (left, right) = _figure(10.0, 3.4, columns=2)
    _strip(left, steps, "speedup over the previous stage (x)", "required")
    left.set_title("Speedup per stage")
    _strip(right, versus_reference, "reference time / your time", "slowest allowed")
    right.axhline(1.0, color="grey", linewidth=0.8)
    right.set_title("Against the reference kernel")
    figure.suptitle(title)
    measured = sum(len(s.values) for s in steps)
    return Chart(name, f"{title}: speedups of {len(steps)} stages ({measured} measured values) and the time "
                       "against the reference kernel.", _render(figure))


def _strip(axes: Axes, series: Sequence[StageSeries], ylabel: str, required_label: str) -> None:
    positions = range(len(series))
    single = all(len(s.values) <= 1 for s in series)
    for x, item in zip(positions, series, strict=True):
        if single and item.values:
            axes.bar(x, item.values[0], width=0.6, color=_YOURS, label="yours" if x == 0 else None)
        elif item.values:
            spread = [x + 0.25 * ((i % 7) - 3) / 3 for i in range(len(item.values))]
            axes.scatter(spread, item.values, s=14, color=_YOURS, alpha=0.7, label="students" if x == 0 else None)
        if item.required is not None:
            axes.hlines(item.required, x - 0.4, x + 0.4, colors=_CEILING, linewidth=2,
                        label=required_label if x == _first(series, "required") else None)
        if item.reference is not None:
            axes.scatter([x], [item.reference], marker="D", s=30, color=_REFERENCE, zorder=3,
                         label="reference" if x == _first(series, "reference") else None)
    axes.set_xticks(list(positions), [s.label for s in series], rotation=30, ha="right")
    axes.set_ylabel(ylabel)
    highest = max([v for s in series for v in s.values]
                  + [v for s in series for v in (s.required, s.reference) if v is not None] + [1.0])
    axes.set_ylim(0, highest * 1.3)  # headroom for the legend above the data
    if axes.get_legend_handles_labels()[0]:
        axes.legend(loc="upper left", frameon=False, fontsize=8)


def _first(series: Sequence[StageSeries], attribute: str) -> int | None:
    """The position of the first stage that has `attribute`, so each legend entry is drawn once."""
    return next((i for i, s in enumerate(series) if getattr(s, attribute) is not None), None)


@dataclass(frozen=True)
class BandwidthEntry:
    name: str
    gbps: float
    device: str


def bandwidth_ceiling(entries: Sequence[BandwidthEntry], cub: dict[str, float], peak: dict[str, float]) -> Chart:
    """The top entries' bandwidth, with CUB's and the datasheet peak of their GPUs as vertical lines."""
    figure, (axes,) = _figure(7.0, 0.9 + 0.32 * max(1, len(entries)))
    ordered = list(reversed(entries))  # barh draws bottom-up; the best entry goes on top
    axes.barh([e.name for e in ordered], [e.gbps for e in ordered], color=_YOURS)
    for index, (device, value) in enumerate(sorted(cub.items())):
        axes.axvline(value, color=_CUB, linestyle="--", label=f"CUB (cupy.sum) {device}: {value:,.0f} GB/s"
                     if index < 3 else None)
    for index, (device, value) in enumerate(sorted(peak.items())):
        axes.axvline(value, color=_CEILING, label=f"peak {device}: {value:,.0f} GB/s" if index < 3 else None)
    right = max([e.gbps for e in entries] + list(cub.values()) + list(peak.values()) + [1.0])
    axes.set_xlim(0, right * 1.08)
    axes.set_xlabel("GB/s (input bytes / median time)")
    axes.set_title("Fastest verified kernels against CUB and the memory-bandwidth ceiling")
    if axes.get_legend_handles_labels()[0]:
        axes.legend(loc="lower right", fontsize=7, framealpha=0.9)
    return Chart("bandwidth", f"Bandwidth of the top {len(entries)} entries, with CUB's and the peak memory "
                              "bandwidth as lines.", _render(figure))
