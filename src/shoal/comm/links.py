"""An aggregator's own process group and its point-to-point traffic.

Every aggregator built on point-to-point operations (ring, tree, hierarchical,
parameter server, gossip, and compression's inner reductions) talks on a private
process group created for it. Its messages then never interleave with the
trainer's collectives (buffer broadcasts, metrics, the non-finite check), even
while it runs on a communication thread during the backward pass.

`exchange` posts every send and receive of one round at once and then waits:
gloo matches messages by (peer, tag) in order, so posting them together never
deadlocks, and every rank issues its rounds in the same order. A receive that
times out names the rank it was waiting for. Bytes handed to sends are counted,
so `sent_bytes` is what this rank really put on the wire (payload only).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

_SOURCE_LOCATION = re.compile(r"\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*")

#: the tag of aggregation traffic (a private group: one tag is enough)
TAG = 0


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
    `local_world_size` is the number of ranks on this host (hierarchical groups).
    """

    rank: int
    world_size: int
    local_world_size: int
    timeout_s: float
    group: dist.ProcessGroup | None = None
    sent_bytes: int = field(default=0)

    @classmethod
    def create(
        cls, rank: int, world_size: int, local_world_size: int, timeout_s: float
    ) -> CommGroup:
        """Collective: every rank creates its aggregators in the same order."""
        group = None
        if world_size > 1:
            group = dist.new_group(
                backend=dist.get_backend(), timeout=datetime.timedelta(seconds=timeout_s)
            )
        return cls(rank, world_size, local_world_size, timeout_s, group)

    def post(
        self,
        sends: Sequence[tuple[int, torch.Tensor]],
        recvs: Sequence[tuple[int, torch.Tensor]],
        what: str,
    ) -> Round:
        """Post every (peer, tensor) receive and send of one round; wait on the returned Round."""
        round_ = Round(self, what)
        for peer, tensor in recvs:
            work = dist.irecv(tensor, peer, group=self.group, tag=TAG) if tensor.numel() else None
            round_.recvs.append((peer, work))
        for peer, tensor in sends:
            if tensor.numel():
                work = dist.isend(tensor, peer, group=self.group, tag=TAG)
                assert work is not None  # isend always returns a Work
                round_.sends.append((peer, work))
                self.sent_bytes += tensor.numel() * tensor.element_size()
        return round_

    def exchange(
        self,
        sends: Sequence[tuple[int, torch.Tensor]],
        recvs: Sequence[tuple[int, torch.Tensor]],
        what: str,
    ) -> None:
        """One round: post every send and receive, then wait for all of them."""
        self.post(sends, recvs, what).wait_all()

    def wait(self, work: dist.Work, peer: int, direction: str, what: str) -> None:
        verb = "receiving from" if direction == "from" else "sending to"
        failure = f"{what}: rank {self.rank} failed {verb} rank {peer} (faults.timeout_s = "
        failure += f"{self.timeout_s:g} s)"
        try:
            completed = work.wait(datetime.timedelta(seconds=self.timeout_s))
        except Exception as exc:
            cause = _SOURCE_LOCATION.sub("", str(exc)).strip().splitlines()
            raise PeerTimeout(f"{failure}: {cause[0] if cause else type(exc).__name__}") from exc
        if completed is False:
            raise PeerTimeout(f"{failure}: timed out")


@dataclass
class Round:
    """The operations of one posted round; receives can be consumed one by one as they land."""

    links: CommGroup
    what: str
    recvs: list[tuple[int, dist.Work | None]] = field(default_factory=list)
    sends: list[tuple[int, dist.Work]] = field(default_factory=list)

    def wait_recv(self, index: int) -> None:
        """Wait for the `index`-th posted receive (in the order they were given)."""
        peer, work = self.recvs[index]
        if work is not None:
            self.links.wait(work, peer, "from", self.what)
            self.recvs[index] = (peer, None)

    def wait_all(self) -> None:
        for index in range(len(self.recvs)):
            self.wait_recv(index)
        for peer, work in self.sends:
            self.links.wait(work, peer, "to", self.what)
