"""The population plot: a panel per hyperparameter, a line per member, lineage dashed."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path

from shoal.strategies.population.config import LinearRange, LogRange
from shoal.strategies.population.lineage import Generation, MemberRecord
from shoal.strategies.population.plot import PlotFollower, render, write_plot

SPACE = {"lr": LogRange(low=1e-3, high=1.0), "momentum": LinearRange(low=0.0, high=0.99)}


def _history() -> list[Generation]:
    """3 members, 3 generations; member 2 copies member 0 at generation 1, member 1 diverges."""
    generations = []
    for g in range(3):
        members = []
        for m in range(3):
            parent = 0 if (g == 1 and m == 2) else None
            score = math.inf if (m == 1 and g == 2) else 0.5 + 0.1 * g - 0.05 * m
            hyper = {"lr": 0.01 * (m + 1) * (1.2**g), "momentum": 0.9 - 0.1 * m}
            members.append(MemberRecord(hyperparameters=hyper, score=score, parent=parent))
        generations.append(Generation(index=g, start=10 * g, end=10 * (g + 1), members=members))
    return generations


def _dashed_paths(svg: bytes) -> int:
    root = ET.fromstring(svg)
    return sum(
        "stroke-dasharray" in (e.get("style") or "") for e in root.iter() if e.tag.endswith("path")
    )


def test_the_plot_shows_every_panel_member_and_copy(tmp_path: Path) -> None:
    svg = render(_history(), "accuracy", SPACE)
    text = svg.decode()
    ET.fromstring(svg)  # well-formed SVG
    for label in ("score (accuracy)", "lr (log scale)", "momentum", "training step"):
        assert label in text, label
    assert all(f"member {m}" in text for m in range(3))
    # one copy (member 2 from member 0 at generation 1), drawn once per panel: score, lr, momentum
    assert _dashed_paths(svg) == 3
    written = write_plot(tmp_path / "population.svg", _history(), "accuracy", SPACE)
    assert written.read_bytes() == svg


def test_an_empty_history_still_gives_a_plot() -> None:
    """A run that fails before its first generation still leaves a readable (empty) plot."""
    root = ET.fromstring(render([], "accuracy", SPACE))
    assert root.tag.endswith("svg")


def test_the_follower_redraws_at_most_once_per_interval(tmp_path: Path) -> None:
    path = tmp_path / "population.svg"
    follower = PlotFollower(path, "accuracy", SPACE, interval_s=3600.0)
    history = _history()
    follower.follow(history[:1])  # the first checkpoint always draws
    first = path.read_bytes()
    follower.follow(history)  # within the interval: not redrawn
    assert path.read_bytes() == first
    follower.write(history)  # the end of the run always draws
    assert path.read_bytes() == render(history, "accuracy", SPACE) != first
