"""The re-balance's arithmetic: the weighted partition is the best one, the decision follows
the ranks' speeds and its threshold, and speeds come from every rank's figures alike."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from shoal.strategies.pipeline.partition import balanced_partition, stage_costs
from shoal.strategies.pipeline.rebalance import Rebalancer, decide, rank_costs, stage_times
from tests.strategies.pipeline.test_partition import brute_force


def test_the_weighted_split_is_the_best_contiguous_one() -> None:
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(2, 9)
        stages = rng.randint(1, n)
        costs = [rng.uniform(0.1, 5.0) for _ in range(n)]
        speeds = [rng.uniform(0.5, 4.0) for _ in range(stages)]
        parts = balanced_partition(costs, stages, speeds)
        times = [w * c for w, c in zip(speeds, stage_costs(costs, parts), strict=True)]
        assert max(times) == pytest.approx(brute_force(costs, stages, speeds))


def test_a_slow_rank_gets_fewer_blocks_and_equal_ranks_keep_an_even_split() -> None:
    costs = [1.0] * 8
    even = [(0, 3), (4, 7)]
    slowed = decide(costs, even, [1.0, 3.0], threshold=0.1)
    assert slowed.new == [(0, 5), (6, 7)] and slowed.moves
    assert slowed.old_times == [4.0, 12.0] and slowed.new_times == [6.0, 6.0]
    assert slowed.gain == pytest.approx(0.5)
    steady = decide(costs, even, [2.0, 2.0], threshold=0.1)
    assert steady.new == even and not steady.moves


def test_a_gain_below_the_threshold_keeps_the_partition() -> None:
    costs = [1.0] * 4
    now = [(0, 1), (2, 3)]
    small = decide(costs, now, [1.0, 2.0], threshold=0.3)  # 4.0 -> 3.0 at best: 25%
    assert small.new == [(0, 2), (3, 3)] and small.gain == pytest.approx(0.25)
    assert not small.moves
    assert decide(costs, now, [1.0, 2.0], threshold=0.2).moves


def test_virtual_stages_take_their_rank_s_speed() -> None:
    """Rank r holds stages r, r + ranks, ...: each is weighted by its rank's speed."""
    costs = [1.0] * 8
    partition = [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert stage_times(costs, partition, [1.0, 2.0]) == [2.0, 4.0, 2.0, 4.0]
    assert rank_costs(costs, partition, 2) == [4.0, 4.0]


def test_speeds_are_each_rank_s_seconds_per_step_over_its_profiled_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each rank fills its own slots of one sum (every rank gets the same numbers);
    a rank with no step measured keeps its estimate; the speeds are smoothed."""
    figures = {0: (2.0, 2), 1: (9.0, 3)}  # compute seconds, steps of each rank
    total = [figures[0][0], figures[1][0], figures[0][1], figures[1][1]]
    monkeypatch.setattr(
        "shoal.strategies.pipeline.rebalance.all_reduce_sum", lambda _ctx, _mine: total
    )
    rebalancer = Rebalancer(SimpleNamespace(rank=0), [0.25, 0.25, 0.5, 0.5], 2, 0.1)  # type: ignore[arg-type]
    rebalancer.measure([(0, 1), (2, 3)], *figures[0])
    assert rebalancer.speeds == [pytest.approx(2.0), pytest.approx(3.0)]  # 1.0 / 0.5, 3.0 / 1.0
    total[:] = [3.0, 0.0, 1.0, 0.0]  # rank 1 measured nothing this time
    rebalancer.measure([(0, 1), (2, 3)], 3.0, 1)
    assert rebalancer.speeds == [pytest.approx(0.5 * 6.0 + 0.5 * 2.0), pytest.approx(3.0)]
    assert rebalancer.block_seconds([(0, 1), (2, 3)]) == pytest.approx([1.0, 1.0, 1.5, 1.5])
