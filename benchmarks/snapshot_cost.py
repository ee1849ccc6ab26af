"""What in-memory snapshots cost per step: the same job with `snapshot_every_steps` 0, 1, 5, 20.

A 2-worker data-parallel classification job (2 models: the small MLP of the
tests, and one of about 1.1 M parameters, whose state with momentum is ~9 MB), run
with each interval; the figure is the training time per step (results.json's
`train_time_s` / steps, which includes the snapshots' time) and its ratio to the
run without snapshots. Each job runs `--repeats` times; the median is kept.

    one-at-a-time .venv/bin/python benchmarks/snapshot_cost.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import tomli_w

MODELS = {"small (16x16)": [16, 16], "1.1M params (1024x1024)": [1024, 1024]}


def run(folder: Path, hidden: list[int], every: int, name: str) -> float:
    job = {
        "task": {
            "type": "classification",
            "data": {"source": "synthetic", "samples": 4000, "features": 10, "informative": 5,
                     "classes": 3, "seed": 1},
            "model": {"hidden": hidden},
        },
        "strategy": {"type": "data_parallel", "num_replicas": 2},
        "train": {"epochs": 2, "batch_size": 32, "seed": 3,
                  "optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9}},
        "checkpoint": {"every_steps": 0, "at_end": False, "keep_best": False},
        "monitor": {"progress": "off"},
        "faults": {"snapshot_every_steps": every},
        "run": {"dir": str(folder), "name": name},
    }  # fmt: skip
    config = folder / f"{name}.toml"
    config.write_text(tomli_w.dumps(job))
    done = subprocess.run([sys.executable, "-m", "shoal", "train", str(config)],
                          capture_output=True, text=True, cwd=folder)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((folder / name / "results.json").read_text())
    return float(results["train_time_s"]) / int(results["steps"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("| model | snapshot_every_steps | ms per step | ratio vs none |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="shoal-snapcost-") as tmp:
        for label, hidden in MODELS.items():
            base = None
            for every in (0, 20, 5, 1):
                times = [
                    run(Path(tmp), hidden, every, f"{len(hidden)}-{hidden[0]}-{every}-{r}")
                    for r in range(args.repeats)
                ]
                per_step = statistics.median(times)
                base = per_step if every == 0 else base
                assert base is not None
                shown = "none" if every == 0 else str(every)
                print(f"| {label} | {shown} | {per_step * 1e3:.2f} | {per_step / base:.2f} |",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
