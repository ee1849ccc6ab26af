"""A worker's side of the transport: requests to one server, over gloo or in-process.

:class:`RemoteLink`: a request posts the receives of its reply first (gloo then
sends without an extra round trip), then sends its header and its payload (see
`wire.py`), all through the servers' CommGroup (`comm/links.py`: every wait has
a timeout, its error names the server, bytes are counted there). Messages
between two ranks on one tag arrive in sending order, which is what pairs a
header with its payload and a request with its reply; requests and replies have
tags of their own, since a co-located rank sends both to the same peer. Each
link numbers its messages 1, 2, 3, ... (`seq`); a reply names the request it
answers.

With co-located servers a worker's requests to the server in its own process
skip the network (:class:`LocalLink`, the same messages through queues). The
server's side is `endpoint.py`.
"""

from __future__ import annotations

import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from shoal.comm.links import CommGroup, PeerTimeout, Transfer
from shoal.errors import JobFailed, ShoalError
from shoal.strategies.parameter_server.rejoin import POLL_S, Announcement, PushLog, Rejoin
from shoal.strategies.parameter_server.server import Reply
from shoal.strategies.parameter_server.wire import (
    HEADER_LEN,
    UNBOUNDED,
    Header,
    Message,
    Op,
    Tag,
    pack_payload,
)


class ServerRefused(ShoalError):
    """A server answered a request with an error (its text names the cause)."""


# ---------------------------------------------------------------- worker side
def _what(header: Header) -> str:
    """A request, as errors name it."""
    return f"worker {header.sender}'s {header.op.name.lower()} for clock {header.clock}"


@dataclass
class LocalChannel:
    """The queues between a co-located worker and the server thread in its process.

    Replies arrive in request order, but a worker may wait for a later one first (a
    statistics request while a prefetched pull is in flight): each is matched to its
    request by sequence number, and the ones not waited for yet are kept aside.
    """

    worker: int
    inbox: queue.Queue[Any] | None = None
    replies: queue.Queue[Reply] = field(default_factory=queue.Queue)
    _early: dict[int, Reply] = field(default_factory=dict)

    def reply_to(self, seq: int, timeout_s: float) -> Reply | None:
        deadline = time.monotonic() + timeout_s
        while seq not in self._early:
            try:
                reply = self.replies.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            self._early[reply.header.seq] = reply
        return self._early.pop(seq)


class PendingReply:
    """An answered request in flight: `wait()` returns (header, values, blob)."""

    def __init__(self, link: Link, request: Header, wait_reply: Callable[[float], Reply]) -> None:
        self.link = link
        self.request = request
        self._wait_reply = wait_reply

    def wait(self, timeout_s: float) -> Reply:
        reply = self._wait_reply(timeout_s)
        if reply.header.seq != self.request.seq:
            raise JobFailed(
                f"server {self.link.server}: reply {reply.header.seq} answers another request "
                f"than {self.request.seq} (protocol out of step)"
            )
        if reply.header.op == Op.ERROR:
            raise ServerRefused(reply.blob.decode(errors="replace"))
        return reply


class Link(ABC):
    """A worker's connection to one server: over gloo (`RemoteLink`) or in-process (`LocalLink`).

    The link numbers the messages it sends (`header.seq`), whatever the caller put there."""

    server: int
    rank: int
    #: the group a remote link sends on (None: in-process)
    peers: CommGroup | None = None
    _seq: int = 0

    @property
    def role(self) -> str:
        return f"server {self.server}"

    def _number(self, header: Header) -> Header:
        self._seq += 1
        header.seq = self._seq
        return header

    @abstractmethod
    def request(
        self, header: Header, ids: torch.Tensor | None, blob: bytes, reply_values: int
    ) -> PendingReply:
        """Send a request that is answered; its reply is collected from the PendingReply."""

    @abstractmethod
    def send(self, header: Header, ids: torch.Tensor | None, values: torch.Tensor | None) -> None:
        """Send a message that gets no reply (a push)."""

    def flush(self, timeout_s: float) -> None:  # noqa: B027 - optional: in-process links send at once
        """Wait until every send so far has left (their buffers may then be reused)."""

    def heal(self) -> None:  # noqa: B027 - optional: only a remote link's server restarts
        """Reconnect now if a send found the server gone (after the pushes to every server)."""

    def saved(self, clock: int) -> None:  # noqa: B027 - optional: see RemoteLink
        """The servers wrote their state of `clock` (a checkpoint or a snapshot)."""


@dataclass
class _Posted:
    """The receives of one request's reply, as posted on one connection."""

    peers: CommGroup
    generation: int
    raw: torch.Tensor
    values: torch.Tensor
    header_in: Transfer
    values_in: Transfer


@dataclass
class _Request:
    """An answered request sent over a remote link, until its reply is taken: what it
    said (to send it again to a restarted server) and the receives of its reply."""

    header: Header
    ids: torch.Tensor | None
    blob: bytes
    reply_values: int
    posted: _Posted | None = None


@dataclass
class _SendBatch:
    """One flush's sends, as the waiter thread reports them back."""

    sends: list[Transfer]
    timeout_s: float
    finished: threading.Event = field(default_factory=threading.Event)
    failed: PeerTimeout | None = None


class _SendWaiter:
    """A thread that waits for flushes' sends in turn (RemoteLink._wait_unless_reconnected):
    one thread for the link's life instead of one a flush, which cost the demo ~6 % of
    its samples/s with restarts on (benchmarks/RESULTS.md)."""

    def __init__(self, name: str) -> None:
        self._batches: queue.SimpleQueue[_SendBatch] = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def wait_for(self, sends: list[Transfer], timeout_s: float) -> _SendBatch:
        batch = _SendBatch(sends, timeout_s)
        self._batches.put(batch)
        return batch

    def _run(self) -> None:
        while True:
            batch = self._batches.get()
            try:
                for transfer in batch.sends:
                    transfer.wait(batch.timeout_s)
            except PeerTimeout as exc:
                batch.failed = exc
            finally:
                batch.finished.set()


class RemoteLink(Link):
    """To server `server` on rank `rank`, over the servers' CommGroup `peers`.

    With `rejoin` (a server may be restarted alone, `rejoin.py`), a failed message does
    not end the worker: the link waits for the restarted server, connects to it, sends
    again its pushes since the server's restored clock and the requests still
    unanswered, and the caller's wait goes on. A watcher thread (`rejoin.Watcher`) does
    the same as soon as the server announces its return, whatever the worker's main
    thread is waiting for (another server's reply, a collective of the workers): so the
    lock, taken by every operation that sends or reconnects."""

    peers: CommGroup

    def __init__(
        self, server: int, rank: int, peers: CommGroup, rejoin: Rejoin | None = None
    ) -> None:
        self.server = server
        self.rank = rank
        self.peers = peers
        self.rejoin = rejoin
        self.generation = 0  # the server's restarts this link has reconnected after
        self.log = PushLog()
        self.lock = threading.RLock()
        self._sends: list[Transfer] = []
        self._outstanding: list[_Request] = []
        self._broken: PeerTimeout | None = None  # a send failed: reconnect after the pushes
        self._waiter: _SendWaiter | None = None  # flush's waits (with rejoin), made on use

    def _isend(self, tag: Tag, tensor: torch.Tensor, what: str) -> None:
        self._sends.append(self.peers.isend(self.rank, tensor, what, tag=tag, role=self.role))

    def _send_message(
        self,
        header: Header,
        ids: torch.Tensor | None,
        values: torch.Tensor | None,
        blob: bytes,
    ) -> None:
        """The header, then one payload: ids, values, blob and the stamp (`wire.py`)."""
        self._number(header)
        header.values = values.numel() if values is not None else 0
        header.blob_len = len(blob)
        what = _what(header)
        self._isend(Tag.HEADER, header.tensor(), what)
        if header.payload_bytes:
            self._isend(Tag.PAYLOAD, pack_payload(header, ids, values, blob), what)

    def _post(self, request: _Request) -> None:
        """Post the receives of the reply first (see the module docstring), then send. Fresh
        buffers each time: a receive left on a broken connection must not fill new ones."""
        what = f"the reply to {_what(request.header)}"
        raw = torch.zeros(HEADER_LEN, dtype=torch.int64)
        values = torch.empty(request.reply_values)
        peers, role = self.peers, self.role
        header_in = peers.irecv(self.rank, raw, what, tag=Tag.REPLY_HEADER, role=role)
        values_in = peers.irecv(self.rank, values, what, tag=Tag.REPLY_VALUES, role=role)
        request.posted = _Posted(peers, self.generation, raw, values, header_in, values_in)
        self._send_message(request.header, request.ids, None, request.blob)

    def request(
        self, header: Header, ids: torch.Tensor | None, blob: bytes, reply_values: int
    ) -> PendingReply:
        request = _Request(header, ids, blob, reply_values)
        with self.lock:
            if self._broken is not None:
                self._reconnect(self._broken, self.generation)
            self._outstanding.append(request)
            try:
                self._post(request)
            except PeerTimeout as exc:
                self._reconnect(exc, self.generation)  # sends it again, with the others

        def wait_reply(timeout_s: float) -> Reply:
            while True:
                posted = request.posted
                assert posted is not None
                try:
                    reply = self._take(request, posted, timeout_s)
                except PeerTimeout as exc:
                    with self.lock:
                        self._reconnect(exc, posted.generation)
                    continue
                with self.lock:
                    self._outstanding.remove(request)
                return reply

        return PendingReply(self, header, wait_reply)

    def _take(self, request: _Request, posted: _Posted, timeout_s: float) -> Reply:
        what = f"the reply to {_what(request.header)}"
        posted.header_in.wait(timeout_s)
        parsed = Header.parse(posted.raw, UNBOUNDED)
        reply = Reply(-1, parsed)
        if parsed.blob_len:
            blob_in = torch.empty(parsed.blob_len, dtype=torch.uint8)
            posted.peers.irecv(self.rank, blob_in, what, tag=Tag.REPLY_BLOB, role=self.role).wait(
                timeout_s
            )
            reply.blob = bytes(blob_in.numpy().tobytes())
        posted.values_in.wait(timeout_s)  # an error's too: the server sends one (a float)
        if request.reply_values and parsed.op != Op.ERROR:
            reply.values = posted.values
        return reply

    def send(self, header: Header, ids: torch.Tensor | None, values: torch.Tensor | None) -> None:
        with self.lock:
            if self.rejoin is not None and header.op == Op.PUSH:
                self.log.add(header, ids, values)
            if self._broken is not None:
                return  # in the log: sent again once the server is back
            try:
                self._send_message(header, ids, values, b"")
            except PeerTimeout as exc:
                if self.rejoin is None:
                    raise
                self._broken = exc  # the other servers get their pushes first (see rejoin.py)

    def flush(self, timeout_s: float) -> None:
        with self.lock:
            sends, self._sends = self._sends, []
            generation = self.generation
        try:
            if self.rejoin is None:
                for transfer in sends:
                    transfer.wait(timeout_s)
            else:
                self._wait_unless_reconnected(sends, generation, timeout_s)
        except PeerTimeout as exc:
            with self.lock:
                self._reconnect(exc, generation)  # the pushes lost with it are sent again

    def _wait_unless_reconnected(
        self, sends: list[Transfer], generation: int, timeout_s: float
    ) -> None:
        """Wait for `sends` of connection `generation`, unless the link reconnects first.

        A send posted to a server in the instant it dies may never be signalled by gloo,
        neither done nor failed, until its own deadline (`timeout_s`, a minute): seen
        under load in tests/recovery/test_parameter_server.py, where the worker's main
        thread sat in that wait while the watcher had already sent everything again to
        the restarted server, and the job failed on the other worker's timeout. So the
        waits run on a thread of the link's (`_SendWaiter`), and the caller goes on as
        soon as the watcher has reconnected (what those sends carried went again over
        the new connection); the abandoned wait ends at its deadline, on a connection
        nobody uses any more, and later flushes get a waiter of their own.
        """
        if not sends:
            return
        if self._waiter is None:
            self._waiter = _SendWaiter(f"ps-flush-{self.server}")
        batch = self._waiter.wait_for(sends, timeout_s)
        while not batch.finished.wait(POLL_S):
            if self.generation > generation:
                assert self.rejoin is not None
                self.rejoin.log.info(
                    "%s: went on without %d sends to its previous connection (sent again "
                    "over the new one)",
                    self.role,
                    len(sends),
                )
                self._waiter = None  # busy until that wait's deadline
                return
        if batch.failed is not None:
            raise batch.failed

    def heal(self) -> None:
        with self.lock:
            if self._broken is not None:
                self._reconnect(self._broken, self.generation)

    def saved(self, clock: int) -> None:
        with self.lock:
            self.log.saved(clock)

    def _reconnect(self, cause: PeerTimeout, failed_on: int) -> None:
        """The server failed on the connection of generation `failed_on`: unless the link
        has reconnected since, wait for the server to come back (or raise naming it) and
        reconnect. Called with the lock held."""
        if self.rejoin is None:
            raise cause
        if self.generation > failed_on:
            return  # the watcher reconnected already: the caller waits on the new posts
        announcement = self.rejoin.wait_for(self.server, self.rank, self.generation, cause)
        self.reconnect(announcement)

    def reconnect(self, announcement: Announcement) -> None:
        """Connect to the server of `announcement` and send it again what its state lacks:
        the pushes since its clock, then every request still unanswered, in order. Called
        with the lock held."""
        assert self.rejoin is not None
        while True:  # until connected, or the server is given up (raises)
            self.peers = self.rejoin.pairs(self.server, announcement.generation)
            self.generation = announcement.generation
            self._broken = None
            self._sends = []
            self._seq = 0  # the new server reads each rank's messages from number 1
            pushes = self.log.since(announcement.clock, self.server, self.rejoin.rank)
            try:
                for push in pushes:
                    self._send_message(push.header, push.ids, push.values, b"")
                for request in self._outstanding:
                    self._post(request)
            except PeerTimeout as exc:  # it failed again
                announcement = self.rejoin.wait_for(self.server, self.rank, self.generation, exc)
                continue
            self.rejoin.log.warning(
                "%s (rank %d) came back at clock %d (restart %d): sent again %d push messages "
                "and %d unanswered requests",
                self.role,
                self.rank,
                announcement.clock,
                announcement.generation,
                len(pushes),
                len(self._outstanding),
            )
            return


class LocalLink(Link):
    """To the server thread in this process: the same messages, through queues."""

    def __init__(self, server: int, rank: int, channel: LocalChannel) -> None:
        self.server = server
        self.rank = rank
        self.channel = channel

    def _put(self, message: Message) -> None:
        assert self.channel.inbox is not None, "the co-located server is not running"
        self.channel.inbox.put(message)

    def request(
        self, header: Header, ids: torch.Tensor | None, blob: bytes, reply_values: int
    ) -> PendingReply:
        self._number(header)
        header.blob_len = len(blob)
        message = Message(header, self.channel.worker, blob=blob)
        if ids is not None:
            message.ids = ids.clone()
        self._put(message)

        def wait_reply(timeout_s: float) -> Reply:
            reply = self.channel.reply_to(header.seq, timeout_s)
            if reply is None:
                raise PeerTimeout(
                    f"the reply to {_what(header)}: server {self.server} (in this process) did "
                    f"not answer within {timeout_s:g} s (faults.timeout_s)"
                )
            return reply

        return PendingReply(self, header, wait_reply)

    def send(self, header: Header, ids: torch.Tensor | None, values: torch.Tensor | None) -> None:
        self._number(header)
        header.values = values.numel() if values is not None else 0
        message = Message(header, self.channel.worker)
        if ids is not None:
            message.ids = ids.clone()
        if values is not None:
            message.values = values.clone()
        self._put(message)
