"""Members scheduled to workers by measured step time (`strategy.balance = "dynamic"`).

Members time-share the workers: a generation ends when the worker with the most
work ends. With static placement (member m on worker m mod W) a slow worker holds
as many members as a fast one and every generation waits for it. Dynamically,
after each generation every worker computes, from the figures every worker already
has (each member's steps and compute seconds, exchanged with its scores), each
worker's speed (its members' steps per second, smoothed over generations as data_parallel's
shares are, `training/balance.py`), places
the members by longest processing time first on workers of those speeds (members
cost alike: the same steps of the same model), and moves the fewest members that
reach those counts. Every worker computes the same placement from the same
figures. A member moves with its whole state (weights, optimizer, schedule, data
position and generators), so where it trains changes nothing it computes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from shoal.shape.roles import RankRoles, longest_first
from shoal.strategies.population.member import GenerationStats
from shoal.training.balance import smoothed


class MemberScheduler:
    """The workers' smoothed speeds, and the placement they call for."""

    def __init__(self, workers: int) -> None:
        self.speeds: list[float] | None = None
        self.workers = workers

    def observe(self, roles: RankRoles, everyone: Mapping[int, GenerationStats]) -> None:
        """A generation's figures (the same on every worker)."""
        steps, seconds = [0.0] * self.workers, [0.0] * self.workers
        for m, stats in everyone.items():
            w = roles.workers.index(roles.owner(m))
            steps[w] += stats.steps
            seconds[w] += stats.compute_s
        measured = [s / t if t > 0 else math.nan for s, t in zip(steps, seconds, strict=True)]
        self.speeds = smoothed(self.speeds, measured)

    def placement(self, roles: RankRoles) -> list[int] | None:
        """Each member's worker index under the measured speeds (None: keep the placement).

        The counts come from longest-first placement of equal members; then members move
        from workers over their count (highest member first) to workers under it (lowest
        worker first), so as few as possible move. Every worker keeps one member at least.
        """
        speeds = self.speeds
        if speeds is None or not all(math.isfinite(s) and s > 0 for s in speeds):
            return None
        size = roles.items
        counts = [0] * self.workers
        for w in longest_first([1.0] * size, speeds):
            counts[w] += 1
        for w in range(self.workers):  # no idle worker: take one from the most loaded
            if counts[w] == 0:
                counts[max(range(self.workers), key=lambda q: (counts[q], -q))] -= 1
                counts[w] = 1
        current = [roles.workers.index(roles.owner(m)) for m in range(size)]
        held = [[m for m in range(size) if current[m] == w] for w in range(self.workers)]
        spare = [m for w in range(self.workers) for m in sorted(held[w])[counts[w] :]]
        spare.sort()
        placement = list(current)
        for w in range(self.workers):
            for _ in range(counts[w] - len(held[w])):
                placement[spare.pop()] = w
        return placement if placement != current else None
