"""A rank of a KGE job holds none of the graph in its heap: it maps the prepared files and
reads the triples of its own batches and of its share of the evaluation; the epoch's
order of the training triples takes 4 bytes a triple (NumPy's int64 permutation took 8)
and, on graphs too large for that, nothing beyond the batch.

Measured on a graph whose training triples take 24 MB as int64 (a list of Python ints
or label strings would take several times that): the peak of the Python heap, which
tracemalloc follows with every numpy array in it, against a third of one copy. (Memory
torch allocates itself is not traced; the process's anonymous memory cannot stand in
for it: a freed block's pages serve the next allocation without growing it.)
"""

from __future__ import annotations

import dataclasses
import gc
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shoal.tasks.kge.synthetic import SyntheticGraph, write_prepared
from shoal.tasks.kge.task import KGETask
from shoal.training import batching
from shoal.training.batching import EpochPlan, local_share
from tests.conftest import one_worker_context
from tests.tasks.kge.test_training import kge_job

BIG = SyntheticGraph(entities=20_000, relations=50, triples=1_000_000, seed=7)
WARM_UP = SyntheticGraph(entities=200, relations=5, triples=5_000, seed=7)
RANK, WORLD = 1, 4


def _a_rank_trains_and_evaluates(runs: Path, folder: Path, ranking: str) -> None:
    """What rank 1 of 4 does with the graph: open it, draw a few batches of its share of
    the epoch, rank its share of the validation triples."""
    evaluation = {"ranking": ranking, "batch_size": 64}
    job = kge_job(runs, {"prepared": str(folder)}, task={"dim": 8, "evaluation": evaluation})
    ctx = dataclasses.replace(one_worker_context(job), rank=RANK, world_size=WORLD)
    task = KGETask(ctx)
    model = task.build_model()
    task.set_epoch(0)
    plan = EpochPlan(task.train_size, 4 * 32, epoch=0, seed=0)  # as the trainer draws them
    for step in range(4):
        share = local_share(plan.global_batch(step), RANK, WORLD, task.batch_unit)
        task.loss(model, task.train_batch(share))
    assert task.evaluate(model, "valid")["mrr"] > 0


def _peak_traced(step: Callable[[], Any]) -> int:
    """The Python heap's peak while `step` runs, in bytes above its start."""
    gc.collect()
    tracemalloc.start()
    try:
        step()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    ("ranking", "order"), [("full", "numpy"), ("sampled", "numpy"), ("sampled", "keyed")]
)
def test_a_rank_holds_no_copy_of_the_graph(
    runs: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    ranking: str,
    order: str,
) -> None:
    """`keyed`: the order of an epoch above `MATERIALISED_SAMPLES` (the limit lowered to 0
    here: a graph above the real one has 16.7M training triples)."""
    if order == "keyed":
        monkeypatch.setattr(batching, "MATERIALISED_SAMPLES", 0)
    root = tmp_path_factory.getbasetemp() / "rank-memory"
    if not (root / "big").exists():
        write_prepared(WARM_UP, root / "warm")
        write_prepared(BIG, root / "big")
    # the first use of the code paths imports modules and fills caches: not the graph's
    _a_rank_trains_and_evaluates(runs, root / "warm", ranking)
    copy_bytes = int(np.load(root / "big" / "train.npy", mmap_mode="r").nbytes)
    budget = copy_bytes // 3

    assert _peak_traced(lambda: np.load(root / "big" / "train.npy")) > budget  # the yardstick

    peak = _peak_traced(lambda: _a_rank_trains_and_evaluates(runs, root / "big", ranking))
    assert peak < budget, f"peak traced {peak / 2**20:.1f} MiB (a copy: {copy_bytes / 2**20:.1f})"
