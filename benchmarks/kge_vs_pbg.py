"""PyTorch-BigGraph vs shoal's parameter server on FB15k-237, TransE-style, 2 workers each.

One model, trained by both: entity rows scored by the L2 distance of a translation,
score(h, r, t) = -||h + r - t||_2 (PBG: `operator = "translation"`, `comparator =
"l2"`, which scores -||lhs - (rhs + a_r)||, i.e. r = -a_r), margin ranking loss,
uniform negatives shared by chunks of positives, row-wise Adagrad (one accumulator
per row, the mean of g^2: PBG's `RowAdagrad`, shoal's `adagrad` server optimizer),
the same dim, batch per update, learning rate and epochs, 2 worker processes with
1 torch thread each. PBG trains Hogwild-style on shared memory; shoal runs
`parameter_server` with 2 workers and 2 co-located servers (a server thread in each
worker), `async` (pushes applied on arrival, as Hogwild applies them).

Settings side by side (defaults; every run prints the table with its values):

- model: PBG translation + l2 comparator, no global embedding, no bias; shoal
  transe, p = 2, normalize_entities = false.
- relations: `--pbg-relations static` gives PBG one relation type per label with
  one operator each (exactly shoal's model); `dynamic` is PBG's FB15k recipe, with a
  second operator per relation for the lhs side (head prediction). Both are run.
- negatives: PBG 64 uniform per side (lhs and rhs: 128 per positive), no batch
  negatives, a chunk of 64 positives shares them; shoal 128 uniform on one side
  (side chosen uniformly) per positive, shared by chunks of 64 positives.
- loss: PBG ranking (margin), summed over negatives and batch; shoal margin_ranking
  (margin), mean over negatives, divided by the batch size.
- optimizer: PBG RowAdagrad on entities, Adagrad on relation operators; shoal
  row-wise Adagrad on both tables (eps 1e-10 as PBG's); the same lr.
- batch: PBG 1024 edges per Hogwild step per worker; shoal global 2048 = 1024 per
  worker per push.
- init: PBG N(0, s^2) entities, zero translations; shoal entities U(+-6/sqrt(d))
  (standard deviation s), relations random at unit norm.
- processes: PBG 2 Hogwild workers (and the coordinating parent); shoal 2 workers,
  each with its server thread.

What differs and how it is compensated: PBG corrupts both sides of every positive
with `negatives_per_side` entities; shoal corrupts one side, chosen uniformly, with
twice as many, so both score 128 negatives per positive and, in expectation, put
the same weight on head and tail corruption. PBG sums the loss where shoal averages
it; Adagrad's update g / sqrt(sum g^2) does not change when every gradient is scaled
by one constant, so the two follow the same trajectory up to eps. Initialisations
differ in kind (PBG starts relations at zero); PBG's entity scale is set to the
standard deviation of shoal's. PBG's Hogwild delay (2 s before the second worker
starts, first epoch) is set to 0, so it does not count against PBG.

Measured per run: training triples/s (PBG: the Hogwild phase of each epoch, as its
log reports it; shoal: the workers' step time, as metrics.jsonl reports it) and the
wall time of the whole training call. The last round also evaluates both models
with **one evaluator**, shoal's filtered ranking (realistic ranks, both directions,
filtered by train + valid + test, all 20,438 test triples): PBG's tables are read
from its checkpoint files (h5) and ranked by a shoal TransE holding them (dynamic
relations: head queries use the lhs operator), shoal's from its exported .npy. As a
check of that export, PBG's own filtered evaluator ranks the first `--crosscheck`
test triples of the dynamic model next to shoal's evaluator on the same triples.

Setup (done by the script when missing, or `make bench-pbg`): a separate venv
`.venv-pbg` (gitignored) with `torch==2.13.0 torchbiggraph==1.0.0 h5py` and a
setuptools that still ships `pkg_resources` (PBG imports it; torch 2.13 needs
setuptools >= 77, and 81 removed it). PBG's side runs there (`pbg_child.py`), with
a shim for its config schema on Python 3.11.

    .venv/bin/python benchmarks/kge_vs_pbg.py [--rounds 2] [--epochs 1] \
        [--pbg-relations static dynamic] [--out result.json]

Needs ../shared/datasets/fb15k-237/.

`--graph synthetic --entities 5000000 --edges 50000000 --pbg-partitions 8` runs the same
two contenders on a synthetic graph of millions of entities, PBG partitioned, both
ranked by one sampled filtered evaluator (kge_pbg_synthetic.py says how).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kge_vs_pykeen import DATA, SPLITS, shoal_run

HERE = Path(__file__).resolve().parent
PBG_VENV = HERE.parent / ".venv-pbg"
PBG_REQUIREMENTS = ["torch==2.13.0", "torchbiggraph==1.0.0", "setuptools>=77,<81", "h5py"]


def ensure_pbg_venv(path: Path = PBG_VENV) -> Path:
    """Create PBG's venv once (a stamp file records what was installed); its python."""
    python = path / "bin" / "python"
    stamp = path / ".pbg-installed"
    if stamp.exists() and stamp.read_text().split() == PBG_REQUIREMENTS:
        return python
    if not python.exists():
        venv.create(path, with_pip=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *PBG_REQUIREMENTS], check=True)
    stamp.write_text(" ".join(PBG_REQUIREMENTS) + "\n")
    return python


# ---------------------------------------------------------------- the two contenders


def pbg_run(
    work: Path,
    args: argparse.Namespace,
    relations: str,
    name: str,
    crosscheck: bool,
    graph: dict[str, Any] | None = None,
    launcher: list[str] | None = None,
) -> dict[str, Any]:
    """One PBG training run in its venv (pbg_child.py); the report it writes. The
    crosscheck edges are imported with the data, in every round (the import is cached),
    and ranked by PBG's evaluator when `crosscheck`. `graph` trains a prepared graph
    instead (pbg_child's `prepared`, `partitions`, `train_edges`, `export`), imported
    first and exported after in processes of their own; `launcher` prefixes the training
    command (a memory sampler)."""
    settings = {
        "data": {s: str(DATA / f"{s}.txt.gz") for s in SPLITS},
        "work": str(work),
        "name": name,
        "dynamic_relations": relations == "dynamic",
        "operator": "translation",
        "comparator": "l2",
        "loss_fn": "ranking",
        "margin": args.margin,
        "lr": args.lr,
        "init_scale": args.pbg_init_scale,
        "dim": args.dim,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "negatives_per_side": args.negatives_per_side,
        "workers": args.workers,
        "crosscheck": args.crosscheck,
        "run_crosscheck": crosscheck,
        **(graph or {}),
    }
    path, out = work / f"{name}.settings.json", work / f"{name}.report.json"
    path.write_text(json.dumps(settings))
    log = work / f"{name}.log"
    command = [str(args.pbg_python), "-W", "ignore", str(HERE / "pbg_child.py"), str(path)]
    if graph is not None:
        _logged([*command, str(out), "--import-only"], log, f"PBG import {name}")
    started = time.perf_counter()
    _logged([*(launcher or []), *command, str(out)], log, f"PBG run {name}")
    report: dict[str, Any] = json.loads(out.read_text())
    report["process_wall_s"] = time.perf_counter() - started
    if graph is not None and graph.get("export"):
        _logged([*command, str(out), "--export-only"], log, f"PBG export {name}")
    return report


def _logged(command: list[str], log: Path, what: str) -> None:
    """Run `command` with its output appended to `log`; its tail in the error if it fails."""
    with log.open("a") as sink:
        done = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT)
    if done.returncode:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{what} failed (exit {done.returncode}):\n{tail}")


def runner_args(args: argparse.Namespace, threads: int = 1) -> argparse.Namespace:
    """kge_vs_pykeen's `shoal_run` settings at the matching values."""
    return argparse.Namespace(
        dim=args.dim,
        p=2,
        negatives=2 * args.negatives_per_side,
        chunk_size=args.negatives_per_side,
        epochs=args.epochs,
        batch_size=args.workers * args.batch_size,  # global: batch_size per worker per push
        seed=args.seed,
        shoal_lr=args.lr,  # unused where an optimizer section is given
        threads=threads,
    )


def ps_strategy(args: argparse.Namespace) -> dict[str, Any]:
    """The parameter server at PBG's settings: row-wise Adagrad, async, co-located."""
    return {
        "type": "parameter_server",
        "num_workers": args.workers,
        "num_servers": args.servers,
        "placement": args.placement,
        "mode": args.mode,
        "max_staleness": 2,
        "optimizer": {"kind": "adagrad", "lr": args.lr},
        "barrier_timeout_s": 240.0,
    }


def shoal_negatives(args: argparse.Namespace) -> dict[str, Any]:
    """`one-side`: 2 x negatives_per_side on one side chosen uniformly per positive (the
    default, as recorded so far); `both-sides`: negatives_per_side on each side, PBG's
    own recipe (both loss terms summed per positive)."""
    per_side = args.negatives_per_side
    if args.shoal_negatives == "both-sides":
        return {"num_negatives_s": per_side, "num_negatives_o": per_side, "chunk_size": per_side}
    return {"num_negatives": 2 * per_side, "chunk_size": per_side, "side": "uniform"}


def pbg_like_task(args: argparse.Namespace) -> dict[str, Any]:
    """shoal's task sections that match PBG's model (see the module docstring)."""
    return {
        "model": {
            "type": "transe",
            "p": 2,
            "normalize_entities": False,
            "init_scale": args.shoal_init_scale,
        },
        "negatives": shoal_negatives(args),
        "loss": {"kind": "margin_ranking", "margin": args.margin},
        "evaluation": {"batch_size": 256},
    }


def shoal_ps_run(
    work: Path,
    args: argparse.Namespace,
    name: str,
    evaluate: bool,
    max_steps: int | None = None,
    launcher: list[str] | None = None,
    sections: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One shoal parameter-server run at the matching settings (kge_vs_pykeen's runner);
    `sections` merge into the task, strategy, train, ... sections (a prepared graph's data,
    `shard_dir`, ...), or with `strategy = {}` train `local`."""
    sections = sections or {}
    strategy = {**ps_strategy(args), **sections.get("strategy", {})}
    overrides = {k: v for k, v in sections.items() if k != "strategy"}
    overrides["run"] = {**sections.get("run", {}), "name": name}
    overrides["task"] = {**pbg_like_task(args), **sections.get("task", {})}
    if max_steps is not None:
        overrides["train"] = {**overrides.get("train", {}), "max_steps": max_steps}
    threads = overrides.get("run", {}).get("threads_per_worker", 1)
    local = "strategy" in sections and not sections["strategy"]
    report = shoal_run(
        work,
        runner_args(args, threads),
        0,
        evaluate,
        None if local else strategy,
        overrides,
        launcher,
    )
    report["embeddings"] = str(work / "runs" / name / "embeddings")
    return report


# ---------------------------------------------------------------- one evaluator


class TablesTransE:
    """Builds a shoal TransE that holds given tables, for shoal's filtered evaluator.

    Tail queries are h + forward[r] and head queries t - backward[r]; shoal's own model
    has forward = backward = its relation rows. PBG's static model scores
    -||h - (t + a_r)||, so forward = backward = -a_r; its dynamic model scores head
    candidates against t + a_r (rhs operator) and tail candidates against h + b_r (lhs
    operator): forward = b_r, backward = -a_r.
    """

    @staticmethod
    def build(entity: np.ndarray, forward: np.ndarray, backward: np.ndarray) -> Any:
        from torch import nn

        from shoal.tasks.kge.config import TransEConfig
        from shoal.tasks.kge.models import TransE

        dim = entity.shape[1]

        class Twin(TransE):
            def tail_query(self, head: torch.Tensor, relation: torch.Tensor) -> torch.Tensor:
                return head + relation[..., :dim]

            def head_query(self, tail: torch.Tensor, relation: torch.Tensor) -> torch.Tensor:
                return tail - relation[..., dim:]

        config = TransEConfig(p=2, normalize_entities=False)
        twin = Twin(config, len(entity), len(forward), dim)
        twin.entity = nn.Embedding.from_pretrained(torch.from_numpy(entity).float())
        rows = np.concatenate([forward, backward], axis=1)
        twin.relation = nn.Embedding.from_pretrained(torch.from_numpy(rows).float())
        return twin


def load_data() -> Any:
    from shoal.tasks.kge.config import FilesDataConfig
    from shoal.tasks.kge.triples import load_kg

    return load_kg(FilesDataConfig(**{s: str(DATA / f"{s}.txt.gz") for s in SPLITS}))


def filtered_metrics(model: Any, data: Any, limit: int | None = None) -> dict[str, float]:
    """shoal's filtered ranking of the first `limit` test triples (all when None)."""
    from shoal.tasks.kge.evaluation import (
        FilterIndex,
        metrics_from_sums,
        rank_metric_sums,
        rank_triples,
    )

    test = data.splits["test"].triples[:limit]
    answers = FilterIndex.of_split(data.filter, test)
    started = time.perf_counter()
    ranks = rank_triples(model, test, answers, 0, len(test), 256, 1 << 24, torch.device("cpu"))
    metrics = metrics_from_sums(rank_metric_sums(ranks, [1, 3, 10]), [1, 3, 10])
    return {**metrics, "ranked": len(ranks), "eval_s": time.perf_counter() - started}


def pbg_model(tables: Path, data: Any) -> Any:
    """PBG's exported tables in shoal's id order (labels matched), as a TablesTransE."""
    saved = np.load(tables)
    entity_at = {str(label): i for i, label in enumerate(saved["entity_names"])}
    relation_at = {str(label): i for i, label in enumerate(saved["relation_names"])}
    entities = [entity_at[label] for label in data.entities.labels]
    relations = [relation_at[label] for label in data.relations.labels]
    return pbg_twin(saved, entities, relations)


def pbg_twin(saved: Any, entities: Any = slice(None), relations: Any = slice(None)) -> Any:
    """A TablesTransE of PBG's exported rows (`entities` and `relations` pick shoal's order;
    all, in their order, by default)."""
    backward = -saved["rhs_translation"][relations]
    forward = saved["lhs_translation"][relations] if "lhs_translation" in saved else backward
    return TablesTransE.build(saved["entity"][entities], forward, backward)


def shoal_model(embeddings: Path) -> Any:
    relation = np.load(embeddings / "relation_embeddings.npy")
    return TablesTransE.build(np.load(embeddings / "entity_embeddings.npy"), relation, relation)


def rankable_prefix(data: Any, lines: int) -> int:
    """How many of the first `lines` test lines shoal ranks (both skip unseen labels alike)."""
    entities, relations = set(data.entities.labels), set(data.relations.labels)
    count = 0
    with gzip.open(DATA / "test.txt.gz", "rt") as src:
        for _, line in zip(range(lines), src, strict=False):
            h, r, t = line.split()
            count += h in entities and t in entities and r in relations
    return count


# ---------------------------------------------------------------- the benchmark


def settings_table(args: argparse.Namespace) -> str:
    shoal_sides = (
        f"{args.negatives_per_side} per side x 2 sides"
        if args.shoal_negatives == "both-sides"
        else f"{2 * args.negatives_per_side}, one side"
    )
    per_side, batch = args.negatives_per_side, args.batch_size
    rows = [
        ("dim", args.dim, args.dim),
        ("negatives per positive", f"{per_side} per side x 2 sides", shoal_sides),
        ("positives sharing negatives", per_side, per_side),
        ("batch per update", f"{batch} per worker", f"{args.workers * batch} global"),
        ("loss", f"ranking, margin {args.margin}", f"margin_ranking, margin {args.margin}"),
        ("optimizer", f"RowAdagrad / Adagrad lr {args.lr}", f"row-wise adagrad lr {args.lr}"),
        ("init (entity std)", args.pbg_init_scale, f"{shoal_entity_std(args):.4g}"),
        ("epochs", args.epochs, args.epochs),
        (
            "processes",
            f"{args.workers} Hogwild workers",
            f"{args.workers} workers, {args.servers} {args.placement} servers, {args.mode}",
        ),
    ]
    lines = ["| setting | PBG | shoal |", "|---|---|---|"]
    lines += [f"| {name} | {pbg} | {shoal} |" for name, pbg, shoal in rows]
    return "\n".join(lines)


def shoal_entity_std(args: argparse.Namespace) -> float:
    """Standard deviation of shoal's TransE entity initialisation U(+-6/sqrt(d) * scale)."""
    return 6.0 / args.dim**0.5 * args.shoal_init_scale / 3**0.5


def build_parser(description: str) -> argparse.ArgumentParser:
    """The shared settings (ps_profile.py adds its own)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--dim", type=int, default=200)
    parser.add_argument("--negatives-per-side", type=int, default=64)
    parser.add_argument(
        "--shoal-negatives",
        choices=("one-side", "both-sides"),
        default="one-side",
        help="shoal's corruptions: 2x per side on one side, or per side on both (PBG's)",
    )
    parser.add_argument("--batch-size", type=int, default=1024, help="per worker and update")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--placement", choices=("colocated", "dedicated"), default="colocated")
    parser.add_argument("--mode", choices=("async", "bounded", "sync"), default="async")
    parser.add_argument("--lr", type=float, default=0.1, help="Adagrad, both")
    parser.add_argument("--margin", type=float, default=1.0)
    parser.add_argument("--shoal-init-scale", type=float, default=1.0)
    parser.add_argument(
        "--pbg-init-scale", type=float, default=None, help="default: shoal's entity std"
    )
    parser.add_argument(
        "--pbg-relations", nargs="+", choices=("static", "dynamic"), default=["static", "dynamic"]
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--crosscheck", type=int, default=2000, help="test lines, 0: none")
    parser.add_argument("--eval-limit", type=int, default=None, help="test triples ranked")
    parser.add_argument("--setup-only", action="store_true", help="create .venv-pbg and stop")
    parser.add_argument("--out", type=Path, default=None, help="write every figure as JSON")
    return parser


def finish_args(args: argparse.Namespace) -> argparse.Namespace:
    if args.pbg_init_scale is None:
        args.pbg_init_scale = round(shoal_entity_std(args), 4)
    return args


def main() -> None:
    parser = build_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--graph",
        choices=("fb15k-237", "synthetic"),
        default="fb15k-237",
        help="synthetic: kge_pbg_synthetic.py's comparison (its flags below)",
    )
    add_synthetic_flags = _synthetic().add_flags
    add_synthetic_flags(parser)
    args = finish_args(parser.parse_args())
    args.pbg_python = ensure_pbg_venv()
    if args.setup_only:
        return
    if args.graph == "synthetic":
        _synthetic().run(args)
        return
    print(
        f"FB15k-237, TransE-style (L2), {args.epochs} epoch(s), {args.workers} workers each, "
        f"1 thread per process; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}\n"
        f"{settings_table(args)}",
        flush=True,
    )
    names = [f"pbg-{kind}" for kind in args.pbg_relations] + ["shoal-ps"]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    data = load_data()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for round_ in range(1, args.rounds + 1):
            last = round_ == args.rounds
            for name in names:
                tag = f"{name}-{round_}"
                if name == "shoal-ps":
                    r = shoal_ps_run(work, args, tag, last)
                    model = shoal_model(Path(r["embeddings"])) if last else None
                else:
                    check = last and args.crosscheck > 0
                    r = pbg_run(work, args, name.removeprefix("pbg-"), tag, check)
                    model = pbg_model(Path(r["tables"]), data) if last else None
                if model is not None:
                    r["test"] = filtered_metrics(model, data, args.eval_limit)
                    if "crosscheck" in r:
                        limit = rankable_prefix(data, args.crosscheck)
                        r["crosscheck"]["shoal_evaluator"] = filtered_metrics(model, data, limit)
                r["load_after"] = os.getloadavg()[0]
                runs[name].append(r)
                quality = ""
                if "test" in r:
                    t = r["test"]
                    quality = (
                        f"  test MRR {t['mrr']:.4f} H@1 {t['hits@1']:.4f} "
                        f"H@3 {t['hits@3']:.4f} H@10 {t['hits@10']:.4f}"
                    )
                print(
                    f"round {round_} {name:12s} {r['triples_per_s']:9,.0f} triples/s  "
                    f"train {r['train_s']:6.1f} s  load {r['load_after']:.2f}{quality}",
                    flush=True,
                )
    report(args, runs)


def _synthetic() -> Any:
    """The synthetic-graph mode's module (it imports this one)."""
    import kge_pbg_synthetic

    return kge_pbg_synthetic


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> None:
    median = {n: statistics.median(r["triples_per_s"] for r in rs) for n, rs in runs.items()}
    shoal = median["shoal-ps"]
    for name, rs in runs.items():
        last = rs[-1]
        line = f"{name:12s} median {median[name]:9,.0f} triples/s"
        if name != "shoal-ps":
            line += f"  shoal / {name} = {shoal / median[name]:.2f}"
            mrr_gap = runs["shoal-ps"][-1]["test"]["mrr"] - last["test"]["mrr"]
            line += f"  MRR shoal - {name} = {mrr_gap:+.4f}"
        print(line)
        check = last.get("crosscheck")
        if check:
            ours = check["shoal_evaluator"]
            print(
                f"  evaluators on {name}'s model, first {args.crosscheck} test lines "
                f"({int(check['count'])} ranked): PBG MRR {check['mrr']:.4f} Hits@1 "
                f"{check['r1']:.4f} Hits@10 {check['r10']:.4f}; shoal MRR {ours['mrr']:.4f} "
                f"Hits@1 {ours['hits@1']:.4f} Hits@10 {ours['hits@10']:.4f}"
            )
    if "test" in runs["shoal-ps"][-1] and "mrr" in runs["shoal-ps"][-1]:
        own = runs["shoal-ps"][-1]
        print(
            f"shoal's in-run test MRR {own['mrr']:.4f} vs its exported tables "
            f"{own['test']['mrr']:.4f} (must agree)"
        )
    if args.out:
        args.out.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}, indent=1)
        )


if __name__ == "__main__":
    main()
