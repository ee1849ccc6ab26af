"""Cutting the blocks into contiguous stages: the balanced split, exactly.

Given a cost per block (measured by `profile.py`), the best partition into k
contiguous stages is the one whose costliest stage is cheapest: the pipeline's
step time is set by its slowest stage. This is the linear partition problem; a
dynamic programme over (blocks so far, stages so far) solves it exactly in
O(k n^2) (n blocks: a few dozen), where a greedy fill can miss the optimum.

With `speeds`, stage s costs `speeds[s]` x its blocks' sum: the same programme
balances stages on ranks of unequal speed (a re-balance, `rebalance.py`, gives
each stage the measured slowness of the rank that holds it).
"""

from __future__ import annotations

from collections.abc import Sequence

Partition = list[tuple[int, int]]  # [first, last] block of each stage, inclusive


def balanced_partition(
    costs: Sequence[float], stages: int, speeds: Sequence[float] | None = None
) -> Partition:
    """The contiguous split of `costs` into `stages` non-empty stages that minimises the
    largest stage sum, each stage's sum multiplied by its `speeds` entry when given
    (ties: the earliest cut points)."""
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot cut {n} blocks into {stages} non-empty stages")
    weight = [1.0] * stages if speeds is None else [float(w) for w in speeds]
    if len(weight) != stages:
        raise ValueError(f"{len(weight)} speeds for {stages} stages")
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + float(cost))
    inf = float("inf")
    # best[s][i]: the smallest max-stage cost of the first i blocks in s stages
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for i in range(s, n - (stages - s) + 1):
            for j in range(s - 1, i):  # the last stage is blocks j..i-1
                value = max(best[s - 1][j], weight[s - 1] * (prefix[i] - prefix[j]))
                if value < best[s][i]:
                    best[s][i], cut[s][i] = value, j
    parts: Partition = []
    end = n
    for s in range(stages, 0, -1):
        start = cut[s][end]
        parts.append((start, end - 1))
        end = start
    return parts[::-1]


def stage_costs(costs: Sequence[float], partition: Partition) -> list[float]:
    """Each stage's summed cost."""
    return [float(sum(costs[first : last + 1])) for first, last in partition]


def describe_partition(partition: Partition, shares: Sequence[float] | None = None) -> str:
    """'stage 0: blocks 0-3 (48.0%), stage 1: blocks 4-7 (52.0%)'."""
    parts = []
    for index, (first, last) in enumerate(partition):
        blocks = f"block {first}" if first == last else f"blocks {first}-{last}"
        share = f" ({100 * shares[index]:.1f}%)" if shares is not None else ""
        parts.append(f"stage {index}: {blocks}{share}")
    return ", ".join(parts)
