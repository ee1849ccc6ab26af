"""What the side-by-side benchmarks share: train a config, read its records, alternate
contenders over rounds, and summarise with medians.

Imported as a sibling module (`python benchmarks/<name>.py` puts this folder first on
sys.path). A benchmark keeps what is its own (the config it trains, the figure it reads
from the records) and hands the rest here, so that every A/B compares the same way:
contenders run alternately within a round (a slow minute of the machine falls on both),
each figure is kept per round, and the summary is the median per contender.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomli_w

BIN = Path(sys.executable).parent


def records(run_dir: Path) -> list[dict[str, Any]]:
    """The run's metrics.jsonl records."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def train_cli(work: Path, name: str, config: dict[str, Any]) -> list[dict[str, Any]]:
    """Write `config` (its run goes to work/runs/<name>), run `shoal train` on it as a user
    does (a process of its own) and return the run's records."""
    config["run"] = {**config.get("run", {}), "dir": str(work / "runs"), "name": name}
    path = work / f"{name}.toml"
    path.write_text(tomli_w.dumps(config))
    subprocess.run([str(BIN / "shoal"), "train", str(path)], check=True, capture_output=True)
    return records(work / "runs" / name)


def alternate(
    rounds: int,
    contenders: list[str],
    measure: Callable[[str, int], dict[str, Any]],
    figure: str,
    unit: str,
) -> tuple[dict[str, list[float]], list[dict[str, Any]]]:
    """Run every contender once per round, in turn; `measure(contender, round)` returns a dict
    with `figure` among its keys. Prints each figure as it comes; returns the figures per
    contender and every measurement (in the order run)."""
    figures: dict[str, list[float]] = {c: [] for c in contenders}
    outs = []
    for round_ in range(rounds):
        for contender in contenders:
            out = measure(contender, round_)
            figures[contender].append(float(out[figure]))
            outs.append({"contender": contender, "round": round_, **out})
            print(f"round {round_} {contender}: {out[figure]:.1f} {unit}", flush=True)
    return figures, outs


def summary(
    figure: str, figures: dict[str, list[float]], ratio: tuple[str, str], **extra: Any
) -> str:
    """The figures (under the key `figure`), their medians and the ratio of the medians
    `ratio[0] / ratio[1]`, as the JSON block the benchmarks print last."""
    medians = {k: statistics.median(v) for k, v in figures.items()}
    top, bottom = ratio
    return json.dumps(
        {
            "machine": platform.processor() or platform.machine(),
            figure: figures,
            "median": medians,
            f"{top}_over_{bottom}": medians[top] / medians[bottom],
            **extra,
        },
        indent=1,
    )
