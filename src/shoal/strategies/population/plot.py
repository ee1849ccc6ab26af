"""`population.svg`: the population's scores and hyperparameters over training (matplotlib).

One panel for the score and one per hyperparameter, a line per member, the
step as the x axis. A member that copied another continues with a dashed line
from its parent's point, so the lineage shows. Drawn on a bare `Figure` (no
pyplot: no global state, no display needed) and written atomically, so a plot
that follows the checkpoints is never half written.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from shoal.checkpoint.atomic import atomic_write_bytes
from shoal.strategies.population.config import Distribution, LogRange
from shoal.strategies.population.lineage import Generation

if TYPE_CHECKING:
    from matplotlib.axes import Axes

PLOT_FILE = "population.svg"
FOLLOW_INTERVAL_S = 60.0  # while training, redraw at most this often (a drawing costs ~0.5 s)

Value = Callable[[int, int], float]  # (generation, member) -> the value plotted


def _robust_limits(values: list[float]) -> tuple[float, float] | None:
    """Tukey's far fences (3 IQR beyond the quartiles), clipped to the data.

    A diverging member's loss of 1e11 would flatten everyone else's line: the axis
    stops at the fences and values beyond them are drawn on the frame.
    """
    finite = sorted(v for v in values if math.isfinite(v))
    if len(finite) < 8:
        return None
    q1, q3 = finite[len(finite) // 4], finite[3 * len(finite) // 4]
    low, high = max(finite[0], q1 - 3 * (q3 - q1)), min(finite[-1], q3 + 3 * (q3 - q1))
    if high <= low:
        return None
    margin = (high - low) * 0.05
    return low - margin, high + margin


def _draw(axes: Axes, history: Sequence[Generation], value: Value, stepped: bool) -> None:
    """A line per member; after a copy it comes, dashed, from the parent's previous point."""
    colors = [f"C{m % 10}" for m in range(len(history[0].members))]
    for m, color in enumerate(colors):
        for gi, gen in enumerate(history):
            v = value(gi, m)
            if not math.isfinite(v):
                continue
            start = gen.start if stepped else gen.end
            if gi > 0:
                parent = gen.members[m].parent
                before = value(gi - 1, m if parent is None else parent)
                if math.isfinite(before):
                    axes.plot(
                        [history[gi - 1].end, start],
                        [before, v],
                        color=color,
                        linestyle="--" if parent is not None else "-",
                        linewidth=1.2,
                    )
            if stepped:
                axes.plot([gen.start, gen.end], [v, v], color=color, linewidth=1.5)
            else:
                axes.plot([gen.end], [v], "o", color=color, markersize=3)


def render(history: Sequence[Generation], metric: str, space: Mapping[str, Distribution]) -> bytes:
    """The SVG of the population's scores and hyperparameters over training."""
    # imported here: every worker imports the strategies, only population_based's rank 0 draws
    import matplotlib
    from matplotlib.figure import Figure

    names = sorted(space)
    figure = Figure(figsize=(9.0, 2.4 * (1 + len(names)) + 0.6), layout="constrained")
    panels = figure.subplots(1 + len(names), 1, sharex=True, squeeze=False)[:, 0]
    if history:
        score_axes = panels[0]
        score_axes.set_title(f"score ({metric}) after each generation", loc="left")
        _draw(score_axes, history, lambda g, m: history[g].members[m].score, stepped=False)
        scores = [r.score for gen in history for r in gen.members]
        limits = _robust_limits(scores)
        if limits is not None and (min(scores) < limits[0] or max(scores) > limits[1]):
            score_axes.set_ylim(*limits)
            score_axes.set_title("outliers beyond the axis not shown", loc="right", fontsize=8)
        for axes, name in zip(panels[1:], names, strict=True):

            def value(g: int, m: int, name: str = name) -> float:
                return history[g].members[m].hyperparameters[name]

            log = isinstance(space[name], LogRange)
            axes.set_title(name + (" (log scale)" if log else ""), loc="left")
            if log:
                axes.set_yscale("log")
            _draw(axes, history, value, stepped=True)
        handles = [
            score_axes.plot([], [], color=f"C{m % 10}", label=f"member {m}")[0]
            for m in range(len(history[0].members))
        ]
        figure.legend(handles=handles, loc="outside upper center", ncols=min(len(handles), 8))
    panels[-1].set_xlabel("training step")
    buffer = io.BytesIO()
    # text stays text (searchable, small); no date and fixed ids: the same history, the same file
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "shoal"}):
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def write_plot(
    path: Path, history: Sequence[Generation], metric: str, space: Mapping[str, Distribution]
) -> Path:
    atomic_write_bytes(path, render(history, metric, space))
    return path


class PlotFollower:
    """Keeps `population.svg` close behind a running job, so a long or crashed run can be seen.

    Drawing takes about half a second, spent by rank 0 while the others wait at the
    next exchange: redrawn at the first checkpoint and then at most every
    `interval_s`; `write` (at the end of the run) always draws.
    """

    def __init__(
        self,
        path: Path,
        metric: str,
        space: Mapping[str, Distribution],
        interval_s: float = FOLLOW_INTERVAL_S,
    ) -> None:
        self.path, self.metric, self.space, self.interval_s = path, metric, space, interval_s
        self._drawn_at: float | None = None

    def follow(self, history: Sequence[Generation]) -> None:
        now = time.monotonic()
        if self._drawn_at is None or now - self._drawn_at >= self.interval_s:
            self.write(history)

    def write(self, history: Sequence[Generation]) -> Path:
        self._drawn_at = time.monotonic()
        return write_plot(self.path, history, self.metric, self.space)
