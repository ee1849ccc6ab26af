"""A/B of two shoal source trees on start-up: how long a tiny job takes from the command
line, and a warm job in a process that already ran one (as the test suite's jobs are).

    git archive main src | tar -x -C /tmp/main-src
    .venv/bin/python benchmarks/startup.py /tmp/main-src/src src --rounds 3

The job trains a few steps in a few hundredths of a second, so what is measured is the
fixed cost: starting Python, importing torch and shoal, the worker server, the process
group, the first optimizer, the final checkpoint and results. Rows, each with the sources
alternating within every round (the machine's noise hits both alike):

- `cli local`: `python -m shoal train` of the job in one process;
- `cli dp2`: the same with `data_parallel`, 2 workers;
- `warm dp2`: `shoal.api.train` of the 2-worker job in a process that ran it once already
  (median of the later runs): the cost every multi-process test pays.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomli_w

WARM_RUNS = 4


def job(run_dir: Path, strategy: dict[str, Any]) -> dict[str, Any]:
    return {
        "task": {
            "type": "classification",
            "data": {"source": "synthetic", "samples": 500, "features": 10, "classes": 3},
            "model": {"hidden": [16, 16]},
        },
        "strategy": strategy,
        "train": {"epochs": 2, "batch_size": 31, "optimizer": {"kind": "sgd", "lr": 0.1}},
        "checkpoint": {"every_epochs": 0},
        "run": {"dir": str(run_dir)},
        "monitor": {"progress": "off"},
    }


WARM = """
import sys, time
import shoal.api
for i in range({runs}):
    started = time.perf_counter()
    shoal.api.train(sys.argv[1], overrides=[f"run.name=warm{{i}}"])
    print(time.perf_counter() - started, flush=True)
"""


def cli(config: Path, source: Path, name: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(source.resolve())}
    command = [sys.executable, "-m", "shoal", "train", str(config), "--set", f"run.name={name}"]
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env=env)
    return time.perf_counter() - started


def warm(config: Path, source: Path) -> float:
    """Median of the runs after the first, in one process."""
    env = {**os.environ, "PYTHONPATH": str(source.resolve())}
    command = [sys.executable, "-c", WARM.format(runs=WARM_RUNS), str(config)]
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    return statistics.median(float(line) for line in out.split()[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path, help="source tree a (the src folder)")
    parser.add_argument("b", type=Path, help="source tree b")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="shoal-startup-"))
    local, dp2 = work / "local.toml", work / "dp2.toml"
    local.write_text(tomli_w.dumps(job(work / "runs", {"type": "local"})))
    dp2.write_text(tomli_w.dumps(job(work / "runs", {"type": "data_parallel", "num_replicas": 2})))
    rows = {
        "cli local": lambda source, name: cli(local, source, name),
        "cli dp2": lambda source, name: cli(dp2, source, name),
        "warm dp2": lambda source, _name: warm(dp2, source),
    }
    for row, measure in rows.items():
        seconds: dict[str, list[float]] = {"a": [], "b": []}
        for round_ in range(args.rounds):
            for side, source in (("a", args.a), ("b", args.b)):
                seconds[side].append(measure(source, f"{row.replace(' ', '-')}-{side}{round_}"))
        a, b = statistics.median(seconds["a"]), statistics.median(seconds["b"])
        pairs = zip(seconds["a"], seconds["b"], strict=True)
        rounds = " ".join(f"{x:.2f}/{y:.2f}" for x, y in pairs)
        print(f"{row:10s} a {a:6.2f} s  b {b:6.2f} s  b/a {b / a:.2f}  (rounds a/b: {rounds})")


if __name__ == "__main__":
    main()
