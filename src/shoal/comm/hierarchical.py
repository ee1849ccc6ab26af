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

Why pieces and a leader thread: done one bucket at a time, the slow link
between hosts idles while a bucket is reduced inside the hosts and again
while its sum is broadcast back. So a bucket is cut into pieces of
`PIECE_BYTES`: every rank reduces all pieces in order, then receives their
sums in order; a leader hands each reduced piece to its own leader thread,
which rings the pieces with the other leaders while the next pieces are still
being reduced, and broadcasts each piece once its ring is done. The link then
carries one piece after another, and waits only for the first piece's
reduction and the last piece's broadcast. The two threads talk to disjoint
peers (the other leaders; the ranks of the own host), and each pair of ranks
sees its messages in the same order on both sides.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from shoal.comm.aggregators import BlockingAggregator
from shoal.comm.links import CommGroup
from shoal.comm.ring import ring_all_reduce_
from shoal.comm.threads import CommThread, Pending
from shoal.comm.tree import binomial_broadcast_, binomial_reduce_

#: a bucket crosses the hosts in pieces of this size, pipelined with the reductions inside
#: the hosts (measured: benchmarks/multi_host.py --part dp, RESULTS.md)
PIECE_BYTES = 4 << 20


def hierarchical_groups(world_size: int, branching_factor: int) -> list[list[int]]:
    """Consecutive groups of `branching_factor` ranks (the last may be smaller)."""
    return [
        list(range(start, min(start + branching_factor, world_size)))
        for start in range(0, world_size, branching_factor)
    ]


class HierarchicalAllReduce(BlockingAggregator):
    """`method = "hierarchical"`: two levels, groups of `branching_factor` ranks."""

    method = "hierarchical"

    def __init__(
        self, links: CommGroup, branching_factor: int | None = None, piece_bytes: int = 0
    ) -> None:
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
        self.piece_bytes = piece_bytes or PIECE_BYTES
        self._leader_thread: CommThread | None = None

    @classmethod
    def from_config(cls, config: Any, links: CommGroup) -> BlockingAggregator:
        return cls(links, config.branching_factor)

    def all_reduce_(self, tensor: torch.Tensor) -> None:
        if self.world_size == 1 or tensor.numel() == 0:
            return
        if len(self.leaders) == 1:  # one host: no link between hosts to keep busy
            binomial_reduce_(
                self.links, tensor, self.group, self.scratch(tensor.dtype, 2 * tensor.numel())
            )
            binomial_broadcast_(self.links, tensor, self.group)
            return
        step = max(1, self.piece_bytes // tensor.element_size())
        pieces = [tensor[a : a + step] for a in range(0, tensor.numel(), step)]
        size = pieces[0].numel()
        # [0, 2 size): the tree's receive halves; [2 size, 3 size): the leader ring's chunks
        scratch = self.scratch(tensor.dtype, 3 * size)
        leader = self.rank == self.group[0]
        rung: list[Pending] = []
        for piece in pieces:
            binomial_reduce_(self.links, piece, self.group, scratch[: 2 * piece.numel()])
            if leader:
                rung.append(self._leader(piece, scratch[2 * size : 3 * size]))
        for index, piece in enumerate(pieces):
            if leader:
                rung[index].wait()
            binomial_broadcast_(self.links, piece, self.group)

    def _leader(self, piece: torch.Tensor, scratch: torch.Tensor) -> Pending:
        """Ring `piece` among the leaders on the leader thread (pieces go in order)."""
        if self._leader_thread is None:
            self._leader_thread = CommThread("shoal-hierarchical-leaders", self.links.timeout_s)
        ring = partial(ring_all_reduce_, self.links, piece, self.leaders, scratch[: piece.numel()])
        return self._leader_thread.submit(ring, "hierarchical leader ring")
