"""shoal `data_parallel` vs plain PyTorch DDP: the same MLP (> 10M parameters), 2 workers.

Runs shoal and two DDP baselines alternately, several rounds in one invocation:
DDP with its defaults (gradients copied into its buckets) and DDP with
`gradient_as_bucket_view=True` (gradients are bucket views, as in shoal). Prints
the steady-state training throughput (samples/s over timed steps, after warm-up)
of each, and the ratios of the medians.

    .venv/bin/python benchmarks/dp_vs_ddp.py [--rounds 3] [--steps 60]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import tomli_w

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


def shoal_run(work: Path, args: argparse.Namespace, round_: int) -> float:
    config = {
        "task": {
            "type": "classification",
            "data": {
                "samples": args.samples,
                "features": args.features,
                "informative": 16,
                "classes": args.classes,
                "seed": 0,
                "valid_fraction": 0.2,
            },
            "model": {"hidden": args.hidden},
        },
        "strategy": {"type": "data_parallel", "num_replicas": args.workers},
        "train": {
            "max_steps": args.steps,
            "batch_size": args.batch_size,
            "seed": 0,
            "optimizer": {"kind": "sgd", "lr": 0.01, "momentum": 0.9},
            "eval_every_epochs": 0,
        },
        "checkpoint": {"every_epochs": 0, "at_end": False},
        "run": {"dir": str(work / "runs"), "name": f"shoal-{round_}"},
        "monitor": {"log_every_steps": args.skip, "progress": "off"},
    }
    path = work / "shoal.toml"
    path.write_text(tomli_w.dumps(config))
    subprocess.run([str(BIN / "shoal"), "train", str(path)], check=True, capture_output=True)
    records = [
        json.loads(line)
        for line in (work / "runs" / f"shoal-{round_}" / "metrics.jsonl").read_text().splitlines()
    ]
    timed = [r for r in records if r["event"] == "train" and r["step"] > args.skip]
    return sum(r["samples"] for r in timed) / sum(r["step_s"] for r in timed)


def ddp_run(work: Path, args: argparse.Namespace, bucket_view: bool) -> float:
    out = work / "ddp.json"
    subprocess.run(
        [
            str(BIN / "torchrun"),
            "--standalone",
            "--nproc-per-node",
            str(args.workers),
            str(HERE / "ddp_baseline.py"),
            str(out),
            "--samples",
            str(args.samples),
            "--features",
            str(args.features),
            "--classes",
            str(args.classes),
            "--hidden",
            *map(str, args.hidden),
            "--batch-size",
            str(args.batch_size),
            "--steps",
            str(args.steps),
            "--skip",
            str(args.skip),
            *(["--bucket-view"] if bucket_view else []),
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // args.workers))},
    )
    return float(json.loads(out.read_text())["samples_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--skip", type=int, default=10, help="warm-up steps not timed")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--samples", type=int, default=24000)
    parser.add_argument("--features", type=int, default=1024)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--hidden", type=int, nargs="+", default=[2048, 2048, 2048])
    args = parser.parse_args()

    widths = [args.features, *args.hidden, args.classes]
    params = sum(a * b + b for a, b in itertools.pairwise(widths))
    print(
        f"MLP {widths}: {params / 1e6:.1f}M parameters ({params * 4 / 2**20:.0f} MiB of "
        f"gradients per step), {args.workers} workers, global batch {args.batch_size}, "
        f"{args.steps} steps ({args.skip} untimed), {os.cpu_count()} cores, {platform.machine()}"
    )
    rates: dict[str, list[float]] = {"shoal": [], "DDP": [], "DDP view": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for round_ in range(args.rounds):
            rates["shoal"].append(shoal_run(work, args, round_))
            rates["DDP"].append(ddp_run(work, args, bucket_view=False))
            rates["DDP view"].append(ddp_run(work, args, bucket_view=True))
            shown = "   ".join(f"{name} {values[-1]:7.1f}" for name, values in rates.items())
            print(f"round {round_ + 1} (samples/s): {shown}", flush=True)
    median = {name: statistics.median(values) for name, values in rates.items()}
    print("median (samples/s): " + ", ".join(f"{n} {v:.1f}" for n, v in median.items()))
    print(
        f"ratio shoal/DDP {median['shoal'] / median['DDP']:.3f}, "
        f"shoal/DDP-view {median['shoal'] / median['DDP view']:.3f}"
    )


if __name__ == "__main__":
    main()
