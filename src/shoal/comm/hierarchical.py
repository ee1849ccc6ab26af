"""Hierarchical all-reduce: reduce inside groups, all-reduce among leaders, broadcast back.

By default a group is a machine: the ranks that share a host (as the job
learnt when it started, whatever their numbers), so under torchrun or Slurm
with 2 hosts of 4 ranks there are 2 groups of 4. With `branching_factor` the
ranks are cut into consecutive groups of that size instead. Each group reduces
to its first rank over a binomial tree, the group leaders all-reduce over a
ring, and each leader broadcasts the sum over its group's tree. Only leaders
cross the slow links between hosts, once per bucket and with the ring's
bandwidth-optimal volume; the rest of the traffic stays on the fast links
inside a host (the scheme of Horovod's hierarchical all-reduce and of
2D-torus / tree variants in NCCL). A world that branching_factor does not divide
gets a smaller last group. The leaders compute the sum and everyone receives a
copy, so all ranks end with bit-identical sums.
"""

from __future__ import annotations

from typing import Any

import torch

from shoal.comm.aggregators import BlockingAggregator
from shoal.comm.links import CommGroup
from shoal.comm.ring import ring_all_reduce_
from shoal.comm.tree import binomial_broadcast_, binomial_reduce_


def hierarchical_groups(world_size: int, branching_factor: int) -> list[list[int]]:
    """Consecutive groups of `branching_factor` ranks (the last may be smaller)."""
    return [
        list(range(start, min(start + branching_factor, world_size)))
        for start in range(0, world_size, branching_factor)
    ]


class HierarchicalAllReduce(BlockingAggregator):
    """`method = "hierarchical"`: two levels, groups of `branching_factor` ranks."""

    method = "hierarchical"

    def __init__(self, links: CommGroup, branching_factor: int | None = None) -> None:
        super().__init__(links)
        if branching_factor:
            self.groups = hierarchical_groups(links.world_size, branching_factor)
        else:
            if links.hosts.world_size != links.world_size:
                raise ValueError(
                    f"hosts describe {links.hosts.world_size} ranks, the group has "
                    f"{links.world_size}"
                )
            self.groups = links.hosts.groups
        self.group = next(group for group in self.groups if links.rank in group)
        self.leaders = [group[0] for group in self.groups]

    @classmethod
    def from_config(cls, config: Any, links: CommGroup) -> BlockingAggregator:
        return cls(links, config.branching_factor)

    def all_reduce_(self, tensor: torch.Tensor) -> None:
        if self.world_size == 1 or tensor.numel() == 0:
            return
        scratch = self.scratch(tensor.dtype, 2 * tensor.numel())
        binomial_reduce_(self.links, tensor, self.group, scratch)
        if self.rank == self.group[0]:
            ring_all_reduce_(self.links, tensor, self.leaders, scratch)
        binomial_broadcast_(self.links, tensor, self.group)
