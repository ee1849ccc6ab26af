"""Parameter server: `num_servers` ranks each own a slice of the flat gradient.

The bucket is cut into `num_servers` contiguous slices (sizes differ by at most
one element); rank s serves slice s. Every rank pushes each slice to its
server, each server sums the n contributions it owns in rank order, and every
rank pulls the summed slices back (the co-located server layout of BytePS and
of seed 001's "Parameter Server with N servers": servers are ranks that also
train). A server receives and sends (n - 1) / num_servers of the bucket; with
num_servers = n that is the ring's volume in two rounds instead of 2 (n - 1),
with num_servers = 1 it is the classic central server, whose links carry
everything. Since the trainer scales the loss by 1 / global batch, the summed
slice is the workers' average gradient. Each slice is summed by one server and
copied to all: every rank ends with bit-identical sums.
"""

from __future__ import annotations

from typing import Any

import torch

from shoal.comm.aggregators import BlockingAggregator
from shoal.comm.links import CommGroup, rank_chunks
from shoal.errors import ShoalError


class ParameterServerAllReduce(BlockingAggregator):
    """`method = "parameter_server"`: push slices to their servers, servers sum, pull."""

    method = "parameter_server"

    def __init__(self, links: CommGroup, num_servers: int = 1) -> None:
        super().__init__(links)
        if not 1 <= num_servers <= links.world_size:
            raise ShoalError(
                f"strategy.aggregation.num_servers: {num_servers} servers need at least as many "
                f"workers, but the world has {links.world_size}; set num_servers <= "
                f"{links.world_size}"
            )
        self.num_servers = num_servers

    @classmethod
    def from_config(cls, config: Any, links: CommGroup) -> BlockingAggregator:
        return cls(links, config.num_servers)

    def all_reduce_(self, tensor: torch.Tensor) -> None:
        n, me = self.world_size, self.rank
        if n == 1 or tensor.numel() == 0:
            return
        slices = rank_chunks(tensor.numel(), self.num_servers)
        serving = me < self.num_servers
        mine = slices[me] if serving else (0, 0)
        width = mine[1] - mine[0]
        rows = self.scratch(tensor.dtype, n * width).view(n, width)
        what = "parameter server"
        # post every receive first: the pushes to this server, and the pulls of every slice
        # (a pulled slice can only arrive after this rank's own push of it has gone out)
        pushed = [self.links.irecv(r, rows[r], what) for r in range(n) if r != me and serving]
        pulled = [
            self.links.irecv(s, tensor[a:b], what) for s, (a, b) in enumerate(slices) if s != me
        ]
        sends = [
            self.links.isend(s, tensor[a:b], what) for s, (a, b) in enumerate(slices) if s != me
        ]
        if serving:
            for transfer in pushed:
                transfer.wait()
            if width:  # the sum in rank order, once, by the slice's server
                rows[me].copy_(tensor[mine[0] : mine[1]])
                torch.sum(rows, dim=0, out=tensor[mine[0] : mine[1]])
            sends += [
                self.links.isend(r, tensor[mine[0] : mine[1]], what) for r in range(n) if r != me
            ]
        for transfer in pulled + sends:
            transfer.wait()
