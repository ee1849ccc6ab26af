"""Tables larger than the job's memory: a parameter-server epoch with `shard_dir`, the whole
job (launcher, workers, servers) in one memory cgroup whose limit the tables exceed.

Writes a graph of `--entities` entities, each in one training triple (so the tables,
entities x dim floats, dwarf the data), and trains one epoch of it under
`parameter_server` (dedicated servers, row-wise Adagrad) with every server's shard in
memory-mapped files. The job runs in a fresh cgroup v1 memory controller
(`/sys/fs/cgroup/memory`, root only) limited to `--limit-mb`; the script prints the
tables' size against the limit, the cgroup's peak usage and OOM-kill count, and the
epoch's triples/s. `--control` runs the same job with the shards in memory in the same
limit, which must fail (the kernel kills it).

    .venv/bin/python benchmarks/kge_out_of_core.py --entities 500000 --dim 1024 --limit-mb 1024
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _cgroup import joiner, memory_cgroup, unavailable, usage

CHILD = (
    "import json, sys, shoal\n"
    "results = shoal.train(json.load(open(sys.argv[1])))\n"
    "json.dump(results, open(sys.argv[2], 'w'), default=str)\n"
)


def write_graph(folder: Path, entities: int) -> Path:
    path = folder / "train.txt"
    with path.open("w") as out:
        for i in range(entities // 2):
            out.write(f"e{2 * i}\tr{i % 16}\te{2 * i + 1}\n")
    return path


def job(folder: Path, train: Path, args: argparse.Namespace, files: bool) -> dict[str, Any]:
    strategy: dict[str, Any] = {
        "type": "parameter_server",
        "num_workers": args.workers,
        "num_servers": args.servers,
        "mode": "async",
        "optimizer": {"kind": "adagrad", "lr": 0.1},
    }
    if files:
        strategy["shard_dir"] = str(args.shard_dir or folder / "shards")
    return {
        "task": {
            "type": "kge",
            "dim": args.dim,
            "model": {"type": "distmult"},
            "data": {"train": str(train)},
            "negatives": {"num_negatives": 64, "chunk_size": 64},
            "loss": {"kind": "softmax"},
        },
        "train": {"epochs": 1, "batch_size": args.batch_size, "eval_every_epochs": 0},
        "strategy": strategy,
        "checkpoint": {"every_epochs": 0},
        "run": {"dir": str(folder / "runs"), "name": "files" if files else "memory"},
        "monitor": {"progress": "off"},
        "faults": {"timeout_s": 600.0, "heartbeat_timeout_s": 600.0},
    }


def run_limited(config: dict[str, Any], folder: Path, limit: int) -> dict[str, Any]:
    """`config` trained by a child process in a fresh cgroup limited to `limit` bytes (on the
    way out, stopped or not, no process of the job is left behind)."""
    with memory_cgroup(f"out-of-core-{config['run']['name']}", limit) as group:
        path, out = folder / f"{config['run']['name']}.json", folder / "results.json"
        path.write_text(json.dumps(config))
        out.unlink(missing_ok=True)
        started = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path), str(out)],
            preexec_fn=joiner(group),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        log, _ = child.communicate()
        wall = time.perf_counter() - started
        used = usage(group)
    report = {
        "exit_code": child.returncode,
        "wall_s": round(wall, 1),
        "cgroup_peak_bytes": used.peak_bytes,
        "cgroup_failcnt": used.failcnt,
        "oom_kills": used.oom_kills,
    }
    if child.returncode == 0:
        results = json.loads(out.read_text())
        train = results.get("train") if isinstance(results.get("train"), dict) else {}
        report["triples_per_s"] = results.get("samples_per_s", train.get("samples_per_s"))
        report["steps"] = results.get("steps")
        report["servers"] = results.get("parameter_server", {}).get("servers")
    else:
        report["log_tail"] = log[-2000:]
    return report


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped (SIGTERM)"))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entities", type=int, default=500_000)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--limit-mb", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--shard-dir", type=Path, default=None)
    parser.add_argument("--control", action="store_true", help="also run in memory (must fail)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    why = unavailable()
    if why is not None:
        sys.exit(f"{why}: not run")
    limit = args.limit_mb << 20
    table_bytes = args.entities * args.dim * 4 + args.entities * 4  # rows + Adagrad's sums
    print(
        f"tables {table_bytes / 2**30:.2f} GiB (rows and row Adagrad state), job limit "
        f"{limit / 2**30:.2f} GiB: {table_bytes / limit:.2f}x",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="shoal-ooc-") as tmp:
        folder = Path(tmp)
        train = write_graph(folder, args.entities)
        reports = {"files": run_limited(job(folder, train, args, True), folder, limit)}
        print(json.dumps(reports["files"], indent=2), flush=True)
        if args.control:
            reports["memory"] = run_limited(job(folder, train, args, False), folder, limit)
            print(json.dumps(reports["memory"], indent=2), flush=True)
    summary = {"table_bytes": table_bytes, "limit_bytes": limit, "args": vars(args), **reports}
    if args.out is not None:
        args.out.write_text(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    main()
