"""Moving messages between workers and servers over torch.distributed point-to-point.

Server side (:class:`ServerEndpoint`): a receiver thread posts a receive for the
next header from *any* worker (`dist.recv` without `src`), reads the payload
sizes from it, bound-checks them, receives the payloads from that worker on
their own tags and puts the decoded message into an inbox; the serving loop
takes messages from the inbox with a timeout (held requests expire, a silent
job is noticed) and sends replies. A header that fails its checks is answered
with an error and its payload is never received, so the other workers are
served on. Messages between two ranks on one tag arrive in sending order, which
is what pairs a header with its payloads.

Worker side (:class:`RemoteLink`): a request posts the receives of its reply
first (gloo then sends without an extra round trip), then sends; every wait has
a timeout and its error names the server. With co-located servers a worker's
requests to the server in its own process skip the network (:class:`LocalLink`,
the same messages through queues).
"""

from __future__ import annotations

import datetime
import logging
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from shoal.comm.links import PeerTimeout, describe_failure
from shoal.errors import JobFailed, ShoalError
from shoal.strategies.parameter_server.server import Reply, ShardServer, error_reply
from shoal.strategies.parameter_server.wire import (
    HEADER_LEN,
    Header,
    Message,
    Op,
    Tag,
    WireError,
)


class ServerRefused(ShoalError):
    """A server answered a request with an error (its text names the cause)."""


@dataclass
class _Rejected:
    source: int
    raw: torch.Tensor
    reason: str


@dataclass
class _Failed:
    error: Exception


# ---------------------------------------------------------------- server side
class ServerEndpoint:
    """Runs one :class:`ShardServer`: receives requests, answers them, ends when all workers
    said goodbye. `local` is the in-process channel of a co-located worker (or None)."""

    def __init__(
        self,
        server: ShardServer,
        group: Any,
        widths: tuple[int, int],
        max_rows: int,
        timeout_s: float,
        log: logging.Logger,
        local: LocalChannel | None = None,
        on_tick: Callable[[ShardServer], None] | None = None,
    ) -> None:
        self.server = server
        self.group = group
        self.widths = widths
        self.max_rows = max_rows
        self.timeout_s = timeout_s
        self.log = log
        self.local = local
        self.on_tick = on_tick
        self.inbox: queue.Queue[Message | _Rejected | _Failed] = queue.Queue()
        if local is not None:
            local.inbox = self.inbox
        self._unsent: list[tuple[Any, torch.Tensor]] = []

    def remote_workers(self) -> list[int]:
        local = self.local.worker if self.local is not None else -1
        return [w for w in range(self.server.num_workers) if w != local]

    # ------------------------------------------------------------ receiving
    def _receive_loop(self) -> None:
        """Thread: network -> inbox, until every remote worker said BYE or receiving fails."""
        remaining = set(self.remote_workers())
        while remaining:
            raw = torch.zeros(HEADER_LEN, dtype=torch.int64)
            try:
                source = dist.recv(raw, src=None, group=self.group, tag=Tag.HEADER)
                header = Header.parse(raw, self.max_rows)
                if header.sender != source:
                    raise WireError(f"header names worker {header.sender}, sent by rank {source}")
                message = self._payloads(header, source)
            except WireError as exc:
                self.inbox.put(_Rejected(source, raw, str(exc)))
                continue
            except Exception as exc:  # a peer died or the group timed out
                self.inbox.put(_Failed(exc))
                return
            if header.op == Op.BYE:
                remaining.discard(source)
            self.inbox.put(message)

    def _payloads(self, header: Header, source: int) -> Message:
        message = Message(header, source)
        if header.rows and header.op in (Op.PULL, Op.PUSH):
            message.ids = torch.empty(header.rows, dtype=torch.int64)
            dist.recv(message.ids, src=source, group=self.group, tag=Tag.IDS)
        if header.op == Op.PUSH and header.rows:
            count = header.entity_rows * self.widths[0] + header.relation_rows * self.widths[1]
            message.values = torch.empty(count)
            dist.recv(message.values, src=source, group=self.group, tag=Tag.VALUES)
        if header.blob_len:
            blob = torch.empty(header.blob_len, dtype=torch.uint8)
            dist.recv(blob, src=source, group=self.group, tag=Tag.BLOB)
            message.blob = bytes(blob.numpy().tobytes())
        return message

    # ------------------------------------------------------------ serving
    def serve(self) -> None:
        """Answer requests until every worker is done; raise naming who went silent."""
        server = self.server
        thread = None
        if self.remote_workers():
            thread = threading.Thread(target=self._receive_loop, name="ps-receive", daemon=True)
            thread.start()
        last_heard = time.monotonic()
        while not all(server.finished):
            now = time.monotonic()
            deadline = server.next_deadline()
            wait = min(1.0, max(0.0, deadline - now) if deadline is not None else 1.0)
            try:
                item = self.inbox.get(timeout=max(wait, 0.01))
            except queue.Empty:
                item = None
            now = time.monotonic()
            if self.on_tick is not None:
                self.on_tick(server)
            if item is None:
                self._send_all(server.expire(now))
                if now - last_heard > self.timeout_s:
                    silent = [w for w, done in enumerate(server.finished) if not done]
                    raise PeerTimeout(
                        f"server {server.index}: no request from any worker for "
                        f"{self.timeout_s:g} s (faults.timeout_s); still expected: workers "
                        f"{silent}"
                    )
                continue
            last_heard = now
            if isinstance(item, _Failed):
                raise PeerTimeout(
                    f"server {server.index}: receiving from the workers failed: "
                    f"{describe_failure(item.error)}"
                )
            if isinstance(item, _Rejected):
                self._reject(item)
                continue
            try:
                replies = server.receive(item, now)
            except WireError as exc:
                server.stats.rejected += 1
                self.log.warning(
                    "server %d: rejected a request of worker %d: %s", server.index, item.source, exc
                )
                replies = [error_reply(server.index, item.source, item.header, str(exc))]
            self._send_all(replies + server.expire(now))
        if thread is not None:
            thread.join(timeout=self.timeout_s)
        self._flush()

    def _reject(self, item: _Rejected) -> None:
        self.server.stats.rejected += 1
        self.log.warning(
            "server %d: rejected a message from rank %d: %s",
            self.server.index,
            item.source,
            item.reason,
        )
        seq = int(item.raw[7]) if item.raw.numel() == HEADER_LEN else 0
        header = Header(Op.PULL, item.source, 0, seq=seq)
        self._send_all([error_reply(self.server.index, item.source, header, item.reason)])

    def _send_all(self, replies: list[Reply]) -> None:
        for reply in replies:
            if self.local is not None and reply.worker == self.local.worker:
                self.local.replies.put(reply)
                continue
            self._send(reply)

    def _send(self, reply: Reply) -> None:
        """Header and values: the worker posted their receives with its request, so these
        complete at once (waited, with the timeout). A blob's receive is posted after the
        worker reads the header: it is left in flight and checked at the end."""
        header = reply.header
        header.blob_len = len(reply.blob)
        sends = [(Tag.REPLY_HEADER, header.tensor())]
        if reply.values is not None and reply.values.numel():
            sends.append((Tag.REPLY_VALUES, reply.values.contiguous()))
        try:
            for tag, tensor in sends:
                work = dist.isend(tensor, reply.worker, group=self.group, tag=tag)
                if work is not None:
                    work.wait(datetime.timedelta(seconds=self.timeout_s))
        except Exception as exc:
            raise PeerTimeout(
                f"server {self.server.index}: sending a reply to worker {reply.worker} failed: "
                f"{describe_failure(exc)}"
            ) from exc
        if reply.blob:
            blob = torch.frombuffer(bytearray(reply.blob), dtype=torch.uint8)
            work = dist.isend(blob, reply.worker, group=self.group, tag=Tag.REPLY_BLOB)
            self._unsent.append((work, blob))

    def _flush(self) -> None:
        for work, _ in self._unsent:
            try:
                work.wait(datetime.timedelta(seconds=min(self.timeout_s, 10.0)))
            except Exception as exc:  # the worker failed on its own: its report says why
                self.log.warning(
                    "server %d: an error reply was not delivered: %s",
                    self.server.index,
                    describe_failure(exc),
                )
        self._unsent.clear()


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
        if reply.header.op == Op.ERROR:
            raise ServerRefused(reply.blob.decode(errors="replace"))
        if reply.header.seq != self.request.seq:
            raise JobFailed(
                f"server {self.link.server}: reply {reply.header.seq} answers another request "
                f"than {self.request.seq} (protocol out of step)"
            )
        return reply


class Link(ABC):
    """A worker's connection to one server: over gloo (`RemoteLink`) or in-process (`LocalLink`)."""

    server: int
    rank: int
    sent_bytes: int = 0

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
        header.blob_len = len(blob)
        self._isend(Tag.HEADER, header.tensor())
        if ids is not None:
            self._isend(Tag.IDS, ids.contiguous())
        if values is not None:
            self._isend(Tag.VALUES, values.contiguous())
        if blob:
            self._isend(Tag.BLOB, torch.frombuffer(bytearray(blob), dtype=torch.uint8))

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
            parsed = Header.parse(raw, max_rows=1 << 62)
            reply = Reply(-1, parsed)
            if parsed.op == Op.ERROR or parsed.blob_len:
                blob_in = torch.empty(parsed.blob_len, dtype=torch.uint8)
                if parsed.blob_len:
                    work = dist.irecv(blob_in, self.rank, group=self.group, tag=Tag.REPLY_BLOB)
                    self._wait(work, timeout_s, what)
                reply.blob = bytes(blob_in.numpy().tobytes())
            if parsed.op == Op.ERROR:
                return reply
            if values_work is not None:
                self._wait(values_work, timeout_s, what)
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
        message = Message(header, self.channel.worker)
        if ids is not None:
            message.ids = ids.clone()
        if values is not None:
            message.values = values.clone()
        self._put(message)
