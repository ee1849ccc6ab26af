"""Mixed precision: bf16 autocast, fp16 with a dynamic loss scale; fp32 untouched."""

from __future__ import annotations

from pathlib import Path

import torch

import shoal
from shoal.training.precision import Precision
from tests.conftest import data_parallel, final_state, small_job


def test_bf16_autocast_trains_with_an_aggregation_method(runs: Path) -> None:
    fp32 = shoal.train(small_job(runs))
    strategy = {**data_parallel(2), "aggregation": {"method": "ring"}}
    bf16 = shoal.train(small_job(runs, strategy=strategy, train={"mixed_precision": "bf16"}))
    a, b = final_state(fp32)["model"], final_state(bf16)["model"]
    assert all(t.dtype == torch.float32 for t in b.values()), "parameters stay float32"
    assert any(not torch.allclose(a[k], b[k], atol=1e-4) for k in a), "autocast was active"
    assert abs(bf16["valid"]["accuracy"] - fp32["valid"]["accuracy"]) < 0.05


def test_fp16_loss_scale_is_checkpointed_and_unscaled(runs: Path) -> None:
    train = {"mixed_precision": "fp16", "on_nonfinite": "skip_step"}
    results = shoal.train(small_job(runs, train=train))
    state = final_state(results)
    assert state["precision"]["scale"] == 2.0**16  # no overflow on this small problem
    assert results["valid"]["accuracy"] > 0.5  # the scale was divided out of the gradients
    assert "precision" not in final_state(shoal.train(small_job(runs)))


def test_dynamic_loss_scale() -> None:
    precision = Precision("fp16", torch.device("cpu"))
    precision.growth_interval = 3
    assert precision.loss_scale == 65536.0
    precision.update(overflowed=True)
    assert precision.loss_scale == 32768.0
    for _ in range(3):
        precision.update(overflowed=False)
    assert precision.loss_scale == 65536.0 and precision.good_steps == 0
    off = Precision("off", torch.device("cpu"))
    off.update(overflowed=True)
    assert off.loss_scale == 1.0
