"""data_parallel with a straggler: static (even) vs dynamic shares of the global batch.

Two workers; rank 1 computes `--factor` times slower (`[faults.inject] kind = "slow"`,
`factor`). Under static shares every step waits for the straggler's half of the batch;
under dynamic shares its part shrinks to its speed. Runs the two alternately, several
rounds, and prints the steady-state throughput (samples/s over the timed steps, after
warm-up) of each, the ratio of the medians, and the last split of the dynamic runs.

    .venv/bin/python benchmarks/balance_dp.py [--rounds 2] [--steps 60] [--factor 2]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from _ab import alternate, summary, train_cli


def run(work: Path, args: argparse.Namespace, balance: str, round_: int) -> dict[str, Any]:
    name = f"{balance}-{round_}"
    config = {
        "task": {
            "type": "classification",
            "data": {
                "samples": args.samples,
                "features": args.features,
                "informative": 16,
                "classes": 10,
                "seed": 0,
                "valid_fraction": 0.1,
            },
            "model": {"hidden": args.hidden},
        },
        "strategy": {
            "type": "data_parallel",
            "num_replicas": 2,
            "balance": balance,
            "rebalance_every": args.rebalance_every,
        },
        "train": {
            "max_steps": args.steps,
            "batch_size": args.batch_size,
            "seed": 0,
            "optimizer": {"kind": "sgd", "lr": 0.01, "momentum": 0.9},
            "eval_every_epochs": 0,
        },
        "checkpoint": {"every_epochs": 0, "at_end": False},
        "faults": {"inject": {"rank": 1, "step": 0, "kind": "slow", "factor": args.factor}},
        "monitor": {"log_every_steps": args.skip, "progress": "off"},
    }
    records = train_cli(work, name, config)
    timed = [r for r in records if r["event"] == "train" and r["step"] > args.skip]
    plans = [r["shares"] for r in records if r["event"] == "balance"]
    return {
        "samples_per_s": sum(r["samples"] for r in timed) / sum(r["step_s"] for r in timed),
        "shares": plans[-1] if plans else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--skip", type=int, default=15, help="warm-up steps not timed")
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--rebalance-every", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--samples", type=int, default=40000)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--hidden", type=int, nargs="+", default=[1024, 1024])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        figures, outs = alternate(
            args.rounds,
            ["static", "dynamic"],
            lambda balance, round_: run(Path(tmp), args, balance, round_),
            "samples_per_s",
            "samples/s",
        )
    shares = [o["shares"] for o in outs if o["shares"]]
    print(
        summary(
            "samples_per_s",
            figures,
            ("dynamic", "static"),
            factor=args.factor,
            last_dynamic_shares=shares[-1] if shares else None,
        )
    )


if __name__ == "__main__":
    main()
