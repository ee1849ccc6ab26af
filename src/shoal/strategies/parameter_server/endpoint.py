"""A server's side of the transport: read requests from any rank, answer them, stay in step.

Every message goes through the servers' CommGroup (`comm/links.py`: timed waits
naming the worker, bytes counted). One receiver thread per remote rank posts a
receive for that rank's next header,
then reads its payload, and puts the decoded message into an inbox; the serving loop
takes messages from the inbox with a timeout (held requests expire, a silent job is
noticed) and sends replies. A receive from *any* rank (`dist.recv` without `src`) is
not used: once a closed rank's payloads are left unread, gloo's any-source matching
stopped delivering the other ranks' headers (seen as a hang of the honest workers),
whereas a receive bound to one rank is matched only by that rank's messages. The
header receives wait without a deadline of their own (a worker may rightly be quiet
for long while the others train): the serving loop notices a silent job, a dead peer
fails its receive, and the launcher's heartbeats notice a hung one.

Staying in step with each rank (:class:`Channels`) is what keeps a rejected message
from corrupting the next one: gloo hands a receive the next message on its tag
from that rank, so every payload a header announced must be read, exactly, before
that rank's next header is. Hence, per header:

- its frame is broken (no MAGIC or END: garbled or truncated; a size negative or
  over the bounds): nothing it says can be trusted, not even whether a payload
  follows, so that rank's channel is *closed*: the header is answered with the
  reason, and from then on every request of that rank is answered with it and
  none of its payloads is read (one could be a leftover, or larger than any receive
  posted for it, which aborts the process inside gloo). A worker so closed fails
  with the reason; the other workers are served on.
- its frame holds: the payload is read by the size the header announces (bounded),
  and its stamp must name this header's sender and sequence number; a payload that
  does not (shorter than announced, or another message's) closes the channel too.
- the fields are wrong (unknown op, another sender's index, a sequence number out
  of order, sizes that do not fit the op, ids out of range...): the message has been
  read to its end, so it is refused with an answer and that rank is served on.
- the payload does not come within `faults.timeout_s`: the server fails naming the
  rank (gloo closes a connection whose receive timed out).

What gloo itself does to a message longer than the receive posted for it is out of
reach: it aborts the receiving process. So a rank that sends a payload longer than
its header announced ends the server, and the job fails naming the server's rank.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from shoal.comm.links import NO_DEADLINE_S, CommGroup, PeerTimeout, Transfer, describe_failure
from shoal.strategies.parameter_server.server import Reply, ShardServer, error_reply
from shoal.strategies.parameter_server.transport import LocalChannel
from shoal.strategies.parameter_server.wire import (
    HEADER_LEN,
    REQUESTS,
    STAMP_LEN,
    Bounds,
    Header,
    Message,
    Op,
    Tag,
    WireError,
    frame,
    payload_bytes,
    payload_stamp,
    stamp,
    unpack_payload,
)


@dataclass
class Rejected:
    """A message refused before it reached the shard. `header`: what it said, if readable
    (else `seq`, its sequence number as sent); `closed`: the rank's channel is closed (see
    the module docstring)."""

    source: int
    header: Header | None
    reason: str
    closed: bool = False
    seq: int = 0


@dataclass
class _Failed:
    error: Exception


class Channels:
    """What a server reads from each rank: the sequence number it expects next, and whether
    it still reads from that rank at all (`closed`: rank -> why not)."""

    def __init__(self, server: int, peers: CommGroup, bounds: Bounds) -> None:
        self.server = server
        self.peers = peers
        self.bounds = bounds
        self.expected: collections.defaultdict[int, int] = collections.defaultdict(lambda: 1)
        self.closed: dict[int, str] = {}
        self.heard = time.monotonic()  # when the last header arrived
        self.last: dict[int, tuple[int, float]] = {}  # rank -> (its last header's seq, when)
        self.reading: set[int] = set()  # ranks whose payload is awaited (its own timeout)

    def receive(self, source: int) -> Message | Rejected:
        """The next request of rank `source`: read to its end, or refused (blocking)."""
        raw = torch.zeros(HEADER_LEN, dtype=torch.int64)  # a truncated header keeps zeros
        what = f"server {self.server}: the next request of rank {source}"
        self.peers.irecv(source, raw, what, tag=Tag.HEADER, role=f"worker {source}").wait(
            NO_DEADLINE_S
        )
        self.heard = time.monotonic()
        self.last[source] = (int(raw[3]), self.heard)
        return self.read(raw, source)

    def last_heard(self, rank: int, now: float) -> str:
        """What was last heard from `rank`, for the error that names a silent worker."""
        if rank not in self.last:
            return f"worker {rank} sent nothing"
        seq, when = self.last[rank]
        return f"worker {rank} last sent message {seq} {now - when:.1f} s ago"

    def read(self, raw: torch.Tensor, source: int) -> Message | Rejected:
        if source in self.closed:
            return self._from_closed(raw, source)
        try:
            v = frame(raw, self.bounds)
        except WireError as exc:
            return self._close(raw, source, f"rank {source} sent {exc}")
        payload = self._payload(source, v)
        if payload is not None and payload_stamp(payload) != stamp(v[2], v[3]):
            return self._close(
                raw,
                source,
                f"the payload rank {source} sent after its header (seq {v[3]}) is not that "
                "header's: shorter than the header announced, or another message's",
            )
        expected = self.expected[source]
        try:
            header = Header.parse(raw, self.bounds)
            if header.seq != expected:
                raise WireError(
                    f"sequence number {header.seq} out of order: rank {source}'s next message "
                    f"to server {self.server} is number {expected}"
                )
            self.expected[source] += 1
            if header.sender != source:
                raise WireError(f"header names worker {header.sender}, sent by rank {source}")
        except WireError as exc:  # read to its end: the channel is in step, and stays open
            if v[3] == expected and self.expected[source] == expected:
                self.expected[source] += 1
            return Rejected(source, _readable(raw, self.bounds), str(exc), seq=v[3])
        message = Message(header, source)
        if payload is not None:
            message.ids, message.values, message.blob = unpack_payload(header, payload)
        return message

    def _payload(self, source: int, v: list[int]) -> torch.Tensor | None:
        size = payload_bytes(v[7] + v[8], v[9], v[10])
        if not size:
            return None
        payload = torch.empty(size, dtype=torch.uint8)
        payload[-STAMP_LEN:] = 0  # a short payload leaves these: never a valid stamp
        what = (
            f"server {self.server}: rank {source} announced a payload of {size} bytes "
            f"(its message seq {v[3]}) and did not send it within {self.peers.timeout_s:g} s"
        )
        transfer = self.peers.irecv(source, payload, what, tag=Tag.PAYLOAD, role=f"worker {source}")
        self.reading.add(source)
        transfer.wait()
        self.reading.discard(source)
        return payload

    def _close(self, raw: torch.Tensor, source: int, reason: str) -> Rejected:
        self.closed[source] = f"{reason}; server {self.server} reads no more from it"
        header = _readable(raw, self.bounds)
        return Rejected(source, header, self.closed[source], closed=True, seq=int(raw[3]))

    def _from_closed(self, raw: torch.Tensor, source: int) -> Message | Rejected:
        """A closed rank's header: its payload, if any, is never read. A goodbye is taken (the
        worker is done), anything else refused with the reason the channel closed."""
        header = _readable(raw, self.bounds)
        if header is not None and header.op == Op.BYE and header.sender == source:
            return Message(header, source)
        reason = f"rank {source}'s channel is closed: {self.closed[source]}"
        return Rejected(source, header, reason, closed=True, seq=int(raw[3]))


def _readable(raw: torch.Tensor, bounds: Bounds) -> Header | None:
    try:
        return Header.parse(raw, bounds)
    except WireError:
        return None


class ServerEndpoint:
    """Runs one :class:`ShardServer`: receives requests, answers them, ends when all workers
    said goodbye. `local` is the in-process channel of a co-located worker (or None)."""

    def __init__(
        self,
        server: ShardServer,
        peers: CommGroup,
        widths: tuple[int, int],
        max_rows: int,
        log: logging.Logger,
        local: LocalChannel | None = None,
        on_tick: Callable[[ShardServer], None] | None = None,
    ) -> None:
        """`peers`: the servers' group, a view of its own (its bytes are the server's)."""
        self.server = server
        self.peers = peers
        self.timeout_s = peers.timeout_s
        self.log = log
        self.local = local
        self.on_tick = on_tick
        self.channels = Channels(server.index, peers, Bounds.of(max_rows, widths))
        self.inbox: queue.Queue[Message | Rejected | _Failed] = queue.Queue()
        if local is not None:
            local.inbox = self.inbox
        self._unsent: list[Transfer] = []

    def remote_workers(self) -> list[int]:
        local = self.local.worker if self.local is not None else -1
        return [w for w in range(self.server.num_workers) if w != local]

    # ------------------------------------------------------------ receiving
    def _receive_loop(self, source: int) -> None:
        """Thread: rank `source` -> inbox, until it said BYE or receiving from it fails."""
        while True:
            try:
                item = self.channels.receive(source)
            except Exception as exc:  # the peer died, a payload did not come
                self.inbox.put(_Failed(exc))
                return
            self.inbox.put(item)
            if isinstance(item, Message) and item.header.op == Op.BYE:
                return

    # ------------------------------------------------------------ serving
    def serve(self) -> None:
        """Answer requests until every worker is done; raise naming who went silent."""
        server = self.server
        threads = [
            threading.Thread(
                target=self._receive_loop, args=(rank,), name=f"ps-receive-{rank}", daemon=True
            )
            for rank in self.remote_workers()
        ]
        for thread in threads:
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
            self._reap()
            if item is None:
                self._send_all(server.expire(now))
                silent = now - max(last_heard, self.channels.heard) > self.timeout_s
                if silent and not self.channels.reading:
                    expected = [w for w, done in enumerate(server.finished) if not done]
                    heard = "; ".join(self.channels.last_heard(w, now) for w in expected)
                    raise PeerTimeout(
                        f"server {server.index}: no request from any worker for "
                        f"{self.timeout_s:g} s (faults.timeout_s); still expected: workers "
                        f"{expected} ({heard})"
                    )
                continue
            last_heard = now
            if isinstance(item, _Failed):
                if isinstance(item.error, PeerTimeout):
                    raise item.error
                raise PeerTimeout(
                    f"server {server.index}: receiving from the workers failed: "
                    f"{describe_failure(item.error)}"
                )
            if isinstance(item, Rejected):
                replies = self._rejected(item, now)
            else:
                try:
                    replies = server.receive(item, now)
                except WireError as exc:  # names no worker or no request: answered at once
                    replies = self._rejected(Rejected(item.source, item.header, str(exc)), now)
            self._send_all(replies + server.expire(now))
        deadline = time.monotonic() + self.timeout_s
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._flush()

    def _rejected(self, item: Rejected, now: float) -> list[Reply]:
        """A worker's own request in an open channel is refused in its turn (by the shard);
        anything else is answered at once, to the rank that sent it (a push or a goodbye
        expects no answer). A worker whose channel is closed is refused by the shard too,
        so that a pull held for it names the reason."""
        server, header, source = self.server, item.header, item.source
        worker = 0 <= source < server.num_workers
        if item.closed and worker:
            server.refused.setdefault(source, item.reason)
        own = header is not None and header.op in REQUESTS and header.sender == source
        if own and worker and not item.closed:
            assert header is not None
            return server.reject(header, item.reason, now)
        server.stats.rejected += 1
        self.log.warning(
            "server %d: rejected a message from rank %d: %s", server.index, source, item.reason
        )
        if header is not None and header.op in (Op.PUSH, Op.BYE):
            return []
        request = header if header is not None else Header(Op.ERROR, source, 0, seq=item.seq)
        return [error_reply(server.index, source, request, item.reason)]

    # ------------------------------------------------------------ replying
    def _send_all(self, replies: list[Reply]) -> None:
        for reply in replies:
            if self.local is not None and reply.worker == self.local.worker:
                self.local.replies.put(reply)
                continue
            self._send(reply)

    def _send(self, reply: Reply) -> None:
        """Header and values: the worker posted their receives with its request, so these
        complete at once (waited, with the timeout). A blob's receive is posted after the
        worker reads the header, and an error goes to a rank that may not read it at all:
        those are left in flight, and checked as they complete."""
        header = reply.header
        header.blob_len = len(reply.blob)
        sends = [(Tag.REPLY_HEADER, header.tensor())]
        if reply.values is not None and reply.values.numel():
            sends.append((Tag.REPLY_VALUES, reply.values.contiguous()))
        if reply.blob:
            blob = torch.frombuffer(bytearray(reply.blob), dtype=torch.uint8)
            sends.append((Tag.REPLY_BLOB, blob))
        wait = header.op != Op.ERROR
        what = f"server {self.server.index}: a reply (seq {header.seq})"
        role = f"worker {reply.worker}"
        for tag, tensor in sends:
            transfer = self.peers.isend(reply.worker, tensor, what, tag=tag, role=role)
            if wait and tag != Tag.REPLY_BLOB:
                transfer.wait()
            else:
                self._unsent.append(transfer)

    def _reap(self) -> None:
        """Forget the sends in flight that completed (their buffers may be freed)."""
        if self._unsent:
            self._unsent = [transfer for transfer in self._unsent if not transfer.done()]

    def _flush(self) -> None:
        for transfer in self._unsent:
            try:
                transfer.wait(min(self.timeout_s, 10.0))
            except PeerTimeout as exc:  # the worker failed on its own: its report says why
                self.log.warning(
                    "server %d: a reply was not delivered: %s",
                    self.server.index,
                    describe_failure(exc),
                )
        self._unsent.clear()
