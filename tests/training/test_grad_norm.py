"""The gradient norm metrics.jsonl logs is the global norm before clipping, computed by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import shoal
from shoal.monitor.metrics import read_metrics
from shoal.runtime.rng import seed_everything
from shoal.tasks.classification.task import ClassificationTask
from shoal.training.batching import EpochPlan
from tests.conftest import data_parallel, one_worker_context, small_job


def _job(runs: Path, name: str, workers: int, clip: float | None) -> dict:
    strategy = data_parallel(workers) if workers > 1 else {"type": "local"}
    return small_job(
        runs,
        strategy=strategy,
        train={"epochs": None, "max_steps": 1, "grad_clip_norm": clip},
        monitor={"progress": "off", "log_every_steps": 1},
        run={"dir": str(runs), "name": name},
    )


def _by_hand(runs: Path) -> float:
    """The first step's full-batch gradient norm of the tiny MLP, computed with autograd."""
    job = _job(runs, "by-hand", 1, None)
    ctx = one_worker_context(job)
    task = ClassificationTask(ctx)
    train = ctx.config.train
    seed_everything(train.seed)  # as the step loop does before it builds the model
    model = task.build_model()
    batch = EpochPlan(task.train_size, train.batch_size, 0, train.seed).global_batch(0)
    out = task.loss(model, task.train_batch(batch))
    (out.loss_sum / len(batch)).backward()
    squares = sum(float((p.grad.double() ** 2).sum()) for p in model.parameters())
    return squares**0.5


@pytest.mark.parametrize(("workers", "clip"), [(1, None), (1, 0.01), (2, None)])
def test_the_logged_norm_is_the_global_norm_before_clipping(
    runs: Path, workers: int, clip: float | None
) -> None:
    expected = _by_hand(runs)
    results = shoal.train(_job(runs, f"w{workers}-clip{clip}", workers, clip))
    train = [
        r for r in read_metrics(Path(results["run_dir"]) / "metrics.jsonl") if r["event"] == "train"
    ]
    assert len(train) == 1
    assert expected > 0.01  # the clipped run really clipped
    assert train[0]["grad_norm"] == pytest.approx(expected, rel=1e-5)


def test_without_clipping_the_norm_is_taken_only_at_logged_steps(runs: Path) -> None:
    """One norm per logged step, not one per step: the sync is asked for it only then (a
    local job's norm comes with the step's non-finite check, in the same look at it)."""
    from shoal.training.contracts import LocalGradientSync

    calls: list[int] = []
    original = LocalGradientSync.norm_share

    def counted(self: LocalGradientSync) -> torch.Tensor:
        calls.append(1)
        return original(self)

    LocalGradientSync.norm_share = counted  # type: ignore[method-assign]
    try:
        job = small_job(runs, monitor={"progress": "off", "log_every_steps": 5})
        results = shoal.train(job)
    finally:
        LocalGradientSync.norm_share = original  # type: ignore[method-assign]
    assert results["steps"] == 26
    assert len(calls) == 26 // 5
    train = [
        r for r in read_metrics(Path(results["run_dir"]) / "metrics.jsonl") if r["event"] == "train"
    ]
    assert all(r["grad_norm"] > 0 for r in train if r["step"] % 5 == 0)
    assert torch.isfinite(torch.tensor([r["grad_norm"] for r in train if "grad_norm" in r])).all()
