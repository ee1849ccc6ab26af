"""A worker's side of the transport: requests to one server, over gloo or in-process.

:class:`RemoteLink`: a request posts the receives of its reply first (gloo then
sends without an extra round trip), then sends its header and its payload (see
`wire.py`); every wait has a timeout and its error names the server. Messages
between two ranks on one tag arrive in sending order, which is what pairs a
header with its payload and a request with its reply. Each link numbers its
messages 1, 2, 3, ... (`seq`); a reply names the request it answers.

With co-located servers a worker's requests to the server in its own process
skip the network (:class:`LocalLink`, the same messages through queues). The
server's side is `endpoint.py`.
"""

from __future__ import annotations

import datetime
import queue
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from shoal.comm.links import PeerTimeout, describe_failure
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
    sent_bytes: int = 0
    _seq: int = 0

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
    def __init__(self, server: int, rank: int, group: Any) -> None:
        self.server = server
        self.rank = rank
        self.group = group
        self._sends: list[tuple[Any, torch.Tensor]] = []

    def _isend(self, tag: Tag, tensor: torch.Tensor) -> None:
        if tensor.numel():
            work = dist.isend(tensor, self.rank, group=self.group, tag=tag)
            self._sends.append((work, tensor))
            self.sent_bytes += tensor.numel() * tensor.element_size()

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
        self._isend(Tag.HEADER, header.tensor())
        if header.payload_bytes:
            self._isend(Tag.PAYLOAD, pack_payload(header, ids, values, blob))

    def request(
        self, header: Header, ids: torch.Tensor | None, blob: bytes, reply_values: int
    ) -> PendingReply:
        raw = torch.zeros(HEADER_LEN, dtype=torch.int64)
        header_work = dist.irecv(raw, self.rank, group=self.group, tag=Tag.REPLY_HEADER)
        values = torch.empty(reply_values)
        values_work = (
            dist.irecv(values, self.rank, group=self.group, tag=Tag.REPLY_VALUES)
            if reply_values
            else None
        )
        self._send_message(header, ids, None, blob)
        what = f"{header.op.name.lower()} for clock {header.clock}"

        def wait_reply(timeout_s: float) -> Reply:
            self._wait(header_work, timeout_s, what)
            parsed = Header.parse(raw, UNBOUNDED)
            reply = Reply(-1, parsed)
            if parsed.blob_len:
                blob_in = torch.empty(parsed.blob_len, dtype=torch.uint8)
                work = dist.irecv(blob_in, self.rank, group=self.group, tag=Tag.REPLY_BLOB)
                self._wait(work, timeout_s, what)
                reply.blob = bytes(blob_in.numpy().tobytes())
            if values_work is not None:  # an error's too: the server sends one (a float)
                self._wait(values_work, timeout_s, what)
                if parsed.op != Op.ERROR:
                    reply.values = values
            return reply

        return PendingReply(self, header, wait_reply)

    def send(self, header: Header, ids: torch.Tensor | None, values: torch.Tensor | None) -> None:
        self._send_message(header, ids, values, b"")

    def flush(self, timeout_s: float) -> None:
        for work, _ in self._sends:
            self._wait(work, timeout_s, "sending")
        self._sends.clear()

    def _wait(self, work: Any, timeout_s: float, what: str) -> None:
        failure = f"server {self.server} (rank {self.rank}) did not answer {what}"
        try:
            done = work.wait(datetime.timedelta(seconds=timeout_s))
        except Exception as exc:
            raise PeerTimeout(f"{failure} within {timeout_s:g} s: {describe_failure(exc)}") from exc
        if done is False:
            raise PeerTimeout(f"{failure} within {timeout_s:g} s (faults.timeout_s)")


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
                    f"server {self.server} (in this process) did not answer "
                    f"{header.op.name.lower()} for clock {header.clock} within {timeout_s:g} s"
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
