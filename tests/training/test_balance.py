"""The arithmetic of dynamic batch shares (`training/balance.py`): proportional, bounded,
whole samples, every sample dealt once."""

from __future__ import annotations

import math

import pytest

from shoal.shape.roles import longest_first
from shoal.training.balance import bounded_fractions, smoothed, split_counts


def test_fractions_follow_speeds() -> None:
    assert bounded_fractions([300.0, 100.0], 0.25) == pytest.approx([0.75, 0.25])


def test_a_very_slow_worker_keeps_its_minimum_share() -> None:
    """min_share 0.5 of the even share (1/3): the slow rank keeps 1/6, the others split 5/6
    in proportion to their speeds."""
    fractions = bounded_fractions([1.0, 200.0, 100.0], 0.5)
    assert fractions == pytest.approx([1 / 6, 5 / 9, 5 / 18])
    assert sum(fractions) == pytest.approx(1.0)


def test_unmeasured_speeds_keep_even_shares() -> None:
    assert bounded_fractions([0.0, 0.0], 0.25) == [0.5, 0.5]


@pytest.mark.parametrize("total", [1, 2, 3, 7, 28, 31, 1000])
def test_counts_cover_the_batch_once_and_nobody_gets_nothing(total: int) -> None:
    counts = split_counts(total, [0.9, 0.05, 0.05])
    assert sum(counts) == total
    if total >= 3:
        assert min(counts) >= 1
    assert counts == split_counts(total, [0.9, 0.05, 0.05])  # a pure function: same everywhere


def test_counts_round_by_largest_remainder_ties_to_the_lower_rank() -> None:
    assert split_counts(31, [0.5, 0.5]) == [16, 15]
    assert split_counts(10, [0.25, 0.75]) == [3, 7]  # 2.5 / 7.5: the tie goes to rank 0


def test_speeds_are_smoothed_and_an_unmeasured_rank_keeps_its_estimate() -> None:
    assert smoothed(None, [100.0, math.nan]) == [100.0, 0.0]
    assert smoothed([100.0, 50.0], [200.0, math.nan]) == [150.0, 50.0]


def test_longest_first_places_by_cost_and_speed() -> None:
    """Costs 5, 4, 3, 3, 1 on two equal workers: 5+3 / 4+3+1 (LPT); on a worker 3x
    faster than the other, most of the work goes to it."""
    assert longest_first([5.0, 4.0, 3.0, 3.0, 1.0], [1.0, 1.0]) == [0, 1, 1, 0, 1]
    placement = longest_first([1.0] * 8, [3.0, 1.0])
    assert placement.count(0) == 6 and placement.count(1) == 2
