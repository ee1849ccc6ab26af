"""The balanced partition: exact on given costs, and good on costs measured from uneven blocks."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shoal.strategies.pipeline.partition import balanced_partition, stage_costs
from shoal.strategies.pipeline.profile import profile_blocks


def brute_force(costs: list[float], stages: int, speeds: list[float] | None = None) -> float:
    """The smallest max-stage cost over every contiguous split (every choice of cut points),
    stage s's cost times `speeds[s]` when given."""
    n, best = len(costs), float("inf")
    weights = speeds or [1.0] * stages
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = [0, *cuts, n]
        parts = [(bounds[i], bounds[i + 1] - 1) for i in range(stages)]
        stage = stage_costs(costs, parts)
        best = min(best, max(w * c for w, c in zip(weights, stage, strict=True)))
    return best


def test_the_split_is_the_best_contiguous_one() -> None:
    rng = random.Random(4)
    for _ in range(200):
        n = rng.randint(2, 10)
        stages = rng.randint(1, n)
        costs = [rng.choice([rng.random(), rng.random() * 20]) for _ in range(n)]
        partition = balanced_partition(costs, stages)
        assert len(partition) == stages and partition[0][0] == 0 and partition[-1][1] == n - 1
        assert all(a <= b for a, b in partition), "no empty stage"
        assert all(partition[i][1] + 1 == partition[i + 1][0] for i in range(stages - 1))
        assert max(stage_costs(costs, partition)) == pytest.approx(brute_force(costs, stages))


def test_planted_costs() -> None:
    """Greedy filling (cut once half the total is reached) would give [[0, 4], [5, 7]] here."""
    assert balanced_partition([1, 1, 1, 1, 8, 1, 1, 1], 2) == [(0, 3), (4, 7)]
    assert balanced_partition([5, 1, 1, 1, 1, 1], 2) == [(0, 0), (1, 5)]
    assert balanced_partition([1, 2, 3, 4, 5, 6, 7, 8, 9], 3) == [(0, 4), (5, 6), (7, 8)]
    with pytest.raises(ValueError, match="cannot cut 2 blocks into 3"):
        balanced_partition([1, 1], 3)


class Heavy(nn.Module):
    """A block of `repeats` square layers: its cost is planted in proportion to `repeats`."""

    def __init__(self, width: int, repeats: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(repeats))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


class UnevenModel(nn.Module):
    """Blocks of planted, uneven costs, cut as the lm is: `blocks` and `stage(first, last)`."""

    def __init__(self, repeats: list[int], width: int = 256) -> None:
        super().__init__()
        self.blocks = nn.ModuleDict({str(i): Heavy(width, r) for i, r in enumerate(repeats)})

    def stage(self, first: int, last: int) -> nn.Module:
        return nn.Sequential(*(self.blocks[str(i)] for i in range(first, last + 1)))


def test_measured_costs_of_uneven_blocks_balance_within_20_percent() -> None:
    """Blocks of 1..6 layers: the split of the measured costs is the best one for them
    (brute force), and under the planted costs its costliest stage is within 20% of the
    best possible split's."""
    planted = [1, 1, 6, 1, 1, 3, 1, 2]
    torch.manual_seed(0)
    model = UnevenModel(planted)
    batches = [(torch.randn(128, 256), torch.randn(128, 256)) for _ in range(5)]
    measured = profile_blocks(
        model,
        model.stage,
        len(planted),
        batches,
        lambda out, target: F.mse_loss(out, target, reduction="sum"),
        state_bytes_per_param=4.0,
        autocast=_no_autocast,
    )
    assert all(p.grad is None for p in model.parameters()), "profiling leaves no gradients"
    heaviest = max(range(len(planted)), key=lambda i: measured.seconds[i])
    assert heaviest == 2, f"the 6-layer block measures costliest: {measured.seconds}"
    widths = [256 * 256 + 256] * len(planted)
    assert measured.state_bytes == [4 * 4 * w * r for w, r in zip(widths, planted, strict=True)]
    assert all(a > 0 for a in measured.activation_bytes)
    for stages in (2, 3, 4):
        partition = balanced_partition(measured.seconds, stages)
        chosen = max(stage_costs(measured.seconds, partition))
        assert chosen == pytest.approx(brute_force(measured.seconds, stages))
        planted_max = max(stage_costs([float(p) for p in planted], partition))
        best_planted = brute_force([float(p) for p in planted], stages)
        assert planted_max <= 1.2 * best_planted, (stages, partition, measured.seconds)


def _no_autocast() -> torch.autocast:
    return torch.autocast("cpu", enabled=False)
