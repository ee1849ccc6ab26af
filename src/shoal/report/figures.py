"""Charts as inline SVG text, drawn by matplotlib on a bare `Figure` (no pyplot state).

Text stays text in the SVG (`svg.fonttype = none`: smaller, searchable, drawn in
the page's font) and ids are salted alike every time, so the same data gives
the same page. A series longer than `MAX_POINTS` is thinned by an even stride
that keeps the first and last points: a 100k-line metrics.jsonl draws as fast
as a short one, and no screen shows more points than it has pixels.

Layout: a chart alone in its panel is drawn `wide` (twice the width, the same
height), so it fills a wide screen's row instead of leaving its right half empty;
legends sit above the axes, where they cannot cover a line or a bar; bars of
ranks are horizontal (one row per rank, labels read without rotating).
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib
from matplotlib.figure import Figure

MAX_POINTS = 1500
WIDTH, WIDE, HEIGHT = 6.4, 12.8, 3.0  # inches: a chart, a wide one (alone in its row)
STYLE: Any = {  # rcParams (Any: matplotlib types the keys as literals)
    "svg.fonttype": "none",
    "svg.hashsalt": "shoal-report",
    # labels are names from a run's files (metrics, splits, run folders): a "$" is a
    # dollar sign, never TeX that matplotlib would parse (and fail on: "acc$\\frac{$")
    "text.parse_math": False,
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 8,
    "legend.frameon": False,
}


@dataclass
class Series:
    """One line: `style` "-" (training), "--" (validation), "o-" (sparse points)."""

    label: str
    xs: list[float]
    ys: list[float]
    style: str = "-"
    color: str | None = None


def thin(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if _finite(x) and _finite(y)]
    if len(pairs) > MAX_POINTS:
        stride = math.ceil(len(pairs) / MAX_POINTS)
        pairs = pairs[::stride] + ([pairs[-1]] if (len(pairs) - 1) % stride else [])
    return [p[0] for p in pairs], [p[1] for p in pairs]


def lines(
    series: Sequence[Series], xlabel: str, ylabel: str, log_y: bool = False, wide: bool = False
) -> str:
    """A line chart of `series` (empty series are left out)."""
    with matplotlib.rc_context(STYLE):
        figure = Figure(figsize=(WIDE if wide else WIDTH, HEIGHT))
        axes = figure.add_subplot()
        labelled = 0
        for s in series:
            xs, ys = thin(s.xs, s.ys)
            if not xs:
                continue
            labelled += bool(s.label)
            marker = "o" if "o" in s.style or len(xs) < 3 else None
            line = "--" if "--" in s.style else "-"
            axes.plot(xs, ys, line, marker=marker, ms=3, lw=1.3, label=s.label, color=s.color)
        if log_y and all(y > 0 for s in series for y in s.ys if _finite(y)):
            axes.set_yscale("log")
        axes.set_xlabel(xlabel)
        axes.set_ylabel(ylabel)
        if labelled:
            _legend_above(axes, labelled, wide)
        return _svg(figure)


def stacked_bars(
    labels: Sequence[str],
    parts: Mapping[str, Sequence[float]],
    xlabel: str,
    colors: Mapping[str, str] | None = None,
    wide: bool = False,
) -> str:
    """One horizontal bar per label (the first on top), stacked from `parts` (name -> a
    value per label); `colors` keeps a part's colour when other parts are left out."""
    with matplotlib.rc_context(STYLE):
        figure = Figure(figsize=(WIDE if wide else WIDTH, _rows_height(labels)))
        axes = figure.add_subplot()
        left = [0.0] * len(labels)
        for name, values in parts.items():
            shade = (colors or {}).get(name)
            axes.barh(labels, values, left=left, label=name, height=0.6, color=shade)
            left = [b + v for b, v in zip(left, values, strict=True)]
        axes.invert_yaxis()
        axes.set_xlabel(xlabel)
        _legend_above(axes, len(parts), wide)
        return _svg(figure)


def bars(
    labels: Sequence[str],
    values: Sequence[float],
    ylabel: str,
    xlabel: str = "",
    horizontal: bool = False,
    wide: bool = False,
) -> str:
    """One bar per label; `horizontal`: one row per label (ranks), the value along x."""
    with matplotlib.rc_context(STYLE):
        if horizontal:
            figure = Figure(figsize=(WIDE if wide else WIDTH, _rows_height(labels)))
            axes = figure.add_subplot()
            axes.barh(labels, values, height=0.6, color="C0")
            axes.invert_yaxis()
            axes.set_xlabel(ylabel)
            return _svg(figure)
        figure = Figure(figsize=(max(3.2, 0.5 * len(labels) + 2.0), HEIGHT))
        axes = figure.add_subplot()
        axes.bar(labels, values, width=0.6, color="C0")
        axes.set_ylabel(ylabel)
        axes.set_xlabel(xlabel)
        _rotate(axes, labels)
        return _svg(figure)


def _rows_height(labels: Sequence[str]) -> float:
    return max(1.6, 0.32 * len(labels) + 1.1)


def _legend_above(axes: object, entries: int, wide: bool) -> None:
    """The legend in rows above the axes: it never covers the data."""
    columns = max(1, min(entries, 6 if wide else 3))
    axes.legend(  # type: ignore[attr-defined]
        loc="lower left", bbox_to_anchor=(0.0, 1.02), ncols=columns, borderaxespad=0.0
    )


def _rotate(axes: object, labels: Sequence[str]) -> None:
    if len(labels) > 6 or any(len(label) > 8 for label in labels):
        for tick in axes.get_xticklabels():  # type: ignore[attr-defined]
            tick.set_rotation(30)
            tick.set_horizontalalignment("right")


def _svg(figure: Figure) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)
