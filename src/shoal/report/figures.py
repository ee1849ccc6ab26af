"""Charts as inline SVG text, drawn by matplotlib on a bare `Figure` (no pyplot state).

Text stays text in the SVG (`svg.fonttype = none`: smaller, searchable, drawn in
the page's font) and ids are salted alike every time, so the same data gives
the same page. A series longer than `MAX_POINTS` is thinned by an even stride
that keeps the first and last points: a 100k-line metrics.jsonl draws as fast
as a short one, and no screen shows more points than it has pixels.
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
STYLE: Any = {  # rcParams (Any: matplotlib types the keys as literals)
    "svg.fonttype": "none",
    "svg.hashsalt": "shoal-report",
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


def lines(series: Sequence[Series], xlabel: str, ylabel: str, log_y: bool = False) -> str:
    """A line chart of `series` (empty series are left out)."""
    with matplotlib.rc_context(STYLE):
        figure = Figure(figsize=(6.4, 3.0))
        axes = figure.add_subplot()
        labelled = False
        for s in series:
            xs, ys = thin(s.xs, s.ys)
            if not xs:
                continue
            labelled = labelled or bool(s.label)
            marker = "o" if "o" in s.style or len(xs) < 3 else None
            line = "--" if "--" in s.style else "-"
            axes.plot(xs, ys, line, marker=marker, ms=3, lw=1.3, label=s.label, color=s.color)
        if log_y and all(y > 0 for s in series for y in s.ys if _finite(y)):
            axes.set_yscale("log")
        axes.set_xlabel(xlabel)
        axes.set_ylabel(ylabel)
        if labelled:
            axes.legend(loc="best")
        return _svg(figure)


def stacked_bars(
    labels: Sequence[str],
    parts: Mapping[str, Sequence[float]],
    ylabel: str,
    colors: Mapping[str, str] | None = None,
) -> str:
    """One bar per label, stacked from `parts` (name -> a value per label); `colors` keeps
    a part's colour when other parts are left out."""
    with matplotlib.rc_context(STYLE):
        figure = Figure(figsize=(max(3.2, 0.6 * len(labels) + 2.4), 3.0))
        axes = figure.add_subplot()
        bottom = [0.0] * len(labels)
        for name, values in parts.items():
            shade = (colors or {}).get(name)
            axes.bar(labels, values, bottom=bottom, label=name, width=0.6, color=shade)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        axes.set_ylabel(ylabel)
        axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        _rotate(axes, labels)
        return _svg(figure)


def bars(labels: Sequence[str], values: Sequence[float], ylabel: str, xlabel: str = "") -> str:
    with matplotlib.rc_context(STYLE):
        figure = Figure(figsize=(max(3.2, 0.5 * len(labels) + 2.0), 3.0))
        axes = figure.add_subplot()
        axes.bar(labels, values, width=0.6, color="C0")
        axes.set_ylabel(ylabel)
        axes.set_xlabel(xlabel)
        _rotate(axes, labels)
        return _svg(figure)


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
