"""Evaluation at scale: full filtered ranking against sampled filtered ranking (OGB's
protocol, 500 entities per query and side) on a synthetic graph of a million entities.

The graph is written once as a prepared folder (`shoal kge synthesize`; kept with
`--keep`). Each row runs in a fresh process: a DistMult model (random rows: time and
memory do not depend on their values) ranks the first test triples, filtered through
the on-disk index, as `KGETask.evaluate` does on one worker. Printed: time per
ranked triple (both sides), peak resident memory (ru_maxrss) and the memory the
ranking added above the model and the mapped graph.

    ../shared/tools/one-at-a-time .venv/bin/python benchmarks/kge_eval_scale.py \
        [--entities 1000000] [--triples 10000000] [--dim 100] [--keep /tmp/kge-eval]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROWS = (  # ranking, triples ranked, batch size
    ("full", 256, 256),
    ("full", 256, 32),
    ("sampled", 4096, 256),
)


def _rss_mib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def child(folder: Path, ranking: str, triples: int, batch: int, dim: int) -> None:
    import torch

    from shoal.tasks.kge.config import DistMultConfig
    from shoal.tasks.kge.evaluation import FilterIndex, rank_sampled, rank_triples
    from shoal.tasks.kge.models import build_kge_model
    from shoal.tasks.kge.prepared.graph import PreparedGraph

    torch.manual_seed(0)
    graph = PreparedGraph.open(folder)
    model = build_kge_model(DistMultConfig(), graph.num_entities, graph.num_relations, dim, 1.0)
    model.eval()
    test = torch.from_numpy(graph.splits["test"][:triples].copy())
    before = _rss_mib()
    started = time.perf_counter()
    cpu = torch.device("cpu")
    if ranking == "full":
        answers = FilterIndex.of_split(graph.filter, test)
        ranks = rank_triples(model, test, answers, 0, len(test), batch, 1 << 24, cpu)
    else:
        ranks = rank_sampled(
            model, test, graph.filter, 0, len(test), 500, graph.num_entities, 0, batch, 1 << 24, cpu
        )
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "ranking": ranking,
                "batch_size": batch,
                "triples": len(test),
                "s": round(seconds, 2),
                "ms_per_triple": round(1000 * seconds / len(test), 3),
                "peak_mib": round(peak),
                "added_mib": round(peak - before),
                "mrr": round(float((1.0 / ranks).mean()), 5),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=1_000_000)
    parser.add_argument("--triples", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--keep", help="folder for the prepared graph (kept, reused)")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        folder, ranking, triples, batch = args.child
        child(Path(folder), ranking, int(triples), int(batch), args.dim)
        return
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kge-eval-"))
    folder = root / "graph"
    if not (folder / "manifest.json").exists():
        from shoal.tasks.kge.synthetic import SyntheticGraph, write_prepared

        started = time.perf_counter()
        graph = SyntheticGraph(entities=args.entities, relations=500, triples=args.triples, seed=1)
        write_prepared(graph, folder)
        print(f"graph written in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    for ranking, triples, batch in ROWS:
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--dim",
                str(args.dim),
                "--child",
                str(folder),
                ranking,
                str(triples),
                str(batch),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        print(done.stdout.strip())
    if not args.keep:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
