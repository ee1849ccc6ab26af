"""Bus bandwidth of every aggregation method against the backend's native all-reduce.

    .venv/bin/python benchmarks/allreduce.py                 # world sizes 2 and 4, 4 KiB..64 MiB
    .venv/bin/python benchmarks/allreduce.py --world-sizes 2 --rounds 5

For each world size, N processes join a gloo group on 127.0.0.1 and time
`aggregator.start(bucket).wait()` (what training does: the p2p methods run on
their communication thread) for each message size; `--blocking` times the
algorithm alone (`all_reduce_` in the calling thread). Methods alternate within
each round, so a noisy machine slows them alike; the reported time is the
median over rounds of the slowest rank's mean time per reduction.

Bus bandwidth (as in nccl-tests) = bytes * 2 (n - 1) / n / time: the rate at
which each rank's links carry an all-reduce that moves the minimum volume, so
figures are comparable across world sizes. The goals of issue 5: ring >= 0.9 x
native from 1 MiB up; tree faster than ring at 16 KiB and below.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from pydantic import TypeAdapter

from shoal.comm.config import AggregationConfig
from shoal.comm.links import CommGroup
from shoal.comm.methods import build_aggregator
from shoal.launch.process_group import loopback_interface
from shoal.shape.hosts import Hosts

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def methods(world_size: int) -> dict[str, dict[str, Any]]:
    return {
        "native": {"method": "native"},
        "ring": {"method": "ring"},
        "tree": {"method": "tree"},
        # two groups of two at n = 4 (one group of 2 at n = 2: reduce, a trivial ring, broadcast)
        "hierarchical": {"method": "hierarchical", "branching_factor": 2},
        "parameter_server": {"method": "parameter_server", "num_servers": world_size},
    }


def _iterations(size: int) -> int:
    """Enough reductions for ~0.1 s of traffic at ~1 GB/s, at least 3."""
    return max(3, min(200, (100 << 20) // max(size, 1) // 8))


def _overlapped(aggregator: Any) -> Any:
    """What training does: start (on the communication thread, for p2p methods), then wait."""
    return lambda bucket: aggregator.start(bucket).wait()


def _blocking(aggregator: Any) -> Any:
    """The algorithm alone, in the calling thread (native: a blocking all_reduce)."""
    return aggregator.all_reduce_


def _worker(rank: int, world_size: int, store: str, args: argparse.Namespace, out: str) -> None:
    loopback = loopback_interface()
    if loopback:
        os.environ["GLOO_SOCKET_IFNAME"] = loopback
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store, world_size),
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=300),
    )
    adapter = TypeAdapter(AggregationConfig)
    chosen = {m: c for m, c in methods(world_size).items() if m in args.methods}
    aggregators = {
        name: build_aggregator(
            adapter.validate_python(config),
            CommGroup.create(rank, world_size, Hosts.consecutive(world_size, 2), 300.0),
        )
        for name, config in chosen.items()
    }
    results: dict[str, dict[str, list[float]]] = {}
    for size in args.sizes:
        bucket = torch.randn(size // 4)
        iterations = _iterations(size)
        per_method: dict[str, list[float]] = {name: [] for name in aggregators}
        for _ in range(args.rounds):
            for name, aggregator in aggregators.items():
                reduce = _blocking(aggregator) if args.blocking else _overlapped(aggregator)
                reduce(bucket)  # warm-up: connections, scratch buffers
                dist.barrier()
                started = time.perf_counter()
                for _ in range(iterations):
                    reduce(bucket)
                elapsed = torch.tensor([(time.perf_counter() - started) / iterations])
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                per_method[name].append(float(elapsed.item()))
        results[str(size)] = per_method
        if rank == 0:
            shown = "  ".join(
                f"{n} {statistics.median(t) * 1e3:.3f} ms" for n, t in per_method.items()
            )
            print(f"n={world_size} {size >> 10} KiB: {shown}", flush=True)
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def _label(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


def report(world_size: int, results: dict[str, dict[str, list[float]]]) -> list[str]:
    names = list(next(iter(results.values())))
    lines = [
        f"### world size {world_size}",
        "",
        "bus bandwidth in GB/s (ratio to native)",
        "",
        "| size | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    goals = []
    for size_text, per_method in results.items():
        size = int(size_text)
        times = {n: statistics.median(t) for n, t in per_method.items()}
        factor = 2 * (world_size - 1) / world_size
        cells = []
        for name in names:
            busbw = size * factor / times[name] / 1e9
            ratio = times["native"] / times[name] if "native" in times else float("nan")
            cells.append(f"{busbw:.3f} ({ratio:.2f}x)")
        lines.append(f"| {_label(size)} | " + " | ".join(cells) + " |")
        if "ring" in times and "native" in times and size >= 1 << 20:
            ratio = times["native"] / times["ring"]
            goals.append(f"ring/native at {_label(size)}: {ratio:.2f} (goal >= 0.9)")
        if "tree" in times and "ring" in times and size <= 16 << 10:
            ratio = times["ring"] / times["tree"]
            goals.append(f"tree speed-up over ring at {_label(size)}: {ratio:.2f} (goal > 1)")
    return [*lines, "", *goals, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="bytes")
    parser.add_argument("--methods", nargs="+", default=list(methods(2)))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--blocking",
        action="store_true",
        help="time the blocking all_reduce_ in the calling thread instead of start().wait()",
    )
    args = parser.parse_args()
    if "native" not in args.methods:
        args.methods.insert(0, "native")
    output = []
    for world_size in args.world_sizes:
        with tempfile.TemporaryDirectory() as folder:
            store, out = str(Path(folder) / "store"), str(Path(folder) / "results.json")
            mp.spawn(_worker, args=(world_size, store, args, out), nprocs=world_size)
            results = json.loads(Path(out).read_text())
        output += report(world_size, results)
    print("\n" + "\n".join(output))


if __name__ == "__main__":
    main()
