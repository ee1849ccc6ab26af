"""population_based with a straggler: static vs dynamic placement of the members.

Two workers, 8 members; rank 1 computes `--factor` times slower (`[faults.inject]
kind = "slow"`, `factor`). Statically each worker holds 4 members and every
generation waits for the slow one; dynamically the members are re-placed after each
generation by the workers' measured step times. Runs the two alternately and prints
generations per minute (over the generations after the first, whose time includes
start-up and, dynamically, the first measurement), the ratio of the medians, and the
last placement.

    .venv/bin/python benchmarks/balance_pbt.py [--rounds 2] [--generations 8] [--factor 2]
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
            "data": {"samples": 20000, "features": 64, "informative": 16, "classes": 10, "seed": 0},
            "model": {"hidden": args.hidden},
        },
        "strategy": {
            "type": "population_based",
            "population_size": args.members,
            "workers": 2,
            "ready_interval": args.ready_interval,
            "generations": args.generations,
            "balance": balance,
            "checkpoint_every": 0,
            "search_space": {"lr": {"kind": "log", "low": 1e-3, "high": 0.3}},
        },
        "train": {
            "max_steps": args.generations * args.ready_interval,
            "batch_size": args.batch_size,
            "seed": 0,
            "optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9},
        },
        "checkpoint": {"at_end": False},
        "faults": {"inject": {"rank": 1, "step": 0, "kind": "slow", "factor": args.factor}},
        "monitor": {"progress": "off"},
    }
    records = train_cli(work, name, config)
    seconds = [r["generation_s"] for r in records if r["event"] == "generation"][1:]
    placed = [r["members_by_rank"] for r in records if r["event"] == "schedule"]
    return {
        "per_minute": 60 * len(seconds) / sum(seconds),
        "placed": placed[-1] if placed else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--ready-interval", type=int, default=20)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--hidden", type=int, nargs="+", default=[512, 512])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        figures, outs = alternate(
            args.rounds,
            ["static", "dynamic"],
            lambda balance, round_: run(Path(tmp), args, balance, round_),
            "per_minute",
            "generations/min",
        )
    placed = [o["placed"] for o in outs if o["placed"]]
    print(
        summary(
            "generations_per_minute",
            figures,
            ("dynamic", "static"),
            factor=args.factor,
            last_dynamic_placement=placed[-1] if placed else None,
        )
    )


if __name__ == "__main__":
    main()
