"""Peak memory of filtered evaluation on FB15k-237 at dim 1000, for each of the four models.

Each model is evaluated in a fresh process (randomly initialised: memory does not
depend on the values) on `--max-triples` test triples, which does not change the
peak either: that is set by the model, the filter index, and one batch of
`--batch-size` triples scored against all 14,505 entities. Prints the peak
resident memory (ru_maxrss) of each process and its time.

    .venv/bin/python benchmarks/kge_eval_memory.py [--dim 1000] [--max-triples 1000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "datasets" / "fb15k-237"
MODELS = ("transe", "distmult", "complex", "rotate")


def child(model: str, args: argparse.Namespace) -> None:
    import torch

    from shoal.config import load_config
    from shoal.launch.inprocess import run_in_process  # noqa: F401 - imports what a run imports
    from shoal.tasks.kge.evaluation import FilterIndex, rank_triples
    from shoal.tasks.kge.models import build_kge_model
    from shoal.tasks.kge.triples import load_kg

    config = load_config(
        {
            "task": {
                "type": "kge",
                "dim": args.dim,
                "model": {"type": model},
                "data": {s: str(DATA / f"{s}.txt.gz") for s in ("train", "valid", "test")},
            },
            "train": {"epochs": 1, "batch_size": 1024},
        }
    )
    task = config.task
    data = load_kg(task.data)  # type: ignore[union-attr]
    kge = build_kge_model(
        task.model,  # type: ignore[union-attr]
        len(data.entities),
        len(data.relations),
        args.dim,
        9.0,
    )
    test = data.splits["test"].triples[: args.max_triples]
    answers = FilterIndex.of_split(data.filter, test)
    started = time.perf_counter()
    ranks = rank_triples(
        kge,
        test,
        answers,
        0,
        len(test),
        args.batch_size,
        task.evaluation.block_elements,  # type: ignore[union-attr]
        torch.device("cpu"),
    )
    seconds = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"model": model, "peak_mib": peak_mib, "s": seconds, "ranks": len(ranks)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=1000)
    parser.add_argument("--max-triples", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--child", choices=MODELS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args)
        return
    print(f"FB15k-237 test, dim {args.dim}, {args.max_triples} triples, batch {args.batch_size}")
    for model in MODELS:
        command = [sys.executable, __file__, "--child", model]
        command += ["--dim", str(args.dim), "--max-triples", str(args.max_triples)]
        command += ["--batch-size", str(args.batch_size)]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
        print(
            f"{model:9s} peak {result['peak_mib']:7.0f} MiB   "
            f"{result['ranks']} ranks in {result['s']:.1f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
