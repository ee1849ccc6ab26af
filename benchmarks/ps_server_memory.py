"""What building its shard costs a parameter server, against the table: 1, 2 and 4 servers.

A graph of `--entities` entities, each in one training triple, dim `--dim`; each run
trains 2 steps under `parameter_server` (dedicated servers, SGD) and reads
`server_build_peak_bytes` from results.json: how far building its shard raised each
server's resident set (peak reset just before, measured in the server process). A
server that built the full table and kept its rows would show at least the table.

    .venv/bin/python benchmarks/ps_server_memory.py --entities 400000 --dim 128
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import shoal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entities", type=int, default=400_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    table = 4 * args.entities * args.dim
    print(f"entity table: {args.entities} x {args.dim} float32 = {table / 2**20:.1f} MiB")
    print("| servers | each server's build growth, MiB | / table | / (table / servers) |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="shoal-psmem-") as tmp:
        folder = Path(tmp)
        train = folder / "train.txt"
        train.write_text(
            "".join(f"e{2 * i}\tr{i % 4}\te{2 * i + 1}\n" for i in range(args.entities // 2))
        )
        for servers in args.servers:
            results = shoal.train(
                {
                    "task": {
                        "type": "kge",
                        "dim": args.dim,
                        "model": {"type": "distmult"},
                        "data": {"train": str(train)},
                        "loss": {"kind": "softmax"},
                    },
                    "train": {"max_steps": 2, "batch_size": 256, "eval_every_epochs": 0},
                    "strategy": {
                        "type": "parameter_server",
                        "num_workers": 2,
                        "num_servers": servers,
                        "optimizer": {"kind": "sgd", "lr": 0.1},
                    },
                    "checkpoint": {"every_epochs": 0},
                    "run": {"dir": str(folder / "runs"), "name": f"s{servers}"},
                    "monitor": {"progress": "off"},
                }
            )
            grew = results["parameter_server"]["server_build_peak_bytes"]
            mib = ", ".join(f"{g / 2**20:.1f}" for g in grew)
            worst = max(grew)
            print(
                f"| {servers} | {mib} | {worst / table:.2f} | {worst / (table / servers):.2f} |",
                flush=True,
            )
            print(json.dumps({"servers": servers, "build_peak_bytes": grew}), flush=True)


if __name__ == "__main__":
    main()
