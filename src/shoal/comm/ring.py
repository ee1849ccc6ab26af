"""Ring all-reduce: reduce-scatter then all-gather around a ring (Patarasuk & Yuan, 2009).

The bucket is cut into n chunks (sizes differ by at most one element, so any
length works, 0 and lengths below n included). In n - 1 reduce-scatter steps
each rank sends one chunk to its right neighbour and adds the chunk arriving
from its left, so that rank i ends holding the full sum of chunk i + 1; in n - 1
all-gather steps the summed chunks travel once more around the ring. Each rank
sends 2 (n - 1) / n of the bucket, the lower bound for an all-reduce, which is
why the ring is bandwidth-optimal; it pays 2 (n - 1) latencies for it.

Every chunk is summed once, along one path, and then copied: all ranks end
with bit-identical sums. Chunks travel as segments, each forwarded as soon as
it is summed, so arithmetic and transfers overlap along the ring.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shoal.comm.aggregators import BlockingAggregator
from shoal.comm.links import CommGroup, Transfer, rank_chunks

#: chunks travel as segments of at most this size, each forwarded as soon as it is summed
SEGMENT_BYTES = 1 << 20


def _segments(start: int, end: int, segment: int) -> list[tuple[int, int]]:
    return [(a, min(a + segment, end)) for a in range(start, end, segment)]


def ring_all_reduce_(
    links: CommGroup, tensor: torch.Tensor, ranks: Sequence[int], scratch: torch.Tensor
) -> None:
    """Sum `tensor` over `ranks` (this rank among them) in place.

    `scratch` holds (n - 1) chunks. Every receive is posted first (reduce-scatter
    segments into `scratch`, all-gather segments straight into `tensor`), so each
    send finds its receive waiting; then segments are pipelined: each one is
    summed (or, in the all-gather, received) and forwarded to the right
    neighbour at once. Receiving into `tensor` early is safe: a chunk's final
    sum can only arrive after this rank has added to it and sent it on.
    """
    n = len(ranks)
    if n == 1 or tensor.numel() == 0:
        return
    me = ranks.index(links.rank)
    right, left = ranks[(me + 1) % n], ranks[(me - 1) % n]
    chunks = rank_chunks(tensor.numel(), n)
    segment = max(1, SEGMENT_BYTES // tensor.element_size())
    what = "ring all-reduce"
    reduce_scatter: list[list[tuple[Transfer, torch.Tensor, torch.Tensor]]] = []
    used = 0
    for step in range(n - 1):  # step s sums chunk me - s - 1
        parts = []
        for a, b in _segments(*chunks[(me - step - 1) % n], segment):
            incoming = scratch[used : used + b - a]
            used += b - a
            parts.append((links.irecv(left, incoming, what), incoming, tensor[a:b]))
        reduce_scatter.append(parts)
    all_gather = [  # step s receives the final chunk me - s
        [
            (links.irecv(left, tensor[a:b], what), tensor[a:b])
            for a, b in _segments(*chunks[(me - step) % n], segment)
        ]
        for step in range(n - 1)
    ]
    sends = [links.isend(right, tensor[a:b], what) for a, b in _segments(*chunks[me], segment)]
    for parts in reduce_scatter:  # the last step's sums are final: they start the all-gather
        for transfer, incoming, target in parts:
            transfer.wait()
            target.add_(incoming)
            sends.append(links.isend(right, target, what))
    for step, gathered in enumerate(all_gather):
        for transfer, target in gathered:
            transfer.wait()
            if step < n - 2:
                sends.append(links.isend(right, target, what))
    for transfer in sends:
        transfer.wait()


def ring_all_gather_(links: CommGroup, rows: torch.Tensor, ranks: Sequence[int]) -> None:
    """Fill every row of `rows` ([len(ranks), n]; row i belongs to ranks[i]) from its owner:
    each row travels around the ring once, forwarded as soon as it arrives."""
    n = len(ranks)
    if n == 1 or rows.numel() == 0:
        return
    me = ranks.index(links.rank)
    right, left = ranks[(me + 1) % n], ranks[(me - 1) % n]
    what = "ring all-gather"
    recvs = [links.irecv(left, rows[(me - step - 1) % n], what) for step in range(n - 1)]
    sends = [links.isend(right, rows[me], what)]
    for step, transfer in enumerate(recvs):
        transfer.wait()
        if step < n - 2:
            sends.append(links.isend(right, rows[(me - step - 1) % n], what))
    for transfer in sends:
        transfer.wait()


class RingAllReduce(BlockingAggregator):
    """`method = "ring"`: chunked reduce-scatter + all-gather around all ranks."""

    method = "ring"

    def all_reduce_(self, tensor: torch.Tensor) -> None:
        ranks = list(range(self.world_size))
        ring_all_reduce_(self.links, tensor, ranks, self.scratch(tensor.dtype, tensor.numel()))

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        rows = torch.empty(self.world_size, tensor.numel(), dtype=tensor.dtype)
        rows[self.rank].copy_(tensor)
        ring_all_gather_(self.links, rows, list(range(self.world_size)))
        return rows
