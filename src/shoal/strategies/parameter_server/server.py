"""A shard server's state and rules: its rows, the workers' clocks, the requests it holds.

Transport-free (messages in, replies out), so the consistency rules are tested
without processes. Clocks: worker w's k-th push (k = 0, 1, ...) carries clock k,
and a pull for step c carries clock c. `applied` is how many clocks of pushes
are in the table for every worker still training (its minimum: the slowest).

- sync: a clock's pushes are summed and applied together once every worker's
  arrived, and a pull for clock c waits for `applied >= c`: data-parallel SGD on
  the global batch, and exact for every row optimizer.
- bounded (stale synchronous parallel, Ho et al., 2013): pushes applied on
  arrival; a pull for clock c waits until c - applied <= max_staleness.
- async: pushes applied on arrival, pulls answered on arrival.

A worker's answered requests are answered in the order it sent them, refusals
included (its replies then arrive in the order it waits for them); pushes never
wait. A request held longer than the barrier timeout is answered with an error
naming the workers it waited for. `fresh` requests (evaluation pulls,
checkpoints, snapshots) wait for every push up to their clock in every mode, so
they see a consistent table.

A refused request is answered with the reason and changes nothing. A refused push
cannot be answered (pushes get no reply) and leaves a hole in that worker's clocks,
so the worker is refused from then on: its next request is answered with the
reason, and a pull held for it names it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from shoal.checkpoint.atomic import atomic_write_stream
from shoal.errors import PeerFailed, ShoalError
from shoal.strategies.parameter_server.row_optimizers import RowOptimizer
from shoal.strategies.parameter_server.storage import MemoryStorage, ShardStorage
from shoal.strategies.parameter_server.wire import (
    ANSWERED,
    REQUESTS,
    Header,
    Message,
    Op,
    WireError,
)

TABLES = ("entity", "relation")


class ShardLoader(Protocol):
    """Fills tables with their rows from a checkpoint folder's shard files; its clock."""

    def __call__(self, folder: Path, tables: dict[str, TableShard]) -> int: ...


@dataclass
class TableShard:
    """The rows of one table that this server owns, in ascending id order, with their state."""

    ids: torch.Tensor
    index: np.ndarray  # global id -> position here, -1 where another server owns the row
    rows: torch.Tensor
    state: dict[str, torch.Tensor]

    def positions(self, ids: torch.Tensor, table: str) -> torch.Tensor:
        """Positions of global `ids`; WireError for an id out of range or owned elsewhere."""
        raw = ids.numpy()
        if len(raw) and (raw.min() < 0 or raw.max() >= len(self.index)):
            raise WireError(f"{table} id out of range [0, {len(self.index)})")
        local = self.index[raw]
        if len(local) and local.min() < 0:
            bad = int(raw[int(np.argmin(local))])
            raise WireError(f"{table} row {bad} is not owned by this server")
        return torch.from_numpy(local)

    @property
    def width(self) -> int:
        return int(self.rows.shape[1])


@dataclass
class Reply:
    worker: int
    header: Header
    values: torch.Tensor | None = None
    blob: bytes = b""


@dataclass
class ServerStats:
    """Cumulative counts; workers turn two readings into rates."""

    pulls: int = 0
    pushes: int = 0
    rows_pulled: int = 0
    rows_pushed: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    apply_s: float = 0.0
    held_s: float = 0.0
    rejected: int = 0
    #: how far building the shard raised the server's resident set (None: not measured)
    build_peak_bytes: int | None = None
    staleness: collections.Counter[int] = field(default_factory=collections.Counter)

    def as_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "staleness"}
        out["staleness"] = {str(k): v for k, v in sorted(self.staleness.items())}
        return out


@dataclass
class _Held:
    message: Message
    since: float
    error: str | None = None  # a refused request: answered with this, in its turn


class ShardServer:
    """Server `index` of `num_servers`: applies pushes, answers pulls under the mode's rule."""

    def __init__(
        self,
        index: int,
        num_servers: int,
        num_workers: int,
        tables: dict[str, TableShard],
        optimizer: RowOptimizer,
        mode: str,
        bound: int | None,
        barrier_timeout_s: float,
        save_root: Path | None = None,
        log: logging.Logger | None = None,
        storage: ShardStorage | None = None,
        load_files: ShardLoader | None = None,
    ) -> None:
        self.index = index
        self.log = log or logging.getLogger(__name__)
        self.save_root = save_root.resolve() if save_root is not None else None
        self.num_servers = num_servers
        self.num_workers = num_workers
        self.tables = tables
        #: where the rows live; a snapshot of the best model is kept there too
        self.storage = storage or MemoryStorage()
        self.optimizer = optimizer
        self.mode = mode
        self.bound = bound
        self.barrier_timeout_s = barrier_timeout_s
        self.received = [0] * num_workers  # pushes received from each worker
        self.finished = [False] * num_workers
        self.sync_clock = 0  # sync: clocks fully applied
        self._sync_pending: dict[int, list[Message]] = collections.defaultdict(list)
        self._sync_count: collections.Counter[int] = collections.Counter()
        self._partial: dict[int, list[Message]] = collections.defaultdict(list)
        self._queues: list[collections.deque[_Held]] = [
            collections.deque() for _ in range(num_workers)
        ]
        self._snapshot: dict[str, tuple[torch.Tensor, dict[str, torch.Tensor]]] | None = None
        self.snapshot_clock: int | None = None  # the clock of `_snapshot` (the best model's)
        #: reads a checkpoint folder's shard files into tables (shards.load_shards): the
        #: best model when this process holds no snapshot of it (see `_restore`)
        self.load_files = load_files
        self.refused: dict[int, str] = {}  # worker -> why its pushes are no longer taken
        self.stats = ServerStats()

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Held around every read and update of the rows: the shard's lock when workers of
        this host share its memory (host_rows.py), else nothing (one thread uses them)."""
        lock = getattr(self.storage, "lock", None)
        return lock.held() if lock is not None else contextlib.nullcontext()

    # ------------------------------------------------------------ clocks
    def applied(self) -> float:
        """Clocks of pushes in the table for the slowest worker still training (inf: none)."""
        if self.mode == "sync":
            return math.inf if all(self.finished) else self.sync_clock
        active = [c for c, done in zip(self.received, self.finished, strict=True) if not done]
        return min(active) if active else math.inf

    def slowest(self) -> list[int]:
        """The workers still training with the fewest pushes: who held requests wait for."""
        active = [w for w in range(self.num_workers) if not self.finished[w]]
        low = min((self.received[w] for w in active), default=0)
        return [w for w in active if self.received[w] == low]

    def _ready(self, held: _Held) -> bool:
        header = held.message.header
        if held.error is not None:
            return True
        applied = self.applied()
        if header.fresh:
            return applied >= header.clock
        if header.op != Op.PULL:  # statistics: answered in turn, never held
            return True
        return self.bound is None or header.clock - applied <= self.bound

    def resume_at(self, clock: int) -> None:
        """Every worker has pushed `clock` clocks (a run resumed from a checkpoint of then)."""
        self.received = [clock] * self.num_workers
        self.sync_clock = clock

    # ------------------------------------------------------------ messages
    def receive(self, message: Message, now: float) -> list[Reply]:
        """Take one request; return the replies it releases (to it or to held requests).

        WireError only for a message that names no worker or no request: who sent it is
        answered at once. Every other refusal is answered in the worker's turn."""
        header = message.header
        worker = header.sender
        if not 0 <= worker < self.num_workers:
            raise WireError(f"sender {worker} is not a worker index (0..{self.num_workers - 1})")
        if header.op not in REQUESTS:
            raise WireError(f"op {header.op.name} is not a request")
        if header.op == Op.BYE:
            self.finished[worker] = True
            return self._release(now)
        try:
            if self.finished[worker]:
                raise WireError(f"worker {worker} already said goodbye")
            if worker in self.refused:
                raise WireError(self.refused[worker])
            self._check(message)
        except WireError as exc:
            return self.reject(header, str(exc), now)
        if header.op == Op.PUSH:
            self._push(message)
        else:
            self._queues[worker].append(_Held(message, now))
        return self._release(now)

    def reject(self, header: Header, reason: str, now: float) -> list[Reply]:
        """Refuse worker `header.sender`'s request: answered in its turn with `reason`; a
        refused push refuses the worker from then on (see the module docstring)."""
        worker = header.sender
        self.stats.rejected += 1
        self.log.warning(
            "server %d: refused worker %d's %s (seq %d): %s",
            self.index,
            worker,
            header.op.name.lower(),
            header.seq,
            reason,
        )
        if header.op == Op.PUSH and worker not in self.refused:
            self._partial.pop(worker, None)
            self.refused[worker] = (
                f"server {self.index} refused worker {worker}'s push for clock {header.clock} "
                f"({reason}), so its clocks are broken and it is refused from then on"
            )
        if header.op in ANSWERED:
            self._queues[worker].append(_Held(Message(header, worker), now, reason))
        return self._release(now)

    def _check(self, message: Message) -> None:
        """A request's fields against each other and against this shard, before it is held
        or applied: WireError says what is wrong."""
        header = message.header
        if header.rows and header.op not in (Op.PULL, Op.PUSH):
            raise WireError(f"a {header.op.name.lower()} carries no row ids")
        if header.more and header.op != Op.PUSH:
            raise WireError("only a push comes in chunks")
        if header.fresh and header.op not in ANSWERED:
            raise WireError("only an answered request can be fresh")
        if message.blob and header.op not in (Op.SAVE, Op.RESTORE):
            raise WireError(f"a {header.op.name.lower()} carries no blob")
        if len(message.ids) != header.rows:
            raise WireError(f"{len(message.ids)} row ids where the header says {header.rows}")
        parts = self._split(message)
        for name, ids in parts.items():
            self.tables[name].positions(ids, name)
        expected = 0
        if header.op == Op.PUSH:
            widths = self.tables["entity"].width, self.tables["relation"].width
            expected = header.entity_rows * widths[0] + header.relation_rows * widths[1]
            for name, ids in parts.items():  # unique: the optimizers update each row once
                if len(ids) > 1 and not bool((ids[1:] > ids[:-1]).all()):
                    raise WireError(f"{name} ids of a push must be unique and ascending")
            if not bool(torch.isfinite(message.values).all()):
                raise WireError("non-finite values (NaN/Inf) in a push")
            if header.clock != self.received[header.sender]:
                raise WireError(
                    f"push for clock {header.clock} from worker {header.sender}, which has "
                    f"pushed {self.received[header.sender]} clocks (pushes must come in clock "
                    "order)"
                )
        if message.values.numel() != expected:
            raise WireError(
                f"{message.values.numel()} values in a {header.op.name.lower()} of "
                f"{header.entity_rows} + {header.relation_rows} rows (expected {expected})"
            )

    def expire(self, now: float) -> list[Reply]:
        """Fail the requests held longer than the barrier timeout, naming who they waited for."""
        replies = []
        for worker, queue in enumerate(self._queues):
            if queue and now - queue[0].since > self.barrier_timeout_s:
                held = queue.popleft()
                slowest = self.slowest()
                waiting_for = ", ".join(
                    f"worker {w} (at clock {self.received[w]})" for w in slowest
                )
                why = "which stopped pushing"
                refused = [self.refused[w] for w in slowest if w in self.refused]
                if refused:
                    why = "; " + "; ".join(refused)
                text = (
                    f"server {self.index}: worker {worker}'s {held.message.header.op.name.lower()}"
                    f" for clock {held.message.header.clock} waited "
                    f"{now - held.since:.1f} s (strategy.barrier_timeout_s = "
                    f"{self.barrier_timeout_s:g}) for {waiting_for}, {why}"
                )
                replies.append(error_reply(self.index, worker, held.message.header, text))
        return replies

    def next_deadline(self) -> float | None:
        heads = [q[0].since for q in self._queues if q]
        return min(heads) + self.barrier_timeout_s if heads else None

    def _release(self, now: float) -> list[Reply]:
        replies = []
        for queue in self._queues:
            while queue and self._ready(queue[0]):
                held = queue.popleft()
                header = held.message.header
                if held.error is not None:
                    replies.append(error_reply(self.index, header.sender, header, held.error))
                    continue
                self.stats.held_s += now - held.since
                try:
                    replies.append(self._answer(held.message))
                except WireError as exc:  # answered with the error; the others still served
                    self.stats.rejected += 1
                    replies.append(error_reply(self.index, header.sender, header, str(exc)))
        return replies

    # ------------------------------------------------------------ operations
    def _split(self, message: Message) -> dict[str, torch.Tensor]:
        n = message.header.entity_rows
        return {"entity": message.ids[:n], "relation": message.ids[n:]}

    def _push(self, message: Message) -> None:
        """A push may come in chunks; `more` counts the chunks still to come (0: complete).
        Checked (`_check`) before it gets here."""
        header, worker = message.header, message.header.sender
        self.stats.rows_pushed += header.rows
        self.stats.bytes_in += message.values.numel() * 4 + message.ids.numel() * 8
        self._partial[worker].append(message)
        if header.more > 0:
            return
        parts = self._partial.pop(worker)
        self.received[worker] += 1
        self.stats.pushes += 1
        if self.mode != "sync":
            self._apply(parts)
            return
        self._sync_pending[header.clock].extend(parts)
        self._sync_count[header.clock] += 1
        if self._sync_count[header.clock] == self.num_workers:
            del self._sync_count[header.clock]
            # in worker order, not arrival order: a float sum of three or more terms depends
            # on their order, and identical runs must end bit-identical (the sort is stable:
            # a worker's chunks stay in sending order)
            parts = sorted(self._sync_pending.pop(header.clock), key=lambda m: m.header.sender)
            self._apply(parts)
            self.sync_clock += 1

    def _apply(self, messages: list[Message]) -> None:
        """Sum the pushes per row (a row may come from several workers) and update once."""
        started = time.perf_counter()
        with self.locked():
            self._apply_tables(messages)
        self.stats.apply_s += time.perf_counter() - started

    def _apply_tables(self, messages: list[Message]) -> None:
        for name in TABLES:
            shard = self.tables[name]
            ids, grads = [], []
            for message in messages:
                n = message.header.entity_rows
                width = shard.width
                if name == "entity":
                    part_ids = message.ids[:n]
                    part = message.values[: n * width]
                else:
                    part_ids = message.ids[n:]
                    part = message.values[n * self.tables["entity"].width :]
                ids.append(part_ids)
                grads.append(part.view(-1, width))
            all_ids = torch.cat(ids)
            if not len(all_ids):
                continue
            if len(messages) == 1:  # one worker's push: its ids are unique already
                unique, summed = all_ids, grads[0]
            else:
                unique, inverse = torch.unique(all_ids, return_inverse=True)
                summed = torch.zeros(len(unique), shard.width)
                summed.index_add_(0, inverse, torch.cat(grads))
            self.optimizer.apply(shard.rows, shard.state, shard.positions(unique, name), summed)

    def _answer(self, message: Message) -> Reply:
        header = message.header
        reply = Header(Op.REPLY, self.index, header.clock, seq=header.seq)
        if header.op == Op.PULL:
            at = {name: self.tables[name].positions(ids, name)
                  for name, ids in self._split(message).items()}  # fmt: skip
            with self.locked():
                values = torch.cat([self.tables[n].rows[a].reshape(-1) for n, a in at.items()])
            reply.entity_rows, reply.relation_rows = header.entity_rows, header.relation_rows
            self.stats.pulls += 1
            self.stats.rows_pulled += header.rows
            self.stats.bytes_out += values.numel() * 4
            if not header.fresh:
                self.stats.staleness[max(0, int(header.clock - min(self.applied(), 1 << 62)))] += 1
            return Reply(header.sender, reply, values)
        if header.op == Op.SAVE:
            with self.locked():
                blob = self._save(message.blob, header.clock)
            return Reply(header.sender, reply, blob=blob)
        if header.op == Op.SNAPSHOT:
            if self._snapshot is None:  # made once, where the rows live, then overwritten
                self._snapshot = {
                    name: (self._like(t.rows), {k: self._like(v) for k, v in t.state.items()})
                    for name, t in self.tables.items()
                }
            with self.locked():
                for name, t in self.tables.items():
                    rows, state = self._snapshot[name]
                    rows.copy_(t.rows)
                    for key, value in t.state.items():
                        state[key].copy_(value)
            self.snapshot_clock = header.clock
        elif header.op == Op.RESTORE:
            with self.locked():
                blob = self._restore(message.blob)
            return Reply(header.sender, reply, blob=blob)
        elif header.op == Op.STATS:
            stats = {**self.stats.as_json(), "snapshot_clock": self.snapshot_clock}
            return Reply(header.sender, reply, blob=json.dumps(stats).encode())
        return Reply(header.sender, reply)

    def _like(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.storage.empty(*tensor.shape)

    def _restore(self, blob: bytes) -> bytes:
        """Put the best model back: `blob` names its clock and the checkpoint folder that
        holds it (`best/step-N`, "" if none). From the snapshot in memory when it is of that
        clock; else from the folder's shard files: this server was restarted (alone, or
        with the job) after the best evaluation, and the snapshot died with its process.
        The newest checkpoint or in-memory state it came back from may be older than the
        best evaluation, and the workers replay pushes, not snapshots: the best model
        survives a restart only on disk (`checkpoint.keep_best`, which writes it at each
        improvement). Answers where the rows came from; WireError (and no row changed)
        when neither holds them."""
        try:
            asked = json.loads(blob)
            clock, folder = int(asked["clock"]), str(asked["folder"])
        except (ValueError, KeyError, TypeError) as exc:
            raise WireError(f"a restore names a clock and a folder: {exc}") from None
        if self._snapshot is not None and self.snapshot_clock == clock:
            for name, (rows, state) in self._snapshot.items():
                self.tables[name].rows.copy_(rows)
                for key, value in state.items():
                    self.tables[name].state[key].copy_(value)
            return json.dumps({"restored": "memory"}).encode()
        if not folder or self.load_files is None:
            raise WireError(
                f"server {self.index} holds no snapshot of clock {clock} (it was restarted "
                "after that evaluation) and no best checkpoint was written (checkpoint."
                "keep_best = false)"
            )
        target = self._inside_run(folder)
        copies = {name: dataclasses.replace(t, rows=t.rows.clone(),
                                            state={k: v.clone() for k, v in t.state.items()})
                  for name, t in self.tables.items()}  # fmt: skip
        try:
            saved = self.load_files(target, copies)
        except ShoalError as exc:
            raise WireError(f"server {self.index}: the best model: {exc}") from None
        if saved != clock:
            raise WireError(f"{folder} holds clock {saved}, not the best model's {clock}")
        for name, copy in copies.items():
            self.tables[name].rows.copy_(copy.rows)
            for key, value in copy.state.items():
                self.tables[name].state[key].copy_(value)
        self.log.info("server %d: the best model (clock %d) restored from %s", self.index,
                      clock, folder)  # fmt: skip
        return json.dumps({"restored": "disk"}).encode()

    def _inside_run(self, folder: str) -> Path:
        """`folder` resolved, if it lies inside the run directory (it comes from a message: a
        peer must not make a server read or write elsewhere); WireError if not."""
        try:
            target = Path(folder).resolve()
        except (ValueError, OSError) as exc:
            raise WireError(f"not a folder name: {exc}") from None
        if self.save_root is None or not target.is_relative_to(self.save_root):
            raise WireError(f"refusing a folder outside the run directory: {folder}")
        return target

    # ------------------------------------------------------------ checkpoints
    def shard_state(self, clock: int) -> dict[str, torch.Tensor]:
        state: dict[str, torch.Tensor] = {}
        for name, shard in self.tables.items():
            state[f"{name}.ids"] = shard.ids
            state[f"{name}.rows"] = shard.rows
            for key, value in shard.state.items():
                state[f"{name}.state.{key}"] = value
        state["num_servers"] = torch.tensor(self.num_servers)
        state["clock"] = torch.tensor(clock)
        state["optimizer"] = torch.frombuffer(
            bytearray(self.optimizer.config.kind.encode()), dtype=torch.uint8
        )
        return state

    def _save(self, blob: bytes, clock: int) -> bytes:
        """Write this shard into the folder `blob` names, atomically; answer its file name and
        checksum.

        The folder comes from a message: it must lie inside the run directory, or a peer
        could make the server write wherever it may."""
        try:
            folder = blob.decode()
        except UnicodeDecodeError as exc:
            raise WireError(f"not a folder name: {exc}") from None
        target = self._inside_run(folder)
        name = shard_file_name(self.index, self.num_servers)
        state = self.shard_state(clock)
        try:  # streamed: a shard in files (storage.py) may be larger than memory
            digest = atomic_write_stream(Path(folder) / name, lambda f: torch.save(state, f))
        except FileNotFoundError as exc:
            if target.exists():
                raise
            raise PeerFailed(
                f"server {self.index}: the checkpoint folder {folder} was removed while this "
                "server wrote its shard: the worker that asked for it gave the save up (another "
                "rank failed)"
            ) from exc
        return json.dumps({"file": name, "sha256": digest}).encode()


def shard_file_name(index: int, num_servers: int) -> str:
    return f"ps-shard-{index:03d}-of-{num_servers:03d}.pt"


def error_reply(server: int, worker: int, request: Header, text: str) -> Reply:
    """`text` for `request`. A pull's reply always has a values message, an error's too (one
    float): the worker posted that receive with its request, and a receive left without its
    message would take the rows of the next reply."""
    blob = text.encode()[: 1 << 15]
    header = Header(Op.ERROR, server, request.clock, seq=request.seq, blob_len=len(blob))
    values = torch.zeros(1) if request.op == Op.PULL and request.rows else None
    return Reply(worker, header, values, blob=blob)
