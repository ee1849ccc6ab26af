"""`kge_vs_pbg.py --graph synthetic`: the parameter server against partitioned PyTorch-BigGraph
on a synthetic graph of millions of entities, both models ranked by ONE evaluator.

    ../shared/tools/one-at-a-time .venv/bin/python benchmarks/kge_vs_pbg.py --graph synthetic \\
        --entities 5000000 --edges 50000000 --pbg-partitions 8 [--train-edges N] \\
        [--dim 64] [--contenders pbg shoal-ps] [--reuse earlier.json] [--out result.json]

The graph is `shoal kge synthesize`'s (kge_scale.py's cache in `--data`). Both train the
model and settings of the FB15k-237 comparison (kge_vs_pbg.py's docstring; PBG with
dynamic relations, its recipe) on the same training edges: one epoch, or the first
`--train-edges` of the (randomly ordered) training split when an epoch does not fit
the time; shoal then stops after as many steps as cover them. PBG trains with the
entities in `--pbg-partitions` partitions (its way of training graphs that outgrow
memory; pbg_child.py places entities and writes its bucketed edge files once).

Measured: training triples/s (PBG: its Hogwild phases, and its whole train() call with
partition swaps; shoal: its step time, and its whole run), peak memory of every process
(tree_peaks.py). Then ONE evaluator ranks both models: shoal's sampled filtered ranking
(`rank_sampled`, OGB wikikg2's protocol: `--sampled-negatives` per query and side, the
same draws for both, filtered through the graph's on-disk index) of the first
`--eval-triples` test triples, both directions. PBG's rows come back from its partitioned
checkpoint in shoal's id order.

`--contenders shoal-ps --reuse earlier.json` re-runs shoal alone and compares it with the
PBG line (and its ranking) of an earlier result file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from kge_scale import ensure_graph, measured, memory_cell, read_peaks
from kge_vs_pbg import pbg_run, pbg_twin, shoal_model, shoal_ps_run


def add_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--graph synthetic")
    group.add_argument("--entities", type=int, default=5_000_000)
    group.add_argument("--edges", type=int, default=50_000_000, help="all splits")
    group.add_argument("--pbg-partitions", type=int, default=8)
    group.add_argument("--train-edges", type=int, default=None, help="default: one epoch")
    group.add_argument("--eval-triples", type=int, default=5000, help="first test triples")
    group.add_argument("--sampled-negatives", type=int, default=500, help="per query and side")
    group.add_argument("--data", type=Path, default=Path("/work/kge-scale-data"))
    group.add_argument("--contenders", nargs="+", choices=("pbg", "shoal-ps"))
    group.add_argument("--reuse", type=Path, default=None, help="earlier --out file")


def one_evaluator(model: Any, graph_folder: Path, args: argparse.Namespace) -> dict[str, float]:
    """shoal's sampled filtered ranking of the first `--eval-triples` test triples."""
    from shoal.tasks.kge.evaluation import metrics_from_sums, rank_metric_sums, rank_sampled
    from shoal.tasks.kge.prepared.graph import PreparedGraph

    graph = PreparedGraph.open(graph_folder)
    test = torch.from_numpy(np.asarray(graph.splits["test"][: args.eval_triples]))
    started = time.perf_counter()
    ranks = rank_sampled(
        model,
        test,
        graph.filter,
        0,
        len(test),
        args.sampled_negatives,
        graph.num_entities,
        0,
        256,
        1 << 24,
        torch.device("cpu"),
    )
    metrics = metrics_from_sums(rank_metric_sums(ranks, [1, 3, 10]), [1, 3, 10])
    return {**metrics, "ranked": len(ranks), "eval_s": time.perf_counter() - started}


def train_edges(args: argparse.Namespace, graph_folder: Path) -> int:
    """One epoch's training edges, or the first `--train-edges` of them."""
    available = int(np.load(graph_folder / "train.npy", mmap_mode="r").shape[0])
    return available if args.train_edges is None else min(args.train_edges, available)


def pbg_side(args: argparse.Namespace, graph: Path, edges: int, work: Path) -> dict[str, Any]:
    peaks = work / "pbg.peaks.json"
    settings = {
        "prepared": str(graph),
        "partitions": args.pbg_partitions,
        "train_edges": edges,
        "export": True,
    }
    r = pbg_run(work, args, "dynamic", "pbg-synthetic", False, settings, measured(peaks))
    r["wall_triples_per_s"] = edges / r["train_call_wall_s"]
    r.update(read_peaks(peaks))
    r["test"] = one_evaluator(pbg_twin(np.load(r["tables"])), graph, args)
    Path(r["tables"]).unlink()
    return r


def shoal_side(args: argparse.Namespace, graph: Path, edges: int, work: Path) -> dict[str, Any]:
    peaks = work / "shoal.peaks.json"
    steps = -(-edges // (args.workers * args.batch_size))
    sections: dict[str, dict[str, Any]] = {
        "task": {
            "data": {"prepared": str(graph)},
            "evaluation": {"ranking": "sampled", "max_triples": 256},  # its own; not compared
        },
        "monitor": {"log_every_steps": 50, "progress": "off"},
    }
    r = shoal_ps_run(work, args, "shoal-synthetic", False, steps, measured(peaks), sections)
    r["steps"] = steps
    r["wall_triples_per_s"] = edges / r["run_wall_s"]
    r.update(read_peaks(peaks))
    r["test"] = one_evaluator(shoal_model(Path(r["embeddings"])), graph, args)
    return r


def run(args: argparse.Namespace) -> None:
    contenders = args.contenders or ["pbg", "shoal-ps"]
    graph = ensure_graph(args.data, args.entities, args.edges)
    edges = train_edges(args, graph)
    print(
        f"synthetic graph {graph.name}: {edges:,} training edges each, dim {args.dim}, "
        f"PBG in {args.pbg_partitions} partitions, {args.workers} workers each; one evaluator: "
        f"sampled filtered ranking, {args.sampled_negatives} per side, first "
        f"{args.eval_triples} test triples; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    runs: dict[str, dict[str, Any]] = {}
    if args.reuse:
        runs.update(json.loads(args.reuse.read_text())["runs"])
    for name in contenders:
        work = args.data / "work-pbg-synthetic"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        load = os.getloadavg()[0]
        side = pbg_side if name == "pbg" else shoal_side
        r = side(args, graph, edges, work)
        r.update(load_before=load, load_after=os.getloadavg()[0], train_edges=edges)
        runs[name] = r
        print(json.dumps({name: r}), flush=True)
        shutil.rmtree(work, ignore_errors=True)
    print(table(runs))
    if args.out:
        record = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}
        args.out.write_text(json.dumps(record, indent=1))


def table(runs: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| contender | edges trained | triples/s (training) | triples/s (whole run) | "
        "MRR | Hits@1 | Hits@3 | Hits@10 | peak RSS per process (MiB) | sum | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in runs.items():
        t = r["test"]
        total = sum(p["peak_rss_mib"] for p in r["processes"])
        lines.append(
            f"| {name} | {r['train_edges']:,} | {r['triples_per_s']:,.0f} | "
            f"{r['wall_triples_per_s']:,.0f} | {t['mrr']:.4f} | {t['hits@1']:.4f} | "
            f"{t['hits@3']:.4f} | {t['hits@10']:.4f} | "
            f"{memory_cell(r['processes'], 'peak_rss_mib')} | {total:,.0f} | "
            f"{r['load_before']:.2f} |"
        )
    if {"pbg", "shoal-ps"} <= runs.keys():
        ratio = runs["shoal-ps"]["triples_per_s"] / runs["pbg"]["triples_per_s"]
        gap = runs["shoal-ps"]["test"]["mrr"] - runs["pbg"]["test"]["mrr"]
        lines.append(f"\nshoal / PBG triples/s = {ratio:.2f}; MRR shoal - PBG = {gap:+.4f}")
    return "\n".join(lines)
