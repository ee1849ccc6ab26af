"""Latency-optimal reductions: recursive doubling, and binomial-tree reduce and broadcast.

Recursive doubling (Thakur, Rabenseifner & Gropp, 2005): in round k every rank
swaps its whole vector with the rank whose index differs in bit k and adds it,
so after log2(p) rounds all p ranks hold the sum. That is the fewest rounds an
all-reduce can take, which is what counts for small messages; it sends the
whole vector each round, so large messages are the ring's. For a world that is
not a power of two, the r = n - p ranks above the largest power of two p first
hand their vector to a partner below p and get the result back at the end
(two extra rounds). Partners add the same two values (a + b = b + a exactly in
IEEE arithmetic), so every rank ends with bit-identical sums.

The binomial tree reduces to (or broadcasts from) the first rank of a group in
ceil(log2(n)) rounds; the hierarchical method uses it inside each group.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shoal.comm.aggregators import BlockingAggregator
from shoal.comm.links import CommGroup


def recursive_doubling_all_reduce_(
    links: CommGroup, tensor: torch.Tensor, ranks: Sequence[int], scratch: torch.Tensor
) -> None:
    """Sum `tensor` over `ranks` in place; `scratch` is as long as `tensor`."""
    n = len(ranks)
    if n == 1 or tensor.numel() == 0:
        return
    me = ranks.index(links.rank)
    p = 1 << (n.bit_length() - 1)  # the largest power of two <= n
    what = "tree all-reduce"
    if me >= p:  # fold into a partner below p, then receive the result
        partner = ranks[me - p]
        links.exchange([(partner, tensor)], [], what)
        links.exchange([], [(partner, tensor)], what)
        return
    extra = ranks[me + p] if me + p < n else None
    if extra is not None:
        links.exchange([], [(extra, scratch)], what)
        tensor.add_(scratch)
    mask = 1
    while mask < p:
        partner = ranks[me ^ mask]
        links.exchange([(partner, tensor)], [(partner, scratch)], what)
        tensor.add_(scratch)
        mask <<= 1
    if extra is not None:
        links.exchange([(extra, tensor)], [], what)


def binomial_reduce_(
    links: CommGroup, tensor: torch.Tensor, ranks: Sequence[int], scratch: torch.Tensor
) -> None:
    """Sum `tensor` over `ranks` into ranks[0] (others' tensors are left partial)."""
    n = len(ranks)
    if n == 1 or tensor.numel() == 0:
        return
    me = ranks.index(links.rank)
    mask = 1
    while mask < n:
        if me & mask:
            links.exchange([(ranks[me - mask], tensor)], [], "tree reduce")
            return
        if me + mask < n:
            links.exchange([], [(ranks[me + mask], scratch)], "tree reduce")
            tensor.add_(scratch)
        mask <<= 1


def binomial_broadcast_(links: CommGroup, tensor: torch.Tensor, ranks: Sequence[int]) -> None:
    """Copy ranks[0]'s `tensor` to every rank of `ranks`."""
    n = len(ranks)
    if n == 1 or tensor.numel() == 0:
        return
    me = ranks.index(links.rank)
    mask = 1 << ((n - 1).bit_length() - 1)  # the largest power of two < n
    while mask >= 1:
        if me % (2 * mask) == 0 and me + mask < n:
            links.exchange([(ranks[me + mask], tensor)], [], "tree broadcast")
        elif me % (2 * mask) == mask:
            links.exchange([], [(ranks[me - mask], tensor)], "tree broadcast")
        mask >>= 1


class TreeAllReduce(BlockingAggregator):
    """`method = "tree"`: recursive doubling; latency-optimal for small messages."""

    method = "tree"

    def all_reduce_(self, tensor: torch.Tensor) -> None:
        ranks = list(range(self.world_size))
        scratch = self.scratch(tensor.dtype, tensor.numel())
        recursive_doubling_all_reduce_(self.links, tensor, ranks, scratch)
