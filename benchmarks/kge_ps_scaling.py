"""The parameter server on FB15k-237: throughput by workers, servers and mode; quality; PyKEEN.

TransE (L2), dim 200, 64 negatives per positive (chunks of 64 positives share them),
batch 1024, margin ranking with self-adversarial weights, lazy Adam (lr 3e-3) on the
servers: the settings of `benchmarks/kge_vs_pykeen.py`, whose pieces this reuses.

1. Throughput: `--steps` optimizer steps (a fraction of an epoch, no evaluation) for
   every (workers, servers, mode) in `--workers` x `--servers` x `--modes`;
   triples/s of training time (the workers' step time, as metrics.jsonl reports it).
2. PyKEEN's throughput, alternately, on the first `--pykeen-triples` training triples
   (a whole epoch of all 272k triples takes PyKEEN ~10 minutes on this machine).
3. Quality: `--epochs` epochs of the parameter server with 2 workers and 2 servers in
   each mode of `--quality-modes`, then filtered test MRR / Hits@10 on all test triples.
4. `--dglke`: DGL-KE's CPU benchmark configuration (TransE_l2, dim 400, 200 negatives,
   batch 1024 as in its scripts) with 2 workers and 2 servers, async: triples/s.

    .venv/bin/python benchmarks/kge_ps_scaling.py [--steps 60] [--epochs 3] [--threads 1]

Needs pykeen (the dev extra) and ../shared/datasets/fb15k-237/.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kge_vs_pykeen import pykeen_run, shoal_run

PLACEMENT = {"placement": "dedicated"}


def ps(workers: int, servers: int, mode: str, lr: float, kind: str = "lazy_adam") -> dict[str, Any]:
    return {
        **PLACEMENT,
        "type": "parameter_server",
        "num_workers": workers,
        "num_servers": servers,
        "mode": mode,
        "max_staleness": 2,
        "optimizer": {"kind": kind, "lr": lr},
        "barrier_timeout_s": 240.0,
    }


def throughput(
    work: Path,
    args: argparse.Namespace,
    name: str,
    strategy: dict[str, Any],
    **sections: dict[str, Any],
) -> dict[str, Any]:
    overrides = {"train": {"max_steps": args.steps}, "run": {"name": name}, **sections}
    return shoal_run(work, args, 0, False, strategy, overrides)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--modes", nargs="+", default=["sync", "async", "bounded"])
    parser.add_argument("--quality-modes", nargs="*", default=["sync", "async"])
    parser.add_argument("--pykeen-triples", type=int, default=20_000)
    parser.add_argument("--pykeen-rounds", type=int, default=2)
    parser.add_argument("--dglke", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--placement", choices=("dedicated", "colocated"), default="dedicated")
    parser.add_argument("--out", type=Path, default=None, help="write every figure as JSON")
    cli = parser.parse_args()
    PLACEMENT["placement"] = cli.placement
    # the settings kge_vs_pykeen.py uses for both contenders
    args = argparse.Namespace(
        dim=200,
        p=2,
        negatives=64,
        chunk_size=64,
        batch_size=1024,
        seed=0,
        lr=1e-3,
        shoal_lr=3e-3,
        threads=cli.threads,
        epochs=1,
        crosscheck=0,
        steps=cli.steps,
        train_limit=cli.pykeen_triples,
    )
    print(
        f"FB15k-237 TransE L2 dim 200, 64 negatives, batch 1024, {cli.threads} thread(s) per "
        f"process; {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    report: dict[str, Any] = {"throughput": [], "pykeen": [], "quality": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for round_ in range(cli.pykeen_rounds):
            r = pykeen_run(work, args, False)
            report["pykeen"].append(r)
            print(
                f"pykeen (first {cli.pykeen_triples} triples): {r['triples_per_s']:8,.0f} "
                f"triples/s  load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            if round_ == 0:
                for workers, servers, mode in itertools.product(
                    cli.workers, cli.servers, cli.modes
                ):
                    name = f"ps-{workers}w-{servers}s-{mode}"
                    r = throughput(work, args, name, ps(workers, servers, mode, args.shoal_lr))
                    r.update(workers=workers, servers=servers, mode=mode)
                    report["throughput"].append(r)
                    print(
                        f"{name:22s} {r['triples_per_s']:8,.0f} triples/s  load "
                        f"{os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
        for mode in cli.quality_modes:
            args.epochs = cli.epochs
            name = f"quality-2w-2s-{mode}"
            r = shoal_run(
                work,
                args,
                0,
                True,
                ps(2, 2, mode, args.shoal_lr),
                {"run": {"name": name}, "task": {"evaluation": {"batch_size": 256}}},
            )
            r.update(mode=mode, epochs=cli.epochs)
            report["quality"].append(r)
            print(
                f"{name:22s} {r['triples_per_s']:8,.0f} triples/s  after {cli.epochs} epochs: "
                f"test MRR {r['mrr']:.4f}  Hits@10 {r['hits@10']:.4f}",
                flush=True,
            )
        if cli.dglke:
            dgl = argparse.Namespace(
                **{**vars(args), "dim": 400, "negatives": 200, "chunk_size": 200, "epochs": 1}
            )
            # DGL-KE's own server optimizer: row-wise Adagrad (its FB15k script: lr 0.25)
            r = throughput(work, dgl, "dglke-2w-2s-async", ps(2, 2, "async", 0.25, "adagrad"))
            report["dglke"] = r
            print(
                f"DGL-KE config (TransE_l2 dim 400, 200 negatives), 2w 2s async: "
                f"{r['triples_per_s']:8,.0f} triples/s (goal 68,000)",
                flush=True,
            )
    if cli.out:
        cli.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
