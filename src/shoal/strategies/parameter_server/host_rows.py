"""Rows shared on one host: workers read and update the shards of their host's servers in place.

Under `async` a push is applied when it arrives and a pull answered when it
arrives, so a worker on the same machine as a server gains nothing from sending
its rows through the server: it can take them from the shard's memory and apply
its own gradients there, as PyTorch-BigGraph's Hogwild workers do. That removes,
for every server on the worker's host, the pull request and reply, the push and
its payload, the receive thread's copy and the server thread's turn; only
servers on other hosts still get rows by message.

How it stays the parameter server's `async`:

- A shard of a server with workers on its host is a set of files (`SharedStorage`:
  in `/dev/shm`, or in `strategy.shard_dir` when the tables live on disk) that
  the server and those workers map. The server publishes their names in the
  job's store; each worker maps them, and the last of the host's workers to map
  them unlinks them: from then on nothing is left behind, however the job ends.
- Every read and every update of a shard, by its server's thread or by a worker,
  holds the shard's lock (`ShardLock`: a thread lock and an `flock` on a file of
  the shard), so a push is applied whole and a read never sees half of one:
  what `async` promises by handling one message at a time. Workers on a host
  never lose an update to one another (Hogwild's races are not taken).
- A worker still sends each server one push per clock, without rows: the
  server's clocks are what evaluation reads, checkpoints and the best model's
  snapshot wait for (`fresh` requests, which stay messages), and the rows of that
  clock are in the shard before its push is sent.

Not shared: `sync` and `bounded` (a pull waits for other workers' pushes, which
only the server sees), `lazy_adam` (its step count t is the server's), and
servers that restart alone (a worker would keep the old server's memory).
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shoal.errors import ShoalError
from shoal.strategies.parameter_server.row_optimizers import RowOptimizer
from shoal.strategies.parameter_server.storage import FileStorage, map_file, zeros_file

#: where a shard's files go when the tables are in memory (a tmpfs: RAM, shared)
SHARED_MEMORY_DIR = Path("/dev/shm")


class ShardLock:
    """Mutual exclusion over one shard between the threads of this process (a thread
    lock) and the processes that map it (`flock` on the shard's lock file, through a
    descriptor of this process's own: flock excludes open files, not threads)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._thread = threading.Lock()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._thread:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._fd)


class SharedStorage:
    """A shard's tensors as shared mappings of named files in a folder of its own, which
    the workers of the server's host map too (see the module docstring)."""

    shared = True

    def __init__(self, parent: Path, label: str) -> None:
        parent.mkdir(parents=True, exist_ok=True)
        self.folder = Path(tempfile.mkdtemp(prefix=f"shoal-{label}-", dir=parent))
        self.bytes = 0
        self.files: list[tuple[str, tuple[int, ...]]] = []
        self.lock = ShardLock(self.folder / "lock")
        #: tensors made after the shard is published (the best model's snapshot) are the
        #: server's alone: unlinked files beside the shared ones, as `shard_dir` makes them
        self.private: FileStorage | None = None
        self._parent, self._label = parent, label

    def seal(self) -> None:
        """The shard is complete and about to be published: later tensors are private."""
        self.private = FileStorage(self._parent, self._label)

    def zeros(self, *shape: int) -> torch.Tensor:
        if self.private is not None:
            return self.private.zeros(*shape)
        name = f"t{len(self.files)}.f32"
        tensor = zeros_file(self.folder / name, shape)
        self.files.append((name, tuple(shape)))
        self.bytes += tensor.numel() * 4
        return tensor

    def empty(self, *shape: int) -> torch.Tensor:
        return self.zeros(*shape)

    def describe(self) -> str:
        return (
            f"shared with the workers of its host, files in {self.folder} "
            f"({self.bytes / (1 << 20):.1f} MiB)"
        )

    def unlink(self) -> None:
        """Remove the files (mappings stay valid); safe to call twice."""
        remove(self.folder, [name for name, _ in self.files])


def remove(folder: Path, files: list[str]) -> None:
    """Unlink a shared shard's files, its lock and its folder (what is gone already is
    skipped: the server and its host's last worker both clean up)."""
    for name in [*files, "lock"]:
        (folder / name).unlink(missing_ok=True)
    with suppress(OSError):  # not empty: left as it is
        folder.rmdir()


def room_for(folder: Path, nbytes: int) -> bool:
    """Whether the file system of `folder` has `nbytes` free (a tmpfs that fills up
    kills the process writing the page with SIGBUS, so this is checked first)."""
    folder.mkdir(parents=True, exist_ok=True)
    stats = os.statvfs(folder)
    return stats.f_bavail * stats.f_frsize >= nbytes


# ---------------------------------------------------------------- publishing
def description(tables: dict[str, Any], storage: SharedStorage) -> bytes:
    """What a worker needs to map a server's shard: each table's rows and state, by file."""
    where = {id(t): name for name, t in _file_tensors(tables, storage)}
    out: dict[str, Any] = {"folder": str(storage.folder), "tables": {}}
    for name, shard in tables.items():
        out["tables"][name] = {
            "rows": where[id(shard.rows)],
            "shape": list(shard.rows.shape),
            "state": {
                key: [where[id(value)], list(value.shape)] for key, value in shard.state.items()
            },
        }
    out["files"] = [name for name, _ in storage.files]
    return json.dumps(out).encode()


def _file_tensors(tables: dict[str, Any], storage: SharedStorage) -> list[tuple[str, Any]]:
    """(file name, tensor) of every tensor of `tables`, in the order storage made them."""
    tensors = []
    for shard in tables.values():
        tensors.append(shard.rows)
        tensors.extend(shard.state.values())
    if len(tensors) != len(storage.files):
        raise ShoalError("a shared shard's tensors do not match its files")
    return [(name, t) for (name, _), t in zip(storage.files, tensors, strict=True)]


def store_key(restart: int, server: int, what: str) -> str:
    return f"shoal/ps-host-rows/{restart}/{server}/{what}"


def wait_for_key(store: Any, key: str, timeout_s: float, who: str) -> bytes:
    """The value of `key` once set; ShoalError naming `who` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not store.check([key]):
        if time.monotonic() > deadline:
            raise ShoalError(
                f"{who} did not share its rows within {timeout_s:g} s "
                "(faults.start_timeout_s): it failed or is still building its shard"
            )
        time.sleep(0.05)
    return bytes(store.get(key))


@dataclass
class _Table:
    rows: torch.Tensor
    state: dict[str, torch.Tensor]
    index: np.ndarray  # global id -> position in its owner's shard (sharding.owner_positions)


class HostShard:
    """A worker's mapping of one server's shard on its host: reads and updates in place."""

    def __init__(
        self,
        server: int,
        blob: bytes,
        index: dict[str, np.ndarray],
        optimizer: RowOptimizer,
    ) -> None:
        self.server = server
        info = json.loads(blob)
        self.folder = Path(info["folder"])
        self.files = list(info["files"])
        self.optimizer = optimizer
        self.tables: dict[str, _Table] = {}
        for name, table in info["tables"].items():
            rows = map_file(self.folder / table["rows"], tuple(table["shape"]))
            state = {
                key: map_file(self.folder / file, tuple(shape))
                for key, (file, shape) in table["state"].items()
            }
            self.tables[name] = _Table(rows, state, index[name])
        self.lock = ShardLock(self.folder / "lock")

    def unlink(self) -> None:
        """The host's last worker to map the shard removes its files (mappings stay)."""
        remove(self.folder, self.files)

    def _positions(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        """Positions of ids this server owns (the client routes only those here)."""
        return torch.from_numpy(self.tables[name].index[ids.numpy()].astype(np.int64))

    def read(
        self, entity_ids: torch.Tensor, relation_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of (unique) ids this server owns, as one consistent read."""
        e_at = self._positions("entity", entity_ids)
        r_at = self._positions("relation", relation_ids)
        with self.lock.held():
            entity = self.tables["entity"].rows.index_select(0, e_at)
            relation = self.tables["relation"].rows.index_select(0, r_at)
        return entity, relation

    def apply(
        self,
        entity_ids: torch.Tensor,
        entity_grads: torch.Tensor,
        relation_ids: torch.Tensor,
        relation_grads: torch.Tensor,
    ) -> None:
        """One worker's row gradients (unique ids), applied whole under the shard's lock,
        by the server's optimizer (the same arithmetic as the server's own apply)."""
        parts = []
        for name, ids, grads in (
            ("entity", entity_ids, entity_grads),
            ("relation", relation_ids, relation_grads),
        ):
            if len(ids):
                parts.append((self.tables[name], self._positions(name, ids), grads))
        if not parts:
            return
        with self.lock.held():
            for table, at, grads in parts:
                self.optimizer.apply(table.rows, table.state, at, grads)

    def close(self) -> None:
        self.lock.close()
