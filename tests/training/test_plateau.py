"""lr_decay = "plateau": the schedule's factor against torch's ReduceLROnPlateau and by hand."""

from __future__ import annotations

import pytest
import torch

from shoal.config.train import PlateauConfig
from shoal.training.optim import WarmupDecay


def plateau(min_ratio: float = 0.0, warmup: int = 0, **fields: float) -> WarmupDecay:
    return WarmupDecay(warmup, 1000, "plateau", min_ratio, PlateauConfig(**fields))  # type: ignore[arg-type]


def test_plateau_by_hand() -> None:
    """patience 1: the second evaluation in a row without a 1% gain halves the rate; the
    floor is min_lr_ratio."""
    factor = plateau(factor=0.5, patience=1, threshold=0.01)
    scales = []
    for value in [0.10, 0.10, 0.1005, 0.20, 0.20, 0.20, 0.20, 0.20]:
        factor.observe(value, "max")
        scales.append(factor.scale)
    assert scales == [1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25, 0.125]
    floored = plateau(min_ratio=0.3, factor=0.5, patience=0)
    for value in [0.2, 0.1, 0.1, 0.1]:
        floored.observe(value, "max")
    assert floored.scale == 0.3
    assert floored(5) == 0.3  # the factor the schedule gives every later step


@pytest.mark.parametrize(
    ("patience", "cooldown", "direction"),
    [(0, 0, "max"), (1, 0, "max"), (2, 1, "max"), (1, 2, "min")],
)
def test_plateau_follows_torch_reduce_lr_on_plateau(
    patience: int, cooldown: int, direction: str
) -> None:
    values = [0.10, 0.20, 0.20, 0.19, 0.2001, 0.25, 0.25, 0.24, 0.26, 0.26, 0.26, 0.26, 0.1]
    values += [0.1, 0.1, 0.3, 0.3, 0.3, 0.3, 0.3]
    factor = plateau(factor=0.7, patience=patience, threshold=0.01, cooldown=cooldown)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    reference = torch.optim.lr_scheduler.ReduceLROnPlateau(
        optimizer, mode=direction, factor=0.7, patience=patience, threshold=0.01, cooldown=cooldown
    )
    for value in values:
        factor.observe(value, direction)
        reference.step(value)
        assert factor.scale == pytest.approx(optimizer.param_groups[0]["lr"])


def test_warmup_then_plateau_and_state_carried_over() -> None:
    factor = plateau(warmup=4, factor=0.5, patience=0)
    assert factor(1) == pytest.approx(0.5)
    factor.observe(0.3, "max")
    factor.observe(0.2, "max")
    assert factor(1) == pytest.approx(0.25) and factor(10) == pytest.approx(0.5)
    resumed = plateau(warmup=4, factor=0.5, patience=0)
    resumed.take_state(factor)
    assert resumed(10) == factor(10) and resumed.best == 0.3
    assert not WarmupDecay(0, 10, "cosine", 0.0).observe(0.1, "max")  # only plateau listens
