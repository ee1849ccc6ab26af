"""Ring all-reduce: reduce-scatter then all-gather around a ring (Patarasuk & Yuan, 2009).

The bucket is cut into n chunks (sizes differ by at most one element, so any
length works, 0 and lengths below n included). In n - 1 reduce-scatter steps
each rank sends one chunk to its right neighbour and adds the chunk arriving
from its left, so that rank i ends holding the full sum of chunk i + 1; in n - 1
all-gather steps the summed chunks travel once more around the ring. Each rank
sends 2 (n - 1) / n of the bucket, the lower bound for an all-reduce, which is
why the ring is bandwidth-optimal; it pays 2 (n - 1) latencies for it.

Every chunk is summed once, along one path, and then copied: all ranks end
with bit-identical sums. Within a step, large chunks travel as segments that are
added as soon as each lands, overlapping the arithmetic with the transfer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shoal.comm.aggregators import BlockingAggregator
from shoal.comm.links import CommGroup, rank_chunks

#: large chunks are sent as segments of this size, each added as soon as it arrives
SEGMENT_BYTES = 1 << 20


def ring_all_reduce_(
    links: CommGroup, tensor: torch.Tensor, ranks: Sequence[int], scratch: torch.Tensor
) -> None:
    """Sum `tensor` over `ranks` (this rank among them) in place; `scratch` holds a chunk."""
    n = len(ranks)
    if n == 1 or tensor.numel() == 0:
        return
    me = ranks.index(links.rank)
    right, left = ranks[(me + 1) % n], ranks[(me - 1) % n]
    chunks = rank_chunks(tensor.numel(), n)
    segment = max(1, SEGMENT_BYTES // tensor.element_size())
    for step in range(n - 1):  # reduce-scatter
        s0, s1 = chunks[(me - step) % n]
        r0, r1 = chunks[(me - step - 1) % n]
        sends = [(right, tensor[a : min(a + segment, s1)]) for a in range(s0, s1, segment)]
        parts = [(a, min(a + segment, r1)) for a in range(r0, r1, segment)]
        recvs = [(left, scratch[a - r0 : b - r0]) for a, b in parts]
        round_ = links.post(sends, recvs, "ring all-reduce (reduce-scatter)")
        for index, (a, b) in enumerate(parts):
            round_.wait_recv(index)
            tensor[a:b].add_(scratch[a - r0 : b - r0])
        round_.wait_all()
    for step in range(n - 1):  # all-gather
        s0, s1 = chunks[(me + 1 - step) % n]
        r0, r1 = chunks[(me - step) % n]
        links.exchange(
            [(right, tensor[s0:s1])], [(left, tensor[r0:r1])], "ring all-reduce (all-gather)"
        )


def ring_all_gather_(links: CommGroup, rows: torch.Tensor, ranks: Sequence[int]) -> None:
    """Fill every row of `rows` ([len(ranks), n]; row i belongs to ranks[i]) from its owner."""
    n = len(ranks)
    me = ranks.index(links.rank)
    right, left = ranks[(me + 1) % n], ranks[(me - 1) % n]
    for step in range(n - 1):
        links.exchange(
            [(right, rows[(me - step) % n])],
            [(left, rows[(me - step - 1) % n])],
            "ring all-gather",
        )


class RingAllReduce(BlockingAggregator):
    """`method = "ring"`: chunked reduce-scatter + all-gather around all ranks."""

    method = "ring"

    def all_reduce_(self, tensor: torch.Tensor) -> None:
        ranks = list(range(self.world_size))
        longest = -(-tensor.numel() // self.world_size)
        ring_all_reduce_(self.links, tensor, ranks, self.scratch(tensor.dtype, longest))

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        rows = torch.empty(self.world_size, tensor.numel(), dtype=tensor.dtype)
        rows[self.rank].copy_(tensor)
        ring_all_gather_(self.links, rows, list(range(self.world_size)))
        return rows
