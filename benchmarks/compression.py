"""Time to a target accuracy over a slow link: dense vs top-k vs PowerSGD.

    sudo .venv/bin/python benchmarks/compression.py            # 2 workers, 100 Mbit/s, 1 ms
    sudo .venv/bin/python benchmarks/compression.py --rounds 2 --rate-mbit 100 --delay-ms 1

Each worker is a host of the namespace cluster of the tests
(tests/cluster/netns.py): a network namespace of its own, joined to the others
through a bridge by a veth pair whose two ends are shaped with `tc netem` (rate
and delay), so every worker has a slow full-duplex link and one-way latency of
`delay-ms` between workers. Where the kernel has no netem (tc answers "Specified
qdisc kind is unknown"), the ends are shaped by `tbf` (rate only) and the
script says that no delay was added. The script runs each contender as a
multi-machine job (shoal's torchrun path: RANK, WORLD_SIZE, MASTER_ADDR of the
first host; gloo listens where the route to it goes, the host's veth), and the
cluster removes everything at the end, also on failure. Traffic stays between
the namespaces it created. Needs root, `ip` and `tc` (iproute2).

Contenders alternate within each round. Time to target is measured from the
"training ..." line of rank 0's log (after imports and rendezvous) to the
first evaluation whose accuracy reaches the target; a contender that does not
reach it within --max-epochs or --timeout-s is reported as such. Bytes per
step are shoal's count (for native, the 2 (n - 1) / n volume it must send;
for top-k and PowerSGD, the payload of their collectives).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomli_w

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cluster.netns import Cluster, unavailable  # noqa: E402

CONTENDERS: dict[str, dict[str, Any]] = {
    "dense native": {
        "aggregation": {"method": "native"},
        "optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9},
    },
    "topk 1% (DGC)": {
        "aggregation": {
            "method": "native",
            "compression": {"kind": "topk", "ratio": 0.01, "momentum_correction": 0.9},
        },
        "optimizer": {"kind": "sgd", "lr": 0.05},
    },
    "powersgd r4": {
        "aggregation": {"method": "native", "compression": {"kind": "powersgd", "rank": 4}},
        "optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9},
    },
}


def job_config(
    contender: dict[str, Any], args: argparse.Namespace, run_dir: Path
) -> dict[str, Any]:
    return {
        "task": {
            "type": "classification",
            "data": {
                "samples": 24000,
                "features": 64,
                "informative": 10,
                "classes": 8,
                "class_sep": 2.0,
            },
            "model": {"hidden": [512, 512]},
        },
        "strategy": {
            "type": "data_parallel",
            "num_replicas": args.workers,
            "aggregation": contender["aggregation"],
        },
        "train": {
            "epochs": args.max_epochs,
            "batch_size": 256,
            "optimizer": contender["optimizer"],
            "seed": 1,
        },
        "checkpoint": {"every_epochs": 0, "at_end": False},
        "run": {"dir": str(run_dir), "threads_per_worker": 1},
        "monitor": {"progress": "off", "log_every_steps": 10},
        "faults": {"timeout_s": 120},
    }


_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_EVAL = re.compile(r"step (\d+) epoch \d+ valid: .*accuracy ([0-9.]+)")  # evaluation.py


def _time(line: str) -> float:
    stamp = _STAMP.match(line)
    assert stamp, line
    return datetime.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def time_to_target(log: Path, target: float) -> tuple[float, int] | None:
    """(seconds, step) from the start of training to the first evaluation reaching `target`."""
    if not log.is_file():
        return None
    started = None
    for line in log.read_text().splitlines():
        if started is None and " training " in line:
            started = _time(line)
        found = _EVAL.search(line)
        if started is not None and found and float(found.group(2)) >= target:
            return _time(line) - started, int(found.group(1))
    return None


def run_contender(
    net: Cluster, name: str, config: dict[str, Any], folder: Path, args: argparse.Namespace
) -> dict[str, Any]:
    run_name = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-") + f"-{int(time.time())}"
    config = {**config, "run": {**config["run"], "name": run_name}}
    job = folder / f"{run_name}.toml"
    job.write_text(tomli_w.dumps(config))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "MASTER_", "SHOAL"))}
    port = net.free_port(net.hosts[0])
    processes = []
    for rank in range(args.workers):
        env = {
            **base,
            "RANK": str(rank),
            "WORLD_SIZE": str(args.workers),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": net.hosts[0].address,
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        shoal = [sys.executable, "-m", "shoal", "train", str(job)]
        cmd = net.command(net.hosts[rank], shoal)
        out = open(folder / f"{run_name}-rank{rank}.out", "w")  # noqa: SIM115
        processes.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))
    log = Path(config["run"]["dir"]) / run_name / "logs" / "rank-0.log"
    deadline = time.monotonic() + args.timeout_s
    reached = None
    while time.monotonic() < deadline and any(p.poll() is None for p in processes):
        reached = time_to_target(log, args.target)
        if reached:
            break
        time.sleep(0.5)
    reached = reached or time_to_target(log, args.target)
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
    metrics = Path(config["run"]["dir"]) / run_name / "metrics.jsonl"
    records = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    train = [r for r in records if r.get("event") == "train"]
    sent = statistics.mean(r["sent_bytes_per_step"] for r in train) if train else float("nan")
    # seconds per step: the global batch over the interval's throughput
    step_s = statistics.median(256 / r["samples_per_s"] for r in train) if train else float("nan")
    return {
        "seconds": reached[0] if reached else None,
        "steps": reached[1] if reached else None,
        "sent_bytes_per_step": sent,
        "step_s": step_s,
        "best": max((r.get("accuracy", 0) for r in records if r.get("event") == "eval"), default=0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rate-mbit", type=float, default=100.0)
    parser.add_argument("--delay-ms", type=float, default=1.0)
    parser.add_argument("--target", type=float, default=0.80, help="validation accuracy")
    parser.add_argument("--max-epochs", type=int, default=30)
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per run")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS))
    args = parser.parse_args()
    why_not = unavailable()
    if why_not:
        sys.exit(f"{why_not}: run as root with iproute2 (apt-get install -y iproute2)")
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in args.contenders}
    with (
        tempfile.TemporaryDirectory() as tmp,
        Cluster(args.workers, tag="compress") as net,
    ):
        net.shape(args.rate_mbit, args.delay_ms)
        rate, _ = net.measure_mbit(receiver=0, sender=1, megabytes=4)
        print(f"slow network up: {args.workers} workers; {net.shaping}; measured {rate:.1f} Mbit/s")
        folder = Path(tmp)
        for round_ in range(args.rounds):
            for name in args.contenders:
                config = job_config(CONTENDERS[name], args, folder / "runs")
                found = run_contender(net, name, config, folder, args)
                results[name].append(found)
                print(f"round {round_ + 1} {name}: {found}", flush=True)
        shaping = net.shaping
    print(f"\n{args.workers} workers; {shaping}; target valid accuracy {args.target}\n")
    print("| contender | time to target (s) | steps | step (s) | sent bytes/step | speed-up |")
    print("|---|---|---|---|---|---|")
    dense = [r["seconds"] for r in results.get("dense native", []) if r["seconds"]]
    for name, runs in results.items():
        times = [r["seconds"] for r in runs if r["seconds"] is not None]
        median = statistics.median(times) if times else None
        steps = [int(r["steps"]) for r in runs if r["steps"] is not None]
        speedup = statistics.median(dense) / median if median and dense else None
        print(
            f"| {name} | {f'{median:.1f}' if median else 'not reached'} "
            f"| {int(statistics.median(steps)) if steps else '-'} "
            f"| {statistics.median(r['step_s'] for r in runs):.3f} "
            f"| {statistics.mean(r['sent_bytes_per_step'] for r in runs):,.0f} "
            f"| {f'{speedup:.2f}x' if speedup else '-'} |"
        )


if __name__ == "__main__":
    main()
