"""A/B of two shoal source trees on dp_vs_ddp's job: did a change cost throughput?

    git archive main src | tar -x -C /tmp/main-src
    .venv/bin/python benchmarks/ab_sources.py /tmp/main-src/src src --rounds 4

Runs `shoal train` with PYTHONPATH set to each source tree in turn (the workers
inherit it), alternating within each round, on the MLP of `dp_vs_ddp.py`
(10.5M parameters, 2 workers, global batch 256), and prints the throughput of
each round and the ratio of the medians. The machine's noise hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import tomli_w


def run(work: Path, source: Path, name: str, steps: int, skip: int) -> float:
    config = {
        "task": {
            "type": "classification",
            "data": {"samples": 24000, "features": 1024, "informative": 16, "classes": 10},
            "model": {"hidden": [2048, 2048, 2048]},
        },
        "strategy": {"type": "data_parallel", "num_replicas": 2},
        "train": {
            "max_steps": steps,
            "batch_size": 256,
            "optimizer": {"kind": "sgd", "lr": 0.01, "momentum": 0.9},
            "eval_every_epochs": 0,
        },
        "checkpoint": {"every_epochs": 0, "at_end": False},
        "run": {"dir": str(work / "runs"), "name": name},
        "monitor": {"log_every_steps": skip, "progress": "off"},
    }
    path = work / f"{name}.toml"
    path.write_text(tomli_w.dumps(config))
    env = {**os.environ, "PYTHONPATH": str(source.resolve())}
    command = [sys.executable, "-m", "shoal", "train", str(path)]
    subprocess.run(command, check=True, capture_output=True, env=env, cwd=work)
    metrics = (work / "runs" / name / "metrics.jsonl").read_text().splitlines()
    timed = [r for r in map(json.loads, metrics) if r["event"] == "train" and r["step"] > skip]
    return sum(r["samples"] for r in timed) / sum(r["step_s"] for r in timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="first source tree (the folder holding shoal/)")
    parser.add_argument("b", type=Path, help="second source tree")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--skip", type=int, default=10)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"a": [], "b": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for round_ in range(args.rounds):
            for label, source in (("a", args.a), ("b", args.b)):
                rates[label].append(run(work, source, f"{label}-{round_}", args.steps, args.skip))
            print(f"round {round_ + 1} (samples/s): a {rates['a'][-1]:.1f}  b {rates['b'][-1]:.1f}")
    a, b = statistics.median(rates["a"]), statistics.median(rates["b"])
    print(f"median: a ({args.a}) {a:.1f}, b ({args.b}) {b:.1f}; ratio b/a {b / a:.3f}")


if __name__ == "__main__":
    main()
