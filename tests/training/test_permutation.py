"""The keyed order of a large epoch: a permutation, computed a slice at a time, the same
for the same key, and shuffled well enough for training."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.training.permutation import KeyedPermutation


@pytest.mark.parametrize("size", [1, 2, 3, 5, 17, 1000, 4096, 4097, 70_001])
def test_every_position_holds_a_different_sample(size: int) -> None:
    order = KeyedPermutation(size, seed=5, epoch=2).at(0, size)
    assert order.dtype == np.int64
    assert np.array_equal(np.sort(order), np.arange(size))


def test_a_slice_is_the_same_positions_of_the_whole_order() -> None:
    """What a rank computes for its batch is what one process computes for the epoch."""
    whole = KeyedPermutation(10_007, seed=1, epoch=0).at(0, 10_007)
    again = KeyedPermutation(10_007, seed=1, epoch=0)
    for start, stop in ((0, 1), (17, 530), (10_000, 10_007), (9_990, 20_000), (10_007, 10_010)):
        assert np.array_equal(again.at(start, stop), whole[start:stop])


def test_the_key_is_seed_and_epoch() -> None:
    orders = [
        KeyedPermutation(1000, seed, epoch).at(0, 1000)
        for seed, epoch in ((1, 0), (1, 1), (2, 0), (-1, 0))
    ]
    for i, a in enumerate(orders):
        for b in orders[i + 1 :]:
            assert (a != b).mean() > 0.9


def test_the_order_looks_shuffled() -> None:
    """Positions and samples uncorrelated, every part of the range in every part of the
    epoch, neighbours not neighbours: what training needs of a shuffle."""
    size = 100_000
    order = KeyedPermutation(size, seed=3, epoch=0).at(0, size)
    assert abs(np.corrcoef(np.arange(size), order)[0, 1]) < 0.02
    # the first tenth of the epoch draws from every tenth of the samples about evenly
    counts = np.bincount(order[: size // 10] * 10 // size, minlength=10)
    assert counts.min() > 0.9 * size / 100 and counts.max() < 1.1 * size / 100
    assert np.mean(np.abs(np.diff(order)) < 10) < 0.001  # random: about 2e-4
