"""Two hosts over a slow link: data-parallel step time by aggregation method, and the
parameter server's throughput with its servers dealt over the hosts or on one (as root).

    .venv/bin/python benchmarks/multi_host.py --part dp --rate-mbit 100 --rounds 2
    .venv/bin/python benchmarks/multi_host.py --part dp --rate-mbit 1000 --rounds 2
    .venv/bin/python benchmarks/multi_host.py --part ps --rate-mbit 100 --rounds 2
    .venv/bin/python benchmarks/multi_host.py --part mesh --rate-mbit 100 --rounds 2

Builds a cluster of `--hosts` hosts in network namespaces (tests/cluster/netns.py:
own address and host name, a bridge between them, every host's link shaped to
`--rate-mbit` each way with tc) and runs dp_vs_ddp's model (the MLP
[1024, 2048, 2048, 2048, 10], 10.5M parameters, 40 MiB of gradients per step) as
a user would on each host: `torchrun --nnodes H --nproc-per-node P --rdzv-backend
c10d -m shoal train job.toml`. Ranks on one host talk over that host's loopback;
only traffic between hosts crosses the shaped links. Contenders alternate within
each round. Step time is the mean over the timed steps (after `--skip`) of
shoal's own step time (forward, backward, gradient communication, optimizer step),
from rank 0's metrics.jsonl; a cell is the median over rounds. Everything is
removed at the end, also on failure.

`--part ps`: TransE (dim 200, 64 negatives, batch 1024, lazy Adam on the servers,
async) on FB15k-237 (../shared/datasets/fb15k-237), 4 workers and 2 co-located
servers: on ranks 0 and 2, one per host (`colocate_by_host = true`, the default)
or on ranks 0 and 1, both on host 0. Triples/s of training time (the sum of
samples over the sum of step times in rank 0's metrics.jsonl, like
benchmarks/kge_ps_scaling.py), after `--skip` steps.

`--part mesh`: the lm task on tinyshakespeare (../shared/datasets/tinyshakespeare, 1% held out;
dim 64, 4 heads, 4 layers, context 128, global batch 16, AdamW) under `hybrid`
`{ data = 2, tensor = 2 }`, started as a Slurm step with srun's cyclic
distribution (ranks 0, 2 on host 0; 1, 3 on host 1; one `python -m shoal train`
per task with srun's variables, tests/cluster/jobs.py): laid out by host
(`place_by_host = true`: tensor groups {0, 2} and {1, 3} inside the hosts, FSDP's
data dimension across) or in rank order (`false`: tensor groups {0, 1} and
{2, 3} across the hosts, data inside). Step time as for `--part dp`. The model is
small against its activations (1,024 tokens per data rank and step, dim 64), as
tensor parallelism's is on a real machine: its per-block all-reduces of
activations are the heavy traffic, FSDP's gathers of the parameters the light.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cluster.jobs import start_slurm, start_torchrun  # noqa: E402
from tests.cluster.netns import Cluster, unavailable  # noqa: E402

CONTENDERS: dict[str, dict[str, Any]] = {
    "native": {"method": "native"},
    "ring": {"method": "ring"},
    "hierarchical": {"method": "hierarchical"},
    "hierarchical + top-k 1%": {
        "method": "hierarchical",
        "compression": {"kind": "topk", "ratio": 0.01},
    },
}


PS_CONTENDERS: dict[str, bool] = {"servers on both hosts": True, "servers on host 0": False}
MESH_CONTENDERS: dict[str, bool] = {"placed by host": True, "rank order": False}
FB15K = REPO.parent / "shared" / "datasets" / "fb15k-237"
SHAKESPEARE = REPO.parent / "shared" / "datasets" / "tinyshakespeare" / "input.txt.gz"


def mesh_job(by_host: bool, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "task": {
            "type": "lm",
            "data": {"train": str(SHAKESPEARE), "split": 0.99},
            "model": {"dim": 64, "heads": 4, "layers": 4, "context": 128},
        },
        "strategy": {
            "type": "hybrid",
            "mesh": {"data": args.hosts, "tensor": args.per_host},
            "place_by_host": by_host,
        },
        "train": {
            "max_steps": args.steps,
            "batch_size": 16,
            "drop_last": True,
            "seed": 0,
            "optimizer": {"kind": "adamw", "lr": 1e-3},
            "eval_every_epochs": 0,
        },
        "checkpoint": {"every_epochs": 0, "at_end": False, "keep_best": False},
        "monitor": {"log_every_steps": 1, "progress": "off"},
        "faults": {"timeout_s": 600},
    }


def ps_job(by_host: bool, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "task": {
            "type": "kge",
            "dim": 200,
            "model": {"type": "transe", "p": 2},
            "data": {"train": str(FB15K / "train.txt.gz")},
            "negatives": {"num_negatives": 64, "chunk_size": 64},
            "loss": {"kind": "margin_ranking", "margin": 1.0, "adversarial_temperature": 1.0},
        },
        "strategy": {
            "type": "parameter_server",
            "num_workers": args.hosts * args.per_host,
            "num_servers": args.hosts,
            "placement": "colocated",
            "colocate_by_host": by_host,
            "mode": "async",
            "optimizer": {"kind": "lazy_adam", "lr": 3e-3},
            "barrier_timeout_s": 300.0,
        },
        "train": {
            "max_steps": args.steps,
            "batch_size": 1024,
            "seed": 0,
            "eval_every_epochs": 0,
        },
        "checkpoint": {"every_epochs": 0, "at_end": False, "keep_best": False},
        "monitor": {"log_every_steps": 1, "progress": "off"},
        "faults": {"timeout_s": 600},
    }


def dp_job(aggregation: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    return {
        "task": {
            "type": "classification",
            "data": {
                "samples": 20000,
                "features": 1024,
                "informative": 16,
                "classes": 10,
                "seed": 0,
                "valid_fraction": 0.2,
            },
            "model": {"hidden": [2048, 2048, 2048]},
        },
        "strategy": {
            "type": "data_parallel",
            "num_replicas": args.hosts * args.per_host,
            "aggregation": aggregation,
        },
        "train": {
            "max_steps": args.steps,
            "batch_size": 256,
            "seed": 0,
            "optimizer": {"kind": "sgd", "lr": 0.01, "momentum": 0.9},
            "eval_every_epochs": 0,
        },
        "checkpoint": {"every_epochs": 0, "at_end": False, "keep_best": False},
        "monitor": {"log_every_steps": 1, "progress": "off"},
        "faults": {"timeout_s": 600},
    }


def timed_steps(run_dir: Path, skip: int) -> list[dict[str, Any]]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["event"] == "train" and r["step"] > skip]


def step_seconds(run_dir: Path, skip: int) -> float:
    timed = timed_steps(run_dir, skip)
    return sum(r["step_s"] for r in timed) / len(timed)


def triples_per_s(run_dir: Path, skip: int) -> float:
    timed = timed_steps(run_dir, skip)
    return sum(r["samples"] for r in timed) / sum(r["step_s"] for r in timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=["dp", "ps", "mesh"], default="dp")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--per-host", type=int, default=2, help="ranks per host")
    parser.add_argument("--rate-mbit", type=float, default=100.0)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--skip", type=int, default=2, help="steps not timed (warm-up)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--contenders", nargs="+", help="default: every one of the part")
    parser.add_argument("--work", type=Path, default=Path("/tmp/shoal-multi-host"))
    args = parser.parse_args()
    why_not = unavailable()
    if why_not:
        sys.exit(why_not)
    args.work.mkdir(parents=True, exist_ok=True)
    tables: dict[str, dict[str, Any]] = {
        "dp": CONTENDERS,
        "ps": PS_CONTENDERS,
        "mesh": MESH_CONTENDERS,
    }
    table = tables[args.part]
    contenders = args.contenders or list(table)
    found: dict[str, list[float]] = {name: [] for name in contenders}
    with Cluster(args.hosts, tag="bench") as cluster:
        shaping = cluster.shape(args.rate_mbit)
        rate, _ = cluster.measure_mbit(receiver=0, sender=1, megabytes=8)
        print(f"{args.hosts} hosts x {args.per_host} ranks; {shaping}; measured {rate:.1f} Mbit/s")
        for round_ in range(args.rounds):
            for name in contenders:
                label = "".join(c for c in name if c.isalnum())
                run_name = f"{args.part}-{label}-{round_}-{int(args.rate_mbit)}"
                if args.part == "mesh":
                    job = mesh_job(MESH_CONTENDERS[name], args)
                    run = start_slurm(cluster, job, args.work, run_name, args.per_host, cyclic=True)
                else:
                    if args.part == "dp":
                        job = dp_job(CONTENDERS[name], args)
                    else:
                        job = ps_job(PS_CONTENDERS[name], args)
                    run = start_torchrun(cluster, job, args.work, run_name, args.per_host)
                run.wait(3000).check()
                measure = triples_per_s if args.part == "ps" else step_seconds
                found[name].append(measure(run.run_dir, args.skip))
                unit = "triples/s" if args.part == "ps" else "s/step"
                print(f"round {round_ + 1} {name}: {found[name][-1]:.3f} {unit}", flush=True)
    if args.part == "dp":
        dp_table(found, args.rounds)
    elif args.part == "mesh":
        versus_table(found, "rank order", ("data 2 x tensor 2", "step (s)"), args.rounds, False)
    else:
        versus_table(found, "servers on host 0", ("servers", "triples/s"), args.rounds, True)


def dp_table(times: dict[str, list[float]], rounds: int) -> None:
    native = statistics.median(times["native"]) if times.get("native") else None
    ring = statistics.median(times["ring"]) if times.get("ring") else None
    print(f"\n| method | step (s), median of {rounds} | rounds | vs native | vs ring |")
    print("|---|---|---|---|---|")
    for name, found in times.items():
        median = statistics.median(found)
        cells = " ".join(f"{t:.3f}" for t in found)
        vs_native = f"{native / median:.2f}x" if native else "-"
        vs_ring = f"{ring / median:.2f}x" if ring else "-"
        print(f"| {name} | {median:.3f} | {cells} | {vs_native} | {vs_ring} |")


def versus_table(
    found: dict[str, list[float]], base: str, head: tuple[str, str], rounds: int, rate: bool
) -> None:
    """One row per contender: median, rounds, ratio against `base` (> 1: better; `rate`:
    higher is better, else a time)."""
    reference = statistics.median(found[base]) if found.get(base) else None
    print(f"\n| {head[0]} | {head[1]}, median of {rounds} | rounds | vs {base} |")
    print("|---|---|---|---|")
    form = "{:,.0f}" if rate else "{:.3f}"
    for name, values in found.items():
        median = statistics.median(values)
        cells = " ".join(form.format(v) for v in values)
        ratio = "-"
        if reference:
            ratio = f"{(median / reference if rate else reference / median):.2f}x"
        print(f"| {name} | {form.format(median)} | {cells} | {ratio} |")


if __name__ == "__main__":
    main()
