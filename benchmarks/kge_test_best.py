"""Filtered test metrics of a kge run's best checkpoint on the *whole* test split.

For runs trained with `task.evaluation.max_triples` (a sample, to keep validation
cheap): ranks every test triple with the model in `RUN_DIR/best/`, by the same
evaluator the task uses.

    .venv/bin/python benchmarks/kge_test_best.py RUN_DIR [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from shoal.checkpoint.manager import list_checkpoints, load_checkpoint
from shoal.config import load_config
from shoal.tasks.kge.config import KGETaskConfig
from shoal.tasks.kge.evaluation import (
    FilterIndex,
    metrics_from_sums,
    rank_metric_sums,
    rank_triples,
)
from shoal.tasks.kge.models import build_kge_model
from shoal.tasks.kge.task import ROTATE_DEFAULT_GAMMA
from shoal.tasks.kge.triples import load_kg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(args.run_dir / "config.toml")
    task = config.task
    assert isinstance(task, KGETaskConfig)
    best = list_checkpoints(args.run_dir / "best")[-1]
    state, meta = load_checkpoint(best)
    data = load_kg(task.data)
    gamma = getattr(task.loss, "margin", 0.0) or ROTATE_DEFAULT_GAMMA
    model = build_kge_model(task.model, len(data.entities), len(data.relations), task.dim, gamma)
    model.load_state_dict(state["model"])
    test = data.splits["test"].triples
    answers = FilterIndex.of_split(data.filter, test)
    started = time.perf_counter()
    ranks = rank_triples(
        model,
        test,
        answers,
        0,
        len(test),
        task.evaluation.batch_size,
        task.evaluation.block_elements,
        torch.device("cpu"),
    )
    hits = task.evaluation.hits_at
    metrics = metrics_from_sums(rank_metric_sums(ranks, hits), hits)
    report = {
        "run": str(args.run_dir),
        "checkpoint_step": meta["step"],
        "epoch": meta["epoch"],
        "test_triples": len(test),
        "eval_s": round(time.perf_counter() - started, 1),
        **{k: round(v, 4) for k, v in metrics.items()},
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
