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
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from shoal.comm.links import CommGroup, PeerTimeout, Transfer
from shoal.errors import JobFailed, ShoalError
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


class RemoteLink(Link):
    """To server `server` on rank `rank`, over the servers' CommGroup `peers`."""

    peers: CommGroup

    def __init__(self, server: int, rank: int, peers: CommGroup) -> None:
        self.server = server
        self.rank = rank
        self.peers = peers
        self._sends: list[Transfer] = []

    def _isend(self, tag: Tag, tensor: torch.Tensor, what: str) -> None:
        self._sends.append(self.peers.isend(self.rank, tensor, what, tag=tag, role=self.role))

    def _irecv(self, tag: Tag, tensor: torch.Tensor, what: str) -> Transfer:
        return self.peers.irecv(self.rank, tensor, what, tag=tag, role=self.role)

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

    def request(
        self, header: Header, ids: torch.Tensor | None, blob: bytes, reply_values: int
    ) -> PendingReply:
        what = f"the reply to {_what(header)}"
        raw = torch.zeros(HEADER_LEN, dtype=torch.int64)
        header_in = self._irecv(Tag.REPLY_HEADER, raw, what)
        values = torch.empty(reply_values)
        values_in = self._irecv(Tag.REPLY_VALUES, values, what)
        self._send_message(header, ids, None, blob)

        def wait_reply(timeout_s: float) -> Reply:
            header_in.wait(timeout_s)
            parsed = Header.parse(raw, UNBOUNDED)
            reply = Reply(-1, parsed)
            if parsed.blob_len:
                blob_in = torch.empty(parsed.blob_len, dtype=torch.uint8)
                self._irecv(Tag.REPLY_BLOB, blob_in, what).wait(timeout_s)
                reply.blob = bytes(blob_in.numpy().tobytes())
            values_in.wait(timeout_s)  # an error's too: the server sends one (a float)
            if reply_values and parsed.op != Op.ERROR:
                reply.values = values
            return reply

        return PendingReply(self, header, wait_reply)

    def send(self, header: Header, ids: torch.Tensor | None, values: torch.Tensor | None) -> None:
        self._send_message(header, ids, values, b"")

    def flush(self, timeout_s: float) -> None:
        for transfer in self._sends:
            transfer.wait(timeout_s)
        self._sends.clear()


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
