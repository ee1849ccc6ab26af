"""PyKEEN vs shoal `local` on FB15k-237: TransE, dim 200, 64 negatives per positive, batch 1024.

Both train the same triples (shoal's id maps are handed to PyKEEN, so both see the
same 272,115 training triples and the same test triples) for the same number of
epochs, alternately, `--rounds` times in one invocation, each in a fresh process.
Reported per run: training throughput (triples per second of training time:
PyKEEN's `train()` call; shoal's optimizer steps). The last round also evaluates
both models: filtered test MRR and Hits@10 (realistic ranks, both directions,
filtered by train + valid + test), on all 20,438 test triples, with one
evaluator (shoal's) for both. PyKEEN's own evaluator ranks the first
`--crosscheck` test triples of PyKEEN's model as well, next to shoal's evaluator
on the same triples: the two implementations of the metric must agree. (PyKEEN's
evaluator on all test triples takes far longer than its training on 2 cores.)

PyKEEN runs its defaults for TransE (sLCWA, basic negative sampler corrupting
head or tail, margin ranking loss with margin 1, dense Adam at its default lr
1e-3, entity rows renormalised every step) with the shared settings. shoal runs
its fast path: chunks of 64 positives share their 64 negatives (a matrix product
per chunk), sparse row gradients with lazy Adam (lr 3e-3), margin ranking with
margin 1 and self-adversarial weights, entity rows scored at unit length.
Both use `--threads` torch threads.

    .venv/bin/python benchmarks/kge_vs_pykeen.py [--rounds 2] [--epochs 3] [--p 2] [--threads 2]

Needs `pip install 'shoal[datasets]'` (pykeen) and ../shared/datasets/fb15k-237/.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomli_w

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "datasets" / "fb15k-237"
BIN = Path(sys.executable).parent


def pykeen_child(args: argparse.Namespace, out: Path) -> None:
    """One PyKEEN run (in its own process): train, then filtered test evaluation."""
    import numpy as np
    import torch
    from pykeen.evaluation import RankBasedEvaluator
    from pykeen.models import TransE
    from pykeen.training import SLCWATrainingLoop
    from pykeen.triples import TriplesFactory

    from shoal.tasks.kge.config import FilesDataConfig
    from shoal.tasks.kge.triples import load_kg

    data = load_kg(FilesDataConfig(**{s: str(DATA / f"{s}.txt.gz") for s in SPLITS}))
    entity_to_id = {label: i for i, label in enumerate(data.entities.labels)}
    relation_to_id = {label: i for i, label in enumerate(data.relations.labels)}

    def factory(triples: torch.Tensor) -> TriplesFactory:
        return TriplesFactory(triples, entity_to_id=entity_to_id, relation_to_id=relation_to_id)

    train = factory(data.train[: args.train_limit] if args.train_limit else data.train)
    valid, test = factory(data.splits["valid"].triples), factory(data.splits["test"].triples)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    model = TransE(
        triples_factory=train,
        embedding_dim=args.dim,
        scoring_fct_norm=args.p,
        random_seed=args.seed,
    )
    loop = SLCWATrainingLoop(
        model=model,
        triples_factory=train,
        optimizer=torch.optim.Adam(model.get_grad_params(), lr=args.lr),
        negative_sampler="basic",
        negative_sampler_kwargs={"num_negs_per_pos": args.negatives},
    )
    started = time.perf_counter()
    loop.train(
        triples_factory=train,
        num_epochs=args.epochs,
        batch_size=args.batch_size,
        use_tqdm=False,
        use_tqdm_batch=False,
    )
    train_s = time.perf_counter() - started
    report: dict[str, Any] = {
        "triples_per_s": args.epochs * train.num_triples / train_s,
        "train_s": train_s,
    }
    if not args.evaluate:
        out.write_text(json.dumps(report))
        return
    report.update(shoal_metrics(model, data, args, len(test.mapped_triples)))
    started = time.perf_counter()
    result = RankBasedEvaluator(filtered=True).evaluate(
        model,
        test.mapped_triples[: args.crosscheck],
        additional_filter_triples=[train.mapped_triples, valid.mapped_triples, test.mapped_triples],
        batch_size=256,
        use_tqdm=False,
    )
    report["crosscheck"] = {
        "triples": args.crosscheck,
        "pykeen_s": time.perf_counter() - started,
        "pykeen_mrr": float(result.get_metric("both.realistic.inverse_harmonic_mean_rank")),
        "pykeen_hits@10": float(result.get_metric("both.realistic.hits_at_10")),
        **{f"shoal_{k}": v for k, v in shoal_metrics(model, data, args, args.crosscheck).items()},
    }
    out.write_text(json.dumps(report))


def shoal_metrics(model: Any, data: Any, args: argparse.Namespace, limit: int) -> dict[str, float]:
    """Filtered metrics of a trained PyKEEN TransE by shoal's evaluator, on the first `limit`
    test triples: its tables are copied into a shoal TransE that scores -||h + r - t||_p."""
    import torch

    from shoal.tasks.kge.config import TransEConfig
    from shoal.tasks.kge.evaluation import (
        FilterIndex,
        metrics_from_sums,
        rank_metric_sums,
        rank_triples,
    )
    from shoal.tasks.kge.models import TransE

    config = TransEConfig(p=args.p, normalize_entities=False)
    twin = TransE(config, len(data.entities), len(data.relations), args.dim)
    with torch.no_grad():
        twin.entity.weight.copy_(model.entity_representations[0](indices=None))
        twin.relation.weight.copy_(model.relation_representations[0](indices=None))
    test = data.splits["test"].triples[:limit]
    answers = FilterIndex.of_split(data.filter, test)
    started = time.perf_counter()
    ranks = rank_triples(twin, test, answers, 0, len(test), 256, 1 << 24, torch.device("cpu"))
    metrics = metrics_from_sums(rank_metric_sums(ranks, [10]), [10])
    return {
        "mrr": metrics["mrr"],
        "hits@10": metrics["hits@10"],
        "eval_s": time.perf_counter() - started,
    }


SPLITS = ("train", "valid", "test")


def shoal_run(
    work: Path,
    args: argparse.Namespace,
    round_: int,
    evaluate: bool,
    strategy: dict[str, Any] | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
    launcher: list[str] | None = None,
) -> dict[str, Any]:
    """One shoal run: `local` with sparse rows and lazy Adam, or `strategy` (e.g. a parameter
    server, whose own optimizer then applies the rows); `overrides` merge into sections;
    `launcher` prefixes the command (a profiler that follows its subprocesses)."""
    data = {s: str(DATA / f"{s}.txt.gz") for s in SPLITS}
    if not evaluate:
        data = {"train": data["train"]}  # no held-out split: nothing is evaluated
    config: dict[str, Any] = {
        "task": {
            "type": "kge",
            "dim": args.dim,
            "model": {"type": "transe", "p": args.p},
            "data": data,
            "negatives": {"num_negatives": args.negatives, "chunk_size": args.chunk_size},
            "loss": {"kind": "margin_ranking", "margin": 1.0, "adversarial_temperature": 1.0},
            "sparse_gradients": True,
        },
        "train": {
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "seed": args.seed,
            "optimizer": {"kind": "sparse_adam", "lr": args.shoal_lr},
            "eval_every_epochs": 0,
        },
        "checkpoint": {"every_epochs": 0, "at_end": False, "keep_best": False},
        "run": {
            "dir": str(work / "runs"),
            "name": f"shoal-{round_}",
            "threads_per_worker": args.threads,
        },
        "monitor": {"log_every_steps": 20, "progress": "off"},
    }
    if strategy is not None:
        config["strategy"] = strategy
        config["task"]["sparse_gradients"] = False  # rows travel to the servers instead
    for section, values in (overrides or {}).items():
        config[section] = {**config[section], **values}
    path = work / "shoal.toml"
    path.write_text(tomli_w.dumps(config))
    started = time.perf_counter()
    command = [*(launcher or []), str(BIN / "shoal"), "train", str(path)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"shoal train failed: {done.stderr.strip()[-2000:]}")
    wall_s = time.perf_counter() - started
    root = work / "runs" / str(config["run"]["name"])
    results = json.loads((root / "results.json").read_text())
    records = [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["event"] == "train"]
    train_s = sum(r["step_s"] for r in steps)
    report = {
        "triples_per_s": sum(r["samples"] for r in steps) / train_s,
        "train_s": train_s,
        "run_wall_s": wall_s,
    }
    if evaluate:
        report.update(mrr=results["test"]["mrr"], **{"hits@10": results["test"]["hits@10"]})
    if "parameter_server" in results:
        report["parameter_server"] = results["parameter_server"]
    return report


def pykeen_run(work: Path, args: argparse.Namespace, evaluate: bool) -> dict[str, Any]:
    out = work / "pykeen.json"
    command = [sys.executable, __file__, "--child", str(out)]
    command += ["--evaluate"] if evaluate else []
    names = ("epochs", "dim", "negatives", "batch_size", "lr", "p", "seed", "crosscheck", "threads")
    names += ("train_limit",)
    for name in names:
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    subprocess.run(command, check=True)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--dim", type=int, default=200)
    parser.add_argument("--negatives", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=1e-3, help="PyKEEN's Adam")
    parser.add_argument("--shoal-lr", type=float, default=3e-3, help="shoal's lazy Adam")
    parser.add_argument("--chunk-size", type=int, default=64, help="shoal: positives per chunk")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--p", type=int, default=2, choices=(1, 2))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--evaluate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--crosscheck", type=int, default=1000)
    parser.add_argument(
        "--train-limit", type=int, default=0, help="PyKEEN: train on the first N triples only"
    )
    args = parser.parse_args()
    if args.child:
        pykeen_child(args, args.child)
        return
    print(
        f"TransE p={args.p} dim {args.dim}, {args.negatives} negatives, batch {args.batch_size}, "
        f"{args.epochs} epochs, lr {args.lr} (PyKEEN) / {args.shoal_lr} (shoal), "
        f"{args.threads} threads; {platform.processor() or platform.machine()}",
        flush=True,
    )
    runs: dict[str, list[dict[str, Any]]] = {"pykeen": [], "shoal": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for round_ in range(1, args.rounds + 1):
            last = round_ == args.rounds
            runs["pykeen"].append(pykeen_run(work, args, last))
            runs["shoal"].append(shoal_run(work, args, round_, last))
            for name in ("pykeen", "shoal"):
                r = runs[name][-1]
                quality = f"  test MRR {r['mrr']:.4f}  Hits@10 {r['hits@10']:.4f}" if last else ""
                print(
                    f"round {round_} {name:6s}: {r['triples_per_s']:9,.0f} triples/s  "
                    f"train {r['train_s']:7.1f} s{quality}",
                    flush=True,
                )
    median = {n: statistics.median(r["triples_per_s"] for r in runs[n]) for n in runs}
    print(json.dumps(runs, indent=1))
    check = runs["pykeen"][-1]["crosscheck"]
    print(
        f"evaluators on PyKEEN's model, first {check['triples']} test triples: PyKEEN MRR "
        f"{check['pykeen_mrr']:.4f} Hits@10 {check['pykeen_hits@10']:.4f}; shoal MRR "
        f"{check['shoal_mrr']:.4f} Hits@10 {check['shoal_hits@10']:.4f}"
    )
    print(
        f"median triples/s: pykeen {median['pykeen']:,.0f}, shoal {median['shoal']:,.0f}; "
        f"ratio shoal / pykeen = {median['shoal'] / median['pykeen']:.2f}"
    )


if __name__ == "__main__":
    main()
