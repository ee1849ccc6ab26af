"""A dead server restarted alone: the workers keep training, the server comes back.

Issue 13 item 6. Under shoal's launcher with `faults.max_restarts` and dedicated
servers, a server rank that dies (exits, is killed) is started again on its own
(launch/launcher.py asks `Strategy.restarts_alone`); the workers' processes stay.

The restarted server loads its shard and row-optimizer state from the newest
state of the run (`recovery/restarts.py:newest_state`: the newest sealed
checkpoint or in-memory snapshot, else the job's start), at clock C, and
announces itself in the job's store (generation, C). It cannot rejoin the groups
the job formed at its start: a gloo group connects its ranks once, collectively
(`ProcessGroupGloo`'s constructor exchanges every rank's address through the store
and connects the full mesh; torch.distributed has no call that replaces one rank
of a live group, and `new_group` is collective over the default group, which the
new process is not in). So the server and each worker connect a two-rank gloo
group of their own (`comm/links.py:PairGroups`) under a prefix of that
generation, when the worker notices. The survivors' old groups stay usable among
themselves (a gloo pair fails alone: the workers' own group, the other servers'
links), which is why no survivor restarts.

Why sync mode ends exact. A server's table after clock k in sync mode is a
function of the state at C and of every worker's pushes for clocks C..k-1 alone:
a clock's pushes are summed in worker order and applied together once all came,
whatever their arrival order (`server.py`). So each worker keeps the pushes it
sent every server since the newest state that server could be restored from
(:class:`PushLog`: kept back to the previous checkpoint or snapshot, pruned when
the next is written: one in-between is kept so that a state written but not yet
sealed when the server died is never needed; a copy of the best model in best/
is no such state), and on reconnecting re-sends those
of clocks >= C, in clock order, then the requests it was still waiting on (a pull
held for a clock is answered once that clock is applied again: the same rows the
uninterrupted run read). The workers neither roll back nor redo a step: no step
is lost. A worker whose log does not reach back to C (the restored state is older
than its log) fails, naming why, and the launcher restarts the whole job from
the newest state (exact as well).

Async and bounded modes: the same replay. Nothing pushed since C is lost, but the
replayed pushes are applied in a new interleaving (each worker's in clock order,
the workers' as they arrive), and a pull a worker re-sends is answered from the
rebuilt table: these runs are not reproducible anyway, and this one differs from
an uninterrupted run as two uninterrupted async runs differ.

What a worker waits for. It notices the death when a message to or from the
server fails (gloo reports the closed connection within about a second), and then
waits for the announcement, at most `faults.start_timeout_s` (the time a process
may take to start), failing with an error that names the server if none comes.
But a worker may be waiting for something else when the server dies: a
collective of the workers (a checkpoint's, the metrics'), or another server's
reply held for a push of a worker that itself waits on the restarted server for
a pull, which needs this worker's replay. So each worker also runs a watcher
thread (:class:`Watcher`) that reconnects a link as soon as its server's
announcement appears, whatever the main thread is blocked on; every operation
of a link (send, post, reconnect) holds the link's lock, and a reply's wait that
fails on the old connection goes on with the receives the watcher posted anew.
The reconnection waits for no other worker (each has a pair of its own), so no
worker in it holds up another. One more wait of the main thread needs the watcher: a
send posted to the server in the instant it dies may be left by gloo neither done nor
failed until its own deadline, so a flush waits for its sends in a thread and goes on
once the watcher has reconnected (`transport.py`, `RemoteLink._wait_unless_reconnected`).

Co-located servers are not restarted alone: they share the process of a worker,
whose state is then gone too (the launcher restarts the job and says why).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist

from shoal.comm.links import CommGroup, PairGroups, PeerTimeout
from shoal.errors import JobFailed
from shoal.shape.hosts import Hosts
from shoal.strategies.parameter_server.wire import Header

POLL_S = 0.1


def announce_key(server: int) -> str:
    return f"shoal/ps/server/{server}"


def pairs_prefix(server: int, generation: int) -> str:
    return f"shoal/ps/pairs/{server}/{generation}"


@dataclass(frozen=True)
class Announcement:
    """A restarted server's word in the store: which restart it is, and its clock."""

    generation: int
    clock: int

    def encode(self) -> bytes:
        return json.dumps({"generation": self.generation, "clock": self.clock}).encode()

    @classmethod
    def decode(cls, value: bytes) -> Announcement:
        data = json.loads(value)
        return cls(int(data["generation"]), int(data["clock"]))


def announce(store: dist.Store, server: int, announcement: Announcement) -> None:
    store.set(announce_key(server), announcement.encode().decode())


@dataclass
class Rejoin:
    """A worker's side: wait for a restarted server and connect to it.

    `wait_s`: how long a server may take to come back (faults.start_timeout_s);
    `timeout_s`: the links' own deadline (faults.timeout_s)."""

    store: dist.Store
    rank: int
    hosts: Hosts
    wait_s: float
    timeout_s: float
    log: logging.Logger

    def announced(self, server: int, after: int) -> Announcement | None:
        """Server `server`'s announcement if newer than generation `after`, else None."""
        key = announce_key(server)
        if self.store.check([key]):
            announcement = Announcement.decode(self.store.get(key))
            if announcement.generation > after:
                return announcement
        return None

    def wait_for(self, server: int, rank: int, after: int, cause: BaseException) -> Announcement:
        """The announcement of server `server` (on `rank`) newer than generation `after`;
        PeerTimeout naming the server if it does not come back in time."""
        deadline = time.monotonic() + self.wait_s
        self.log.warning(
            "server %d (rank %d) failed (%s): waiting up to %g s (faults.start_timeout_s) for "
            "it to come back",
            server,
            rank,
            _first_line(cause),
            self.wait_s,
        )
        while True:
            announcement = self.announced(server, after)
            if announcement is not None:
                return announcement
            if time.monotonic() >= deadline:
                raise PeerTimeout(
                    f"server {server} (rank {rank}) failed ({_first_line(cause)}) and did not "
                    f"come back within {self.wait_s:g} s (faults.start_timeout_s); rank "
                    f"{self.rank} waited for it"
                )
            time.sleep(POLL_S)

    def pairs(self, server: int, generation: int) -> CommGroup:
        """The connections to server `server` after its restart `generation`."""
        pairs = PairGroups(self.store, pairs_prefix(server, generation), self.rank, self.timeout_s)
        world = len(self.hosts.host_of)
        return CommGroup(self.rank, world, self.hosts, self.timeout_s, pairs=pairs)


class Rejoining(Protocol):
    """A worker's link to one server, as the watcher sees it (transport.RemoteLink)."""

    server: int
    generation: int
    lock: threading.RLock

    def reconnect(self, announcement: Announcement) -> None: ...


class Watcher:
    """A worker's thread that reconnects each link as soon as its server announces its
    return, whatever the main thread waits for meanwhile (another server's reply held for
    a worker that waits on this one, a collective of the workers): without it, a worker
    that has not noticed the death yet would keep the others waiting (see the module
    docstring). A link busy in the main thread is left to it."""

    def __init__(self, rejoin: Rejoin, links: Sequence[Rejoining]) -> None:
        self.rejoin, self.links = rejoin, list(links)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ps-rejoin", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(2 * POLL_S):
            for link in self.links:
                announcement = self.rejoin.announced(link.server, link.generation)
                if announcement is None or not link.lock.acquire(blocking=False):
                    continue
                try:
                    if announcement.generation > link.generation:
                        link.reconnect(announcement)
                except Exception as exc:  # the main thread meets it on its own, and says it
                    self.rejoin.log.warning("server %d: reconnecting failed: %s", link.server, exc)
                finally:
                    link.lock.release()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10 * POLL_S)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@dataclass
class LoggedPush:
    """One push message as sent (a push may come in several chunks)."""

    header: Header
    ids: torch.Tensor | None
    values: torch.Tensor | None


@dataclass
class PushLog:
    """The pushes a worker sent one server, by clock, since `start` (see the module
    docstring: kept back to the previous saved state)."""

    start: int = 0  # the oldest clock whose pushes are all here
    pushes: list[LoggedPush] = field(default_factory=list)
    _saved: list[int] = field(default_factory=list)  # clocks of the states written

    def add(self, header: Header, ids: torch.Tensor | None, values: torch.Tensor | None) -> None:
        copy = Header(
            header.op,
            header.sender,
            header.clock,
            header.entity_rows,
            header.relation_rows,
            more=header.more,
        )
        self.pushes.append(LoggedPush(copy, ids, values))

    def saved(self, clock: int) -> None:
        """A state of `clock` was written: forget the pushes before the state before it."""
        self._saved.append(clock)
        if len(self._saved) > 1:
            keep = self._saved[-2]
            self._saved = self._saved[-1:]
            self.pushes = [p for p in self.pushes if p.header.clock >= keep]
            self.start = max(self.start, keep)

    def since(self, clock: int, server: int, worker: int) -> list[LoggedPush]:
        """The pushes of clocks >= `clock`, in the order sent; JobFailed if the log starts
        later (the restarted server's state is older than what the worker kept)."""
        if clock < self.start:
            raise JobFailed(
                f"server {server} came back at clock {clock}, but worker {worker} kept its "
                f"pushes only from clock {self.start} on: the job restarts from its newest state"
            )
        return [p for p in self.pushes if p.header.clock >= clock]
