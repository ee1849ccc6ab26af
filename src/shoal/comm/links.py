"""An aggregator's own process group and its point-to-point traffic.

Every aggregator built on point-to-point operations (ring, tree, hierarchical,
parameter server, gossip, and compression's inner reductions) talks on a private
process group created for it. Its messages then never interleave with the
trainer's collectives (buffer broadcasts, metrics, the non-finite check), even
while it runs on a communication thread during the backward pass.

Receives are posted before the sends they wait for, and algorithms post them
as early as their buffers allow: gloo sends data right away only to a peer whose
receive is already posted; otherwise the two sides first trade notifications,
an extra round trip through both processes' network threads. Messages between
two ranks are matched in posting order, and every rank issues its operations
in the same order. A wait that times out names the peer it was waiting for.
Bytes handed to sends are counted, so `sent_bytes` is what this rank really
put on the wire (payload only).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from shoal.runtime.hosts import Hosts

_SOURCE_LOCATION = re.compile(r"\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*")

#: the tag of aggregation traffic (a private group: one tag is enough)
TAG = 0


def describe_failure(exc: BaseException) -> str:
    """The first line of a transport error, without the backend's source location."""
    cause = _SOURCE_LOCATION.sub("", str(exc)).strip().splitlines()
    return cause[0] if cause else type(exc).__name__


class PeerTimeout(RuntimeError):
    """A point-to-point operation did not complete: names the peer that did not answer."""


def rank_chunks(length: int, parts: int) -> list[tuple[int, int]]:
    """Split [0, length) into `parts` contiguous (start, end) pieces whose sizes differ by <= 1."""
    base, extra = divmod(length, parts)
    chunks = []
    start = 0
    for index in range(parts):
        end = start + base + (1 if index < extra else 0)
        chunks.append((start, end))
        start = end
    return chunks


@dataclass
class CommGroup:
    """This rank's place in an aggregator's private group, and its point-to-point traffic.

    `group` is None for a world of one (nothing is ever sent then).
    `hosts` says which ranks share a machine (hierarchical groups).
    """

    rank: int
    world_size: int
    hosts: Hosts
    timeout_s: float
    group: dist.ProcessGroup | None = None
    sent_bytes: int = field(default=0)

    @classmethod
    def create(cls, rank: int, world_size: int, hosts: Hosts, timeout_s: float) -> CommGroup:
        """Collective: every rank creates its aggregators in the same order."""
        group = None
        if world_size > 1:
            group = dist.new_group(
                backend=dist.get_backend(), timeout=datetime.timedelta(seconds=timeout_s)
            )
        return cls(rank, world_size, hosts, timeout_s, group)

    def irecv(self, peer: int, tensor: torch.Tensor, what: str) -> Transfer:
        """Post a receive from `peer` into `tensor` (nothing for an empty tensor)."""
        work = dist.irecv(tensor, peer, group=self.group, tag=TAG) if tensor.numel() else None
        return Transfer(self, peer, "from", what, work)

    def isend(self, peer: int, tensor: torch.Tensor, what: str) -> Transfer:
        """Send `tensor` to `peer`; it must not change until the transfer is waited for."""
        work = None
        if tensor.numel():
            work = dist.isend(tensor, peer, group=self.group, tag=TAG)
            self.sent_bytes += tensor.numel() * tensor.element_size()
        return Transfer(self, peer, "to", what, work)

    def exchange(
        self,
        sends: Sequence[tuple[int, torch.Tensor]],
        recvs: Sequence[tuple[int, torch.Tensor]],
        what: str,
    ) -> None:
        """One round: post every receive, then every send, then wait for all of them."""
        transfers = [self.irecv(peer, tensor, what) for peer, tensor in recvs]
        transfers += [self.isend(peer, tensor, what) for peer, tensor in sends]
        for transfer in transfers:
            transfer.wait()

    def wait(self, work: dist.Work, peer: int, direction: str, what: str) -> None:
        verb = "receiving from" if direction == "from" else "sending to"
        failure = f"{what}: rank {self.rank} failed {verb} rank {peer} (faults.timeout_s = "
        failure += f"{self.timeout_s:g} s)"
        try:
            completed = work.wait(datetime.timedelta(seconds=self.timeout_s))
        except Exception as exc:
            raise PeerTimeout(f"{failure}: {describe_failure(exc)}") from exc
        if completed is False:
            raise PeerTimeout(f"{failure}: timed out")


@dataclass
class Transfer:
    """One posted send or receive."""

    links: CommGroup
    peer: int
    direction: str
    what: str
    work: dist.Work | None

    def wait(self) -> None:
        if self.work is not None:
            self.links.wait(self.work, self.peer, self.direction, self.what)
            self.work = None
