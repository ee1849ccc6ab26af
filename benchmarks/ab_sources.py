"""A/B of two shoal source trees on dp_vs_ddp's job or the PS demo: did a change cost time?

    git archive main src | tar -x -C /tmp/main-src
    .venv/bin/python benchmarks/ab_sources.py /tmp/main-src/src src --rounds 4
    .venv/bin/python benchmarks/ab_sources.py /tmp/main-src/src src --aggregation ring
    .venv/bin/python benchmarks/ab_sources.py /tmp/main-src/src src --job ps
    .venv/bin/python benchmarks/ab_sources.py /tmp/main-src/src src --job fed
    .venv/bin/python benchmarks/ab_sources.py /tmp/main-src/src src --job kge-ps --steps 120

Runs `shoal train` with PYTHONPATH set to each source tree in turn (the workers
inherit it), alternating within each round, and prints each round's figure and
the ratio of the medians; the machine's noise hits both alike. `--job dp` (the
default): the MLP of `dp_vs_ddp.py` (10.5M parameters, 2 workers, global batch
256) with `--aggregation` (native, ring, ...), steady-state samples/s. `--job ps`:
the parameter server's demo (`make demo`'s config, 4 workers and 2 servers), the
command's wall time in seconds (lower is better) and results.json's samples/s.
`--job fed`: examples/federated.toml (2 workers, 20 clients, secure aggregation),
the samples the clients trained on per second of round time, the first round left
out (it pays the workers' warm-up), and the command's wall time. `--job kge-ps`: the
parameter server on FB15k-237 at kge_vs_pbg.py's settings (TransE L2, dim 200, 128
negatives per positive in chunks of 64, 2 workers with 2 co-located servers, async,
row Adagrad), steady-state triples/s of the workers' step time after `--skip` steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomli_w

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FB15K = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "fb15k-237"
DEMO = EXAMPLES / "kge-kinships-ps.toml"
FEDERATED = EXAMPLES / "federated.toml"


def run_ps(
    work: Path, source: Path, name: str, config: Path = DEMO, extra: Sequence[str] = ()
) -> tuple[float, float]:
    """(wall seconds, samples/s) of the demo job (or `config`) from `source`; `extra`:
    more `--set` items (e.g. faults.max_restarts=1, which gives the PS workers' links
    their restart-alone path)."""
    env = {**os.environ, "PYTHONPATH": str(source.resolve())}
    command = [sys.executable, "-m", "shoal", "train", str(config), "--set", "monitor.progress=off"]
    command += ["--set", f"run.dir={work / 'runs'}", "--set", f"run.name={name}"]
    for item in extra:
        command += ["--set", item]
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env=env, cwd=work)
    wall = time.perf_counter() - started
    results = json.loads((work / "runs" / name / "results.json").read_text())
    return wall, float(results.get("samples_per_s", 0.0))


def run_fed(work: Path, source: Path, name: str, extra: Sequence[str] = ()) -> tuple[float, float]:
    """(wall seconds, samples per second of round time after the first round)."""
    wall, _ = run_ps(work, source, name, FEDERATED, extra)
    metrics = (work / "runs" / name / "metrics.jsonl").read_text().splitlines()
    rounds = [r for r in map(json.loads, metrics) if r["event"] == "round" and r["round"] > 1]
    return wall, sum(r["samples"] for r in rounds) / sum(r["round_s"] for r in rounds)


def dp_job(aggregation: str) -> dict[str, Any]:
    """dp_vs_ddp's MLP under data_parallel with `aggregation`."""
    return {
        "task": {
            "type": "classification",
            "data": {"samples": 24000, "features": 1024, "informative": 16, "classes": 10},
            "model": {"hidden": [2048, 2048, 2048]},
        },
        "strategy": {
            "type": "data_parallel",
            "num_replicas": 2,
            "aggregation": {"method": aggregation},
        },
        "train": {"batch_size": 256, "optimizer": {"kind": "sgd", "lr": 0.01, "momentum": 0.9}},
    }


def kge_ps_job() -> dict[str, Any]:
    """kge_vs_pbg.py's shoal side: the parameter server on FB15k-237."""
    return {
        "task": {
            "type": "kge",
            "dim": 200,
            "data": {split: str(FB15K / f"{split}.txt.gz") for split in ("train", "valid", "test")},
            "model": {"type": "transe", "p": 2, "normalize_entities": False},
            "negatives": {"num_negatives": 128, "chunk_size": 64, "side": "uniform"},
            "loss": {"kind": "margin_ranking", "margin": 1.0},
            "evaluation": {"max_triples": 100},  # the end's evaluation: not measured
        },
        "strategy": {
            "type": "parameter_server",
            "num_workers": 2,
            "num_servers": 2,
            "placement": "colocated",
            "mode": "async",
            "optimizer": {"kind": "adagrad", "lr": 0.1},
        },
        "train": {"batch_size": 2048, "seed": 0},
    }


def run(work: Path, source: Path, name: str, steps: int, skip: int, job: dict[str, Any]) -> float:
    """Steady-state samples/s of `job` trained `steps` steps from `source`."""
    config = {
        **job,
        "train": {**job["train"], "max_steps": steps, "eval_every_epochs": 0},
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
    parser.add_argument("--job", choices=("dp", "ps", "fed", "kge-ps"), default="dp")
    parser.add_argument("--aggregation", default="native", help="dp: the aggregation method")
    parser.add_argument(
        "--set", dest="extra", action="append", default=[], help="ps, fed: a config override"
    )
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"a": [], "b": []}
    walls: dict[str, list[float]] = {"a": [], "b": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for round_ in range(args.rounds):
            for label, source in (("a", args.a), ("b", args.b)):
                name = f"{label}-{round_}"
                if args.job in ("ps", "fed"):
                    runner = run_ps if args.job == "ps" else run_fed
                    wall, rate = runner(work, source, name, extra=args.extra)
                    walls[label].append(wall)
                else:
                    job = kge_ps_job() if args.job == "kge-ps" else dp_job(args.aggregation)
                    rate = run(work, source, name, args.steps, args.skip, job)
                rates[label].append(rate)
            line = f"round {round_ + 1} (samples/s): a {rates['a'][-1]:.1f}  b {rates['b'][-1]:.1f}"
            if args.job in ("ps", "fed"):
                line += f"  (wall s: a {walls['a'][-1]:.1f}  b {walls['b'][-1]:.1f})"
            print(line, flush=True)
    a, b = statistics.median(rates["a"]), statistics.median(rates["b"])
    print(f"median samples/s: a ({args.a}) {a:.1f}, b ({args.b}) {b:.1f}; ratio b/a {b / a:.3f}")
    if args.job in ("ps", "fed"):
        wa, wb = statistics.median(walls["a"]), statistics.median(walls["b"])
        print(f"median wall s: a {wa:.1f}, b {wb:.1f}; ratio b/a {wb / wa:.3f}")


if __name__ == "__main__":
    main()
