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
    """Sum `tensor` over `ranks` in place; `scratch` holds two copies of `tensor`.

    Each round's receive is posted one round ahead, into the half of `scratch`
    not in use, so the partner's send finds it waiting.
    """
    n = len(ranks)
    if n == 1 or tensor.numel() == 0:
        return
    me = ranks.index(links.rank)
    p = 1 << (n.bit_length() - 1)  # the largest power of two <= n
    what = "tree all-reduce"
    if me >= p:  # fold into a partner below p, then receive the result (it comes after)
        partner = ranks[me - p]
        result = links.irecv(partner, tensor, what)
        links.isend(partner, tensor, what).wait()
        result.wait()
        return
    extra = ranks[me + p] if me + p < n else None
    partners = [ranks[me ^ mask] for mask in (1 << k for k in range(p.bit_length() - 1))]
    sources = ([extra] if extra is not None else []) + partners
    halves = (scratch[: tensor.numel()], scratch[tensor.numel() : 2 * tensor.numel()])
    pending = links.irecv(sources[0], halves[0], what)
    for index, source in enumerate(sources):
        upcoming = None
        if index + 1 < len(sources):
            upcoming = links.irecv(sources[index + 1], halves[(index + 1) % 2], what)
        send = links.isend(source, tensor, what) if source in partners else None
        pending.wait()
        if send is not None:
            send.wait()  # `tensor` changes next
        tensor.add_(halves[index % 2])
        if upcoming is not None:
            pending = upcoming
    if extra is not None:
        links.isend(extra, tensor, what).wait()


def binomial_reduce_(
    links: CommGroup, tensor: torch.Tensor, ranks: Sequence[int], scratch: torch.Tensor
) -> None:
    """Sum `tensor` over `ranks` into ranks[0] (others' tensors are left partial).
    `scratch` holds two copies of `tensor`; receives are posted one round ahead."""
    n = len(ranks)
    if n == 1 or tensor.numel() == 0:
        return
    me = ranks.index(links.rank)
    children, parent, mask = [], None, 1
    while mask < n:
        if me & mask:
            parent = ranks[me - mask]
            break
        if me + mask < n:
            children.append(ranks[me + mask])
        mask <<= 1
    what = "tree reduce"
    halves = (scratch[: tensor.numel()], scratch[tensor.numel() : 2 * tensor.numel()])
    pending = links.irecv(children[0], halves[0], what) if children else None
    for index in range(len(children)):
        upcoming = None
        if index + 1 < len(children):
            upcoming = links.irecv(children[index + 1], halves[(index + 1) % 2], what)
        assert pending is not None
        pending.wait()
        tensor.add_(halves[index % 2])
        pending = upcoming
    if parent is not None:
        links.isend(parent, tensor, what).wait()


def binomial_broadcast_(links: CommGroup, tensor: torch.Tensor, ranks: Sequence[int]) -> None:
    """Copy ranks[0]'s `tensor` to every rank of `ranks`."""
    n = len(ranks)
    if n == 1 or tensor.numel() == 0:
        return
    me = ranks.index(links.rank)
    what = "tree broadcast"
    mask = 1 << ((n - 1).bit_length() - 1)  # the largest power of two < n
    sends = []
    while mask >= 1:
        if me % (2 * mask) == 0 and me + mask < n:
            sends.append(links.isend(ranks[me + mask], tensor, what))
        elif me % (2 * mask) == mask:
            links.irecv(ranks[me - mask], tensor, what).wait()
        mask >>= 1
    for transfer in sends:
        transfer.wait()


class TreeAllReduce(BlockingAggregator):
    """`method = "tree"`: recursive doubling; latency-optimal for small messages."""

    method = "tree"

    def all_reduce_(self, tensor: torch.Tensor) -> None:
        ranks = list(range(self.world_size))
        scratch = self.scratch(tensor.dtype, 2 * tensor.numel())
        recursive_doubling_all_reduce_(self.links, tensor, ranks, scratch)
