"""A worker's view of the sharded tables: route rows to their servers, pull, push, control.

A pull takes unique ids per table, splits them by owner (and into messages of
at most `max_message_rows` rows), sends every request at once and returns a
handle: the rows arrive while the worker computes, and `wait()` puts them back
in the order asked for. A push sends each server the gradients of its rows,
one push per server per clock even when it has none of them, because the
clocks are how servers know who is behind. Only the numbers the worker holds
are counted: `held_bytes` is the largest row buffer it ever held.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from shoal.strategies.parameter_server.host_rows import HostShard
from shoal.strategies.parameter_server.transport import Link, PendingReply, ServerRefused
from shoal.strategies.parameter_server.wire import Header, Op, decode_json


@dataclass
class ClientStats:
    pulls: int = 0
    pushes: int = 0
    rows_pulled: int = 0
    rows_pushed: int = 0
    bytes_received: int = 0
    wait_s: float = 0.0  # blocked waiting for pulled rows (barriers included)

    def as_list(self) -> list[float]:
        return [float(v) for v in self.__dict__.values()]


@dataclass
class _Part:
    server: int
    entity_at: torch.Tensor  # positions in the pulled entity ids
    relation_at: torch.Tensor
    reply: PendingReply


@dataclass
class PendingPull:
    """Rows on their way: `wait()` -> (entity rows, relation rows) in the order of the ids."""

    client: RowClient
    entity_ids: torch.Tensor
    relation_ids: torch.Tensor
    parts: list[_Part] = field(default_factory=list)
    #: rows read in place from the shards on this host (host_rows.py), put back at once
    entity: torch.Tensor | None = None
    relation: torch.Tensor | None = None

    def outputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.entity is None or self.relation is None:
            we, wr = self.client.widths
            self.entity = torch.empty(len(self.entity_ids), we)
            self.relation = torch.empty(len(self.relation_ids), wr)
        return self.entity, self.relation

    def wait(self) -> tuple[torch.Tensor, torch.Tensor]:
        client = self.client
        started = time.perf_counter()
        we, wr = client.widths
        entity, relation = self.outputs()
        refused: ServerRefused | None = None
        for part in self.parts:
            try:
                reply = part.reply.wait(client.timeout_s)
            except ServerRefused as exc:  # still take every other reply: their receives are
                refused = refused or exc  # posted, and must not catch later answers
                continue
            assert reply.values is not None
            n = len(part.entity_at)
            entity[part.entity_at] = reply.values[: n * we].view(n, we)
            relation[part.relation_at] = reply.values[n * we :].view(-1, wr)
            client.stats.bytes_received += reply.values.numel() * 4
        client.stats.wait_s += time.perf_counter() - started
        if refused is not None:
            raise refused
        client.note_held(entity, relation)
        return entity, relation


class RowClient:
    """Worker `worker`'s requests to every server; `owners[table][id]` routes a row."""

    def __init__(
        self,
        worker: int,
        links: list[Link],
        owners: dict[str, np.ndarray],
        widths: tuple[int, int],
        max_rows: int,
        timeout_s: float,
        host_shards: dict[int, HostShard] | None = None,
    ) -> None:
        self.worker = worker
        self.links = links
        #: servers whose shards this worker reads and updates in place (host_rows.py)
        self.host_shards = host_shards or {}
        self.owners = {name: torch.from_numpy(o.astype(np.int64)) for name, o in owners.items()}
        self.widths = widths
        self.max_rows = max_rows
        self.timeout_s = timeout_s
        self.stats = ClientStats()
        self.held_bytes = 0
        self._pushed = 0  # clocks pushed

    def resume_at(self, clock: int) -> None:
        """This worker has pushed `clock` clocks (a resumed run)."""
        self._pushed = clock

    def sent_bytes(self) -> int:
        """What this worker put on the wire to the servers (counted by their CommGroup; a
        co-located server's link sends nothing)."""
        groups = {id(link.peers): link.peers for link in self.links if link.peers is not None}
        return sum(group.sent_bytes for group in groups.values())

    def note_held(self, *tensors: torch.Tensor) -> None:
        held = sum(t.numel() * t.element_size() for t in tensors)
        self.held_bytes = max(self.held_bytes, held)

    def _by_server(
        self, entity_ids: torch.Tensor, relation_ids: torch.Tensor
    ) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        """(server, positions of its entity ids, positions of its relation ids), in chunks of
        at most max_rows rows."""
        entity_owner = self.owners["entity"][entity_ids]
        relation_owner = self.owners["relation"][relation_ids]
        out = []
        for server in range(len(self.links)):
            e_at = torch.nonzero(entity_owner == server).flatten()
            r_at = torch.nonzero(relation_owner == server).flatten()
            for start in range(0, max(len(e_at) + len(r_at), 1), self.max_rows):
                e_part = e_at[start : start + self.max_rows]
                r_start = max(0, start - len(e_at))
                r_part = r_at[r_start : r_start + self.max_rows - len(e_part)]
                out.append((server, e_part, r_part))
        return out

    # ------------------------------------------------------------ rows
    def pull(
        self, entity_ids: torch.Tensor, relation_ids: torch.Tensor, clock: int, fresh: bool = False
    ) -> PendingPull:
        """Ask for rows (unique ids) as of `clock`; `fresh`: after every push before it."""
        pending = PendingPull(self, entity_ids, relation_ids)
        for server, e_at, r_at in self._by_server(entity_ids, relation_ids):
            if not len(e_at) and not len(r_at):
                continue
            shard = self.host_shards.get(server)
            if shard is not None and not fresh:  # a fresh read waits for clocks: by message
                entity, relation = pending.outputs()
                entity[e_at], relation[r_at] = shard.read(entity_ids[e_at], relation_ids[r_at])
                self.stats.rows_pulled += len(e_at) + len(r_at)
                continue
            header = Header(Op.PULL, self.worker, clock, len(e_at), len(r_at), fresh=fresh)
            ids = torch.cat([entity_ids[e_at], relation_ids[r_at]])
            count = len(e_at) * self.widths[0] + len(r_at) * self.widths[1]
            reply = self.links[server].request(header, ids, b"", count)
            pending.parts.append(_Part(server, e_at, r_at, reply))
            self.stats.pulls += 1
            self.stats.rows_pulled += len(ids)
        return pending

    def push(
        self,
        entity_ids: torch.Tensor,
        entity_grads: torch.Tensor,
        relation_ids: torch.Tensor,
        relation_grads: torch.Tensor,
        clock: int,
    ) -> None:
        """Row gradients (unique ids) for `clock`: every server gets one push, in chunks whose
        `more` counts the chunks still to come (0: the push is complete)."""
        if clock != self._pushed:
            raise RuntimeError(f"push for clock {clock} after {self._pushed} pushes")
        for link in self.links:
            link.flush(self.timeout_s)  # the previous clock's buffers are free again
        by_server: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for server, e_at, r_at in self._by_server(entity_ids, relation_ids):
            by_server.setdefault(server, []).append((e_at, r_at))
        for server, shard in self.host_shards.items():
            # applied in place, whole; then a push without rows, so the clock advances
            # after the rows are in the shard
            e_at = torch.cat([e for e, _ in by_server[server]])
            r_at = torch.cat([r for _, r in by_server[server]])
            shard.apply(entity_ids[e_at], entity_grads[e_at], relation_ids[r_at],
                        relation_grads[r_at])  # fmt: skip
            self.stats.rows_pushed += len(e_at) + len(r_at)
            empty = torch.zeros(0, dtype=torch.int64)
            by_server[server] = [(empty, empty)]
        for server, chunks in by_server.items():
            for index, (e_at, r_at) in enumerate(chunks):
                remaining = len(chunks) - 1 - index
                header = Header(Op.PUSH, self.worker, clock, len(e_at), len(r_at), more=remaining)
                ids = torch.cat([entity_ids[e_at], relation_ids[r_at]])
                values = torch.cat(
                    [entity_grads[e_at].reshape(-1), relation_grads[r_at].reshape(-1)]
                )
                self.links[server].send(header, ids, values)
                self.stats.pushes += 1
                self.stats.rows_pushed += len(ids)
        self._pushed += 1
        for link in self.links:  # a server found gone: reconnect now that all have the clock
            link.heal()

    def saved(self, clock: int) -> None:
        """The servers wrote their state of `clock`: the links may forget older pushes."""
        for link in self.links:
            link.saved(clock)

    # ------------------------------------------------------------ control
    def control(self, op: Op, clock: int, blob: bytes = b"", fresh: bool = True) -> list[Any]:
        """Send `op` to every server and wait: their JSON answers (None where empty)."""
        pending = [
            link.request(Header(op, self.worker, clock, fresh=fresh), None, blob, 0)
            for link in self.links
        ]
        answers = []
        for reply in pending:
            got = reply.wait(self.timeout_s)
            answers.append(decode_json(got.blob) if got.blob else None)
        return answers

    def bye(self) -> None:
        for link in self.links:
            link.send(Header(Op.BYE, self.worker, self._pushed), None, None)
        for link in self.links:
            link.flush(self.timeout_s)
