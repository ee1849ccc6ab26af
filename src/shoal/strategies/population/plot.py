"""`population.svg`: the population's scores and hyperparameters over training, as an SVG file.

One panel for the score and one per hyperparameter, a line per member, the
step as the x axis. A member that copied another continues with a dashed line
from its parent's point, so the lineage shows. Written directly as SVG (no
plotting dependency); any browser shows it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from html import escape
from pathlib import Path

from shoal.checkpoint.atomic import atomic_write_bytes
from shoal.strategies.population.config import Distribution, LogRange
from shoal.strategies.population.lineage import Generation

PLOT_FILE = "population.svg"
WIDTH, PANEL, LEFT, RIGHT, TOP, GAP = 860, 190, 80, 20, 56, 46
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


def _ticks(low: float, high: float, log: bool) -> list[float]:
    if log:
        first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
        step = max(1, (last - first) // 6 + 1)
        return [10.0**e for e in range(first, last + 1, step) if low <= 10.0**e <= high]
    span = high - low
    raw = span / 5
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    start = math.ceil(low / step) * step
    return [start + i * step for i in range(int((high - start) / step + 1e-9) + 1)]


class _Panel:
    """One plot area: maps (step, value) to SVG coordinates."""

    def __init__(
        self, top: float, x_max: float, values: list[float], log: bool, robust: bool = False
    ) -> None:
        finite = sorted(v for v in values if math.isfinite(v) and (v > 0 or not log))
        low, high = (finite[0], finite[-1]) if finite else (0.0, 1.0)
        if robust and len(finite) >= 8:
            # a diverging member's loss of 1e11 would flatten everyone else's line: the
            # axis stops at Tukey's far fences (3 interquartile ranges beyond the
            # quartiles), and values beyond them sit on the frame
            q1, q3 = finite[len(finite) // 4], finite[3 * len(finite) // 4]
            low, high = max(low, q1 - 3 * (q3 - q1)), min(high, q3 + 3 * (q3 - q1))
        if high <= low:
            pad = abs(low) * 0.1 or 1.0
            low, high = (low / 2, high * 2) if log else (low - pad, high + pad)
        elif log:  # a margin of 5% of the span, so no line hides in the frame
            ratio = (high / low) ** 0.05
            low, high = low / ratio, high * ratio
        else:
            margin = (high - low) * 0.05
            low, high = low - margin, high + margin
        self.top, self.x_max, self.log = top, max(x_max, 1.0), log
        self.low, self.high = low, high

    def shows(self, value: float) -> bool:
        return math.isfinite(value) and (value > 0 or not self.log)

    def x(self, step: float) -> float:
        return LEFT + (WIDTH - LEFT - RIGHT) * step / self.x_max

    def y(self, value: float) -> float:
        f: Callable[[float], float] = math.log10 if self.log else float
        value = min(max(value, self.low), self.high)
        share = (f(value) - f(self.low)) / (f(self.high) - f(self.low))
        return self.top + PANEL * (1 - share)

    def frame(self, title: str) -> list[str]:
        out = [
            f'<rect x="{LEFT}" y="{self.top}" width="{WIDTH - LEFT - RIGHT}" height="{PANEL}" '
            'fill="none" stroke="#999"/>',
            f'<text x="{LEFT}" y="{self.top - 8}" font-weight="bold">{escape(title)}</text>',
        ]
        for tick in _ticks(self.low, self.high, self.log):
            y = self.y(tick)
            out.append(
                f'<line x1="{LEFT - 4}" y1="{y:.1f}" x2="{LEFT}" y2="{y:.1f}" stroke="#999"/>'
            )
            out.append(f'<text x="{LEFT - 7}" y="{y + 4:.1f}" text-anchor="end">{tick:.3g}</text>')
        for tick in _ticks(0.0, self.x_max, False):
            x = self.x(tick)
            bottom = self.top + PANEL
            out.append(
                f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 4}" stroke="#999"/>'
            )
            out.append(f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">{tick:g}</text>')
        return out


def _series(
    panel: _Panel,
    history: Sequence[Generation],
    value: Callable[[int, int], float],
    stepped: bool,
) -> list[str]:
    """A line per member; after a copy it comes, dashed, from the parent's previous point."""
    out = []
    members = len(history[0].members) if history else 0
    for m in range(members):
        color = PALETTE[m % len(PALETTE)]
        for gi, gen in enumerate(history):
            v = value(gi, m)
            if not panel.shows(v):
                continue
            here = [(panel.x(gen.end), panel.y(v))]
            if stepped:
                here.insert(0, (panel.x(gen.start), panel.y(v)))
            if gi > 0:
                parent = gen.members[m].parent
                before = value(gi - 1, m if parent is None else parent)
                if panel.shows(before):
                    start = (panel.x(history[gi - 1].end), panel.y(before))
                    out.append(_polyline([start, here[0]], color, dashed=parent is not None))
            if stepped:
                out.append(_polyline(here, color))
            else:
                x, y = here[0]
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{color}"/>')
    return out


def _polyline(points: list[tuple[float, float]], color: str, dashed: bool = False) -> str:
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    dash = ' stroke-dasharray="4 3"' if dashed else ""
    return f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.5"{dash}/>'


def render(history: Sequence[Generation], metric: str, space: Mapping[str, Distribution]) -> str:
    """The SVG text of the population's scores and hyperparameters over training."""
    names = sorted(space)
    x_max = history[-1].end if history else 1
    members = len(history[0].members) if history else 0
    first = TOP + 14 * (math.ceil(members / 9) - 1)  # below the legend's rows
    height = first + (PANEL + GAP) * (1 + len(names)) + 10
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
    ]
    for m in range(members):
        x = LEFT + (m % 9) * 84
        y = 12 + (m // 9) * 14
        out.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{PALETTE[m % 10]}"/>')
        out.append(f'<text x="{x + 14}" y="{y + 9}">member {m}</text>')
    panels: list[tuple[str, Callable[[int, int], float], bool, bool]] = [
        (
            f"score ({metric}) after each generation (outliers on the frame)",
            lambda g, m: history[g].members[m].score,
            False,
            False,
        )
    ]
    for name in names:

        def value(g: int, m: int, name: str = name) -> float:
            return history[g].members[m].hyperparameters[name]

        panels.append((name, value, True, isinstance(space[name], LogRange)))
    for index, (title, value_of, stepped, log) in enumerate(panels):
        top = first + index * (PANEL + GAP)
        values = [value_of(g, m) for g in range(len(history)) for m in range(members)]
        panel = _Panel(top, x_max, values, log, robust=index == 0)
        out += panel.frame(title + (" (log scale)" if log else ""))
        out += _series(panel, history, value_of, stepped)
    out.append(f'<text x="{WIDTH / 2}" y="{height - 4}" text-anchor="middle">training step</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_plot(
    path: Path, history: Sequence[Generation], metric: str, space: Mapping[str, Distribution]
) -> Path:
    atomic_write_bytes(path, render(history, metric, space).encode())
    return path
