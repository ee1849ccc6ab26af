"""The one timed point-to-point layer: every message between ranks goes through a CommGroup.

Aggregators (ring, tree, hierarchical, server all-reduce, gossip, compression's
inner reductions), the parameter server's workers and servers, population
transfers and federated's counted collectives all talk through it, each on a
process group of its own, so their messages never interleave with the
trainer's collectives (buffer broadcasts, metrics, the non-finite check), even
while an aggregator runs on a communication thread during the backward pass.

Why receives are posted first: gloo sends data right away only to a peer whose
receive is already posted; otherwise the two sides first trade notifications,
an extra round trip through both processes' network threads. So `exchange`
posts every receive before any send, and algorithms post receives as early as
their buffers allow.

Why one tag: messages between two ranks on one tag are matched in posting
order, and every rank issues its operations in the same order, so a private
group needs no other tag. A protocol takes another tag only for a second stream
between the same two ranks whose receives are posted out of step with the first
(the parameter server: a co-located rank both sends requests and receives
replies; a reply's blob is received only after its header was read).

Why no receive from any source: once a closed peer's messages are left unread,
gloo's any-source matching stopped delivering the other peers' messages (the
parameter server's honest workers hung, issue 18 item 3). A receive names its
peer, and is matched only by that peer's messages.

Every wait has a deadline (`timeout_s`, from `timeout_field`), and its failure is
one error, :class:`PeerTimeout`, whose message names the operation, this rank,
the peer (with its role when the caller knows it: "server 2 (rank 3)") or the
group, and the timeout field. Bytes are counted here, payload only: sent when
handed to a send, received when a receive completes (the size of the buffer it
filled: a sender may send less, as a PS server's error reply does). An `audit`
hook, when set, sees every tensor that crosses (federated's `audit_wire`).

A rank restarted alone (a parameter server, `strategies/parameter_server/rejoin.py`)
cannot enter the groups the job made at its start: a gloo group connects all its
ranks once, collectively, and torch has no call that swaps one rank of it. Its
messages then go through :class:`PairGroups`: one two-rank gloo group per peer,
built outside torch's registry on a store prefix of its own when the pair first
talks, so each survivor joins when it notices the restart, with no collective
among the survivors (who may be busy, or waiting on each other).
"""

from __future__ import annotations

import datetime
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from shoal.errors import PeerFailed
from shoal.shape.hosts import Hosts

_SOURCE_LOCATION = re.compile(r"\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*")

#: the tag of a private group's traffic (see the module docstring)
TAG = 0

#: the deadline of a wait that has none of its own (without one, gloo waits for the group's
#: timeout): a server's wait for a worker's next request, which may rightly be long in coming
NO_DEADLINE_S = 365 * 86400.0

#: (what, "sent" or "received", tensor): called for every tensor that crosses
Audit = Callable[[str, str, torch.Tensor], None]


def describe_failure(exc: BaseException) -> str:
    """The first line of a transport error, without the backend's source location."""
    cause = _SOURCE_LOCATION.sub("", str(exc)).strip().splitlines()
    return cause[0] if cause else type(exc).__name__


class PeerTimeout(PeerFailed):
    """A message or collective did not complete in time, or its peer failed: the message
    names the operation, this rank, the peer (or the group) and the timeout field."""


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


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class PairGroups:
    """Point-to-point links of a rank with its peers, each a two-rank gloo group of its own.

    Built on first use (both sides must get there, each within `timeout_s`) under
    `prefix` in the job's store; the lower global rank is rank 0 of the pair. Torch does
    not know these groups (`dist.isend` resolves a peer through its registry), so
    messages are posted on the group objects themselves."""

    def __init__(self, store: dist.Store, prefix: str, rank: int, timeout_s: float) -> None:
        self.store, self.prefix, self.rank, self.timeout_s = store, prefix, rank, timeout_s
        self._groups: dict[int, Any] = {}  # gloo groups (their stubs lack send/recv)
        self._locks: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()

    def group(self, peer: int) -> tuple[Any, int]:
        """(the pair's group, the peer's rank in it), connecting it if it is new (one lock
        per peer: a peer slow to join holds up no other pair)."""
        with self._lock:
            lock = self._locks.setdefault(peer, threading.Lock())
        with lock:
            if peer not in self._groups:
                low, high = sorted((self.rank, peer))
                store = dist.PrefixStore(f"{self.prefix}/{low}-{high}", self.store)
                timeout = datetime.timedelta(seconds=self.timeout_s)
                mine = 0 if self.rank == low else 1
                self._groups[peer] = dist.ProcessGroupGloo(store, mine, 2, timeout)
            return self._groups[peer], 1 if self.rank == min(self.rank, peer) else 0


@dataclass
class CommGroup:
    """This rank's place in a private process group, and every message it sends or receives.

    `group` is None for a world of one (nothing is ever sent then). `hosts` says
    which ranks share a machine (hierarchical groups). `device` is where tensors
    handed to the collectives and to trees (`comm/codec.py`) must live (NCCL: the
    GPU); point-to-point tensors are taken where they are.
    """

    rank: int
    world_size: int
    hosts: Hosts
    timeout_s: float
    group: dist.ProcessGroup | None = None
    timeout_field: str = "faults.timeout_s"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    audit: Audit | None = None
    #: a rank restarted alone and its peers: messages go over pairs (see the module docstring)
    pairs: PairGroups | None = None
    sent_bytes: int = 0
    received_bytes: int = 0
    #: counts may come from several threads (a server's per-rank receive threads)
    _counting: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @classmethod
    def create(
        cls,
        rank: int,
        world_size: int,
        hosts: Hosts,
        timeout_s: float,
        backend: str | None = None,
        device: torch.device | None = None,
    ) -> CommGroup:
        """Collective: every rank creates its groups in the same order."""
        group = None
        if world_size > 1:
            group = dist.new_group(
                backend=backend or dist.get_backend(),
                timeout=datetime.timedelta(seconds=timeout_s),
            )
        return cls(rank, world_size, hosts, timeout_s, group, device=device or torch.device("cpu"))

    # ------------------------------------------------------------ point to point
    def irecv(
        self, peer: int, tensor: torch.Tensor, what: str, *, tag: int = TAG, role: str = ""
    ) -> Transfer:
        """Post a receive from `peer` into `tensor` (nothing for an empty tensor).

        `role` names the peer in errors ("server 2"); `tag`: see the module docstring."""
        work = None
        if tensor.numel():
            try:
                work = self._post(False, tensor, peer, tag)
            except RuntimeError as exc:  # the connection to the peer is gone already
                raise PeerTimeout(self._posting(what, peer, role, "from", exc)) from exc
        return Transfer(self, peer, "from", what, work, tensor, role)

    def isend(
        self, peer: int, tensor: torch.Tensor, what: str, *, tag: int = TAG, role: str = ""
    ) -> Transfer:
        """Send `tensor` to `peer`; it must not change until the transfer is waited for."""
        work = None
        if tensor.numel():
            try:
                work = self._post(True, tensor, peer, tag)
            except RuntimeError as exc:
                raise PeerTimeout(self._posting(what, peer, role, "to", exc)) from exc
            self.count(what, "sent", tensor)
        return Transfer(self, peer, "to", what, work, tensor, role)

    def _post(self, send: bool, tensor: torch.Tensor, peer: int, tag: int) -> dist.Work | None:
        if self.pairs is not None:
            group, other = self.pairs.group(peer)
            return group.send([tensor], other, tag) if send else group.recv([tensor], other, tag)
        if send:
            return dist.isend(tensor, peer, group=self.group, tag=tag)
        return dist.irecv(tensor, peer, group=self.group, tag=tag)

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

    def peer_name(self, peer: int, role: str = "") -> str:
        return f"{role} (rank {peer})" if role else f"rank {peer}"

    def failure(self, what: str, peer: str, direction: str, timeout_s: float | None = None) -> str:
        """The text of a failed point-to-point wait: the operation, this rank, the peer (with
        its role), the deadline and the field that sets it."""
        verb = "receiving from" if direction == "from" else "sending to"
        seconds = self.timeout_s if timeout_s is None else timeout_s
        deadline = (
            f"{self.timeout_field} = {seconds:g} s" if seconds < NO_DEADLINE_S else "no deadline"
        )
        return f"{what}: rank {self.rank} failed {verb} {peer} ({deadline})"

    def _posting(self, what: str, peer: int, role: str, direction: str, exc: BaseException) -> str:
        return (
            f"{self.failure(what, self.peer_name(peer, role), direction)}: {describe_failure(exc)}"
        )

    # ------------------------------------------------------------ collectives
    @property
    def active(self) -> bool:
        """Whether anything crosses (a world of one sends nothing)."""
        return self.group is not None

    def all_reduce_sum(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """Sum `tensor` over the group's ranks, in place; with one rank nothing crosses."""
        if not self.active:
            return tensor
        on_device = tensor.to(self.device)
        self.count(what, "sent", on_device)
        work = dist.all_reduce(on_device, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        self._wait_group(work, what)
        tensor.copy_(on_device)
        self.count(what, "received", tensor)
        return tensor

    def all_gather(self, tensor: torch.Tensor, what: str) -> list[torch.Tensor]:
        """Every rank's `tensor` (the same shape on every rank), indexed by rank, on the CPU."""
        if not self.active:
            return [tensor]
        on_device = tensor.to(self.device)
        self.count(what, "sent", on_device)
        gathered = [torch.zeros_like(on_device) for _ in range(self.world_size)]
        work = dist.all_gather(gathered, on_device, group=self.group, async_op=True)
        self._wait_group(work, what)
        out = [g.cpu() for g in gathered]
        for rank, item in enumerate(out):
            if rank != self.rank:
                self.count(what, "received", item)
        return out

    # ------------------------------------------------------------ waiting
    def count(self, what: str, direction: str, tensor: torch.Tensor) -> None:
        """The one place bytes are counted (and, with an audit hook, recorded)."""
        with self._counting:
            if direction == "sent":
                self.sent_bytes += nbytes(tensor)
            else:
                self.received_bytes += nbytes(tensor)
        if self.audit is not None:
            self.audit(what, direction, tensor)

    def _wait_group(self, work: dist.Work | None, what: str) -> None:
        """A collective's deadline: torch names no missing rank, so the group is named."""
        assert work is not None, f"rank {self.rank} is not in {what}'s group"

        def failure() -> str:
            return (
                f"{what}: rank {self.rank} waited {self.timeout_s:g} s ({self.timeout_field}) "
                f"for the group of {self.world_size} ranks"
            )

        self.wait_work(work, failure, self.timeout_s)

    def wait_work(self, work: dist.Work, failure: Callable[[], str], timeout_s: float) -> None:
        """Wait for `work`; `failure()` words the error (built only when there is one)."""
        try:
            completed = work.wait(datetime.timedelta(seconds=timeout_s))
        except Exception as exc:
            raise PeerTimeout(f"{failure()}: {describe_failure(exc)}") from exc
        if completed is False:
            raise PeerTimeout(f"{failure()}: timed out")


@dataclass
class Transfer:
    """One posted send or receive."""

    links: CommGroup
    peer: int
    direction: str
    what: str
    work: dist.Work | None
    tensor: torch.Tensor
    role: str = ""

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait for it (`timeout_s`: another deadline than the group's, e.g. a server's
        header receives, which wait as long as a worker may rightly be quiet)."""
        if self.work is None:
            return
        links = self.links
        seconds = links.timeout_s if timeout_s is None else timeout_s

        def failure() -> str:
            peer = links.peer_name(self.peer, self.role)
            return links.failure(self.what, peer, self.direction, seconds)

        links.wait_work(self.work, failure, seconds)
        self.work = None
        if self.direction == "from":
            links.count(self.what, "received", self.tensor)

    def done(self) -> bool:
        """Completed (or nothing to wait for); a receive is counted only by `wait`."""
        return self.work is None or self.work.is_completed()
