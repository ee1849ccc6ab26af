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
sealed when the server died is never needed), and on reconnecting re-sends those
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
server fails (gloo reports the closed connection within about a second). It
then waits for the announcement, at most `faults.start_timeout_s` (the time a
process may take to start), and fails naming the server if none comes. The
reconnection itself waits for no other worker, so a worker in it holds up
nobody: every worker pushes to every server each clock (a push to a dead server
is kept in the log, not waited for), then reconnects. One case it cannot break:
a worker blocked on another server's reply that needs a push of a worker which
itself waits on the restarted server for a pull that needs the first worker's
replay. The other server answers that held pull with an error after
`strategy.barrier_timeout_s` and the launcher restarts the whole job (exact).
With one server, or a server killed where the workers' pulls of a clock are
answered together, it does not arise.

Co-located servers are not restarted alone: they share the process of a worker,
whose state is then gone too (the launcher restarts the job and says why).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from shoal.comm.links import CommGroup, PairGroups, PeerTimeout
from shoal.errors import JobFailed
from shoal.runtime.hosts import Hosts
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

    def wait_for(
        self, server: int, rank: int, after: int, cause: BaseException
    ) -> tuple[Announcement, CommGroup]:
        """The announcement of server `server` (on `rank`) newer than generation `after`,
        and the pairs to it; PeerTimeout naming the server if it does not come back."""
        deadline = time.monotonic() + self.wait_s
        key = announce_key(server)
        while True:
            if self.store.check([key]):
                announcement = Announcement.decode(self.store.get(key))
                if announcement.generation > after:
                    break
            if time.monotonic() >= deadline:
                raise PeerTimeout(
                    f"server {server} (rank {rank}) failed ({_first_line(cause)}) and did not "
                    f"come back within {self.wait_s:g} s (faults.start_timeout_s); rank "
                    f"{self.rank} waited for it"
                )
            time.sleep(POLL_S)
        pairs = PairGroups(
            self.store, pairs_prefix(server, announcement.generation), self.rank, self.timeout_s
        )
        world = len(self.hosts.host_of)
        return announcement, CommGroup(self.rank, world, self.hosts, self.timeout_s, pairs=pairs)


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
