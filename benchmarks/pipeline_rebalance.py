"""pipeline with a straggler: the measured partition kept (static) vs re-balanced at checkpoints.

Two pipeline ranks; rank 1 computes `--factor` times slower from the first step
(`[faults.inject] kind = "slow"`, `factor`). Both runs start at the partition
balanced on the profiled block times (the profile runs before the slowdown, so it
is the even one a job gets on equal machines) and write a checkpoint every
`--every` steps; with `rebalance = "checkpoint"` the first checkpoint moves blocks
off the slow rank. Throughput is the tokens of the steps after `--skip` over their
step time (from metrics.jsonl's train lines; checkpoint writing is outside step
time in both). Runs the two alternately, several rounds; prints each, the ratio of
the medians, and the re-balanced run's partition records.

    .venv/bin/python benchmarks/pipeline_rebalance.py [--rounds 2] [--steps 60] [--factor 2]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from _ab import alternate, records, summary

import shoal

REPO = Path(__file__).resolve().parents[1]
TEXT = REPO.parent / "shared" / "datasets" / "tinyshakespeare" / "input.txt.gz"


def run(work: Path, args: argparse.Namespace, rebalance: str, round_: int) -> dict[str, Any]:
    name = f"{rebalance}-{round_}"
    config = {
        "task": {
            "type": "lm",
            "tokenizer": "char",
            "data": {"train": str(TEXT), "split": 0.9},
            "model": {
                "dim": args.dim,
                "heads": 4,
                "layers": args.layers,
                "context": args.context,
                "dropout": 0.0,
            },
            "evaluation": {"max_windows": 1},
        },
        "strategy": {
            "type": "pipeline",
            "stages": 2,
            "microbatches": args.microbatches,
            "schedule": "1f1b",
            "rebalance": rebalance,
        },
        "train": {
            "max_steps": args.steps,
            "batch_size": args.batch_size,
            "drop_last": True,
            "seed": 0,
            "optimizer": {"kind": "adamw", "lr": 3e-3, "weight_decay": 0.1},
            "eval_every_epochs": 0,
        },
        "checkpoint": {"every_steps": args.every, "every_epochs": 0, "at_end": False},
        "faults": {"inject": {"rank": 1, "step": 0, "kind": "slow", "factor": args.factor}},
        "run": {"dir": str(work / "runs"), "name": name},
        "monitor": {"log_every_steps": args.every, "progress": "off"},
    }
    shoal.train(config)
    found = records(work / "runs" / name)
    timed = [r for r in found if r["event"] == "train" and r["step"] > args.skip]
    tokens = sum(r["samples"] for r in timed) * args.context
    partitions = [
        {k: r[k] for k in ("step", "moved", "partition", "best", "rank_speeds", "gain")}
        for r in found
        if r["event"] == "partition"
    ]
    return {"tokens_per_s": tokens / sum(r["step_s"] for r in timed), "partitions": partitions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10, help="checkpoint and log interval")
    parser.add_argument("--skip", type=int, default=20, help="steps not timed")
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--microbatches", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        figures, outs = alternate(
            args.rounds,
            ["off", "checkpoint"],
            lambda rebalance, round_: run(Path(tmp), args, rebalance, round_),
            "tokens_per_s",
            "tokens/s",
        )
    partitions = [o["partitions"] for o in outs if o["partitions"]]
    print(
        summary(
            "tokens_per_s",
            figures,
            ("checkpoint", "off"),
            factor=args.factor,
            partition_records=partitions[-1] if partitions else [],
        )
    )


if __name__ == "__main__":
    main()
