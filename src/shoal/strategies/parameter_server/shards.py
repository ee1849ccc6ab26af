"""A server's shard: its rows as the task's model starts, or read back from a checkpoint.

Initial rows come from the task's own model, built on the meta device after the
same seed as every other strategy: the task computes the rows of the ids a server
owns and only those (a row is a function of the model's key, the table and the
id), so `sync` starts where `local` starts, any number of servers and any
sharding start from the same table, and no server ever holds a row it does not
own. A server resuming from a checkpoint computes no initial row at all.

A checkpoint holds one file per server (`ps-shard-SSS-of-NNN.pt`: global ids,
rows, per-row optimizer state, the clock). On resume each server reads every
file and keeps the rows it owns now, so a different `num_servers` or sharding
re-shards; each file is memory-mapped, so only the pages of the rows taken are
read. The files are verified against the checkpoint's meta.json first. A row
missing from the files, or a table of another size, is a clear error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from shoal.checkpoint.integrity import load_tensors, verified_meta
from shoal.errors import ShoalError
from shoal.strategies.parameter_server.row_optimizers import RowOptimizer
from shoal.strategies.parameter_server.server import TABLES, TableShard
from shoal.strategies.parameter_server.sharding import local_index, shard_ids
from shoal.strategies.parameter_server.storage import MemoryStorage, ShardStorage

SHARD_GLOB = "ps-shard-*-of-*.pt"
#: initial rows are computed this many entries at a time (the temporaries stay small)
INIT_BLOCK_ENTRIES = 1 << 20


def build_shard(
    owners: np.ndarray,
    server: int,
    width: int,
    initial_rows: Callable[[torch.Tensor], torch.Tensor] | None,
    optimizer: RowOptimizer,
    storage: ShardStorage | None = None,
) -> TableShard:
    """This server's rows of a table of `width` columns, kept in `storage` (default: in
    memory): `initial_rows(ids)` for the ids it owns, computed a block at a time, or (None:
    a resume fills them from its checkpoint) left as the storage makes them."""
    storage = storage or MemoryStorage()
    ids = torch.from_numpy(shard_ids(owners, server))
    rows = storage.empty(len(ids), width)
    if initial_rows is not None:
        step = max(1, INIT_BLOCK_ENTRIES // max(width, 1))
        for start in range(0, len(ids), step):
            rows[start : start + step] = initial_rows(ids[start : start + step])
    state = optimizer.new_state(len(ids), width, storage.zeros)
    return TableShard(ids, local_index(owners, server), rows, state)


def load_shards(
    folder: Path, server: int, num_servers: int, tables: dict[str, TableShard], log: logging.Logger
) -> int:
    """Fill `tables` with their rows from the shard files in `folder`; returns the clock."""
    files = sorted(folder.glob(SHARD_GLOB))
    if not files:
        raise ShoalError(
            f"{folder}: no parameter-server shard files ({SHARD_GLOB}); this checkpoint was not "
            "written by strategy parameter_server"
        )
    verified_meta(folder, [f.name for f in files])  # a server reads no byte unchecked
    covered = {name: torch.zeros(len(t.ids), dtype=torch.bool) for name, t in tables.items()}
    clocks = set()
    saved_servers = set()
    for file in files:
        state = load_tensors(folder, file.name, mmap=True)  # pages of the rows it takes
        clocks.add(int(state["clock"]))
        saved_servers.add(int(state["num_servers"]))
        for name in TABLES:
            _take_rows(file, state, name, tables[name], covered[name])
    if len(clocks) != 1 or len(saved_servers) != 1 or len(files) != next(iter(saved_servers)):
        raise ShoalError(
            f"{folder}: the shard files do not belong together ({len(files)} files, clocks "
            f"{sorted(clocks)}, written by {sorted(saved_servers)} servers)"
        )
    for name, done in covered.items():
        if not bool(done.all()):
            missing = int(tables[name].ids[~done][0])
            raise ShoalError(f"{folder}: {name} row {missing} is in no shard file")
    log.info(
        "server %d: restored %s from %s (%d shard files%s)",
        server,
        ", ".join(f"{len(t.ids)} {n} rows" for n, t in tables.items()),
        folder,
        len(files),
        f", re-sharded from {len(files)} servers to {num_servers}"
        if len(files) != num_servers
        else "",
    )
    return next(iter(clocks))


def _take_rows(
    file: Path,
    state: dict[str, torch.Tensor],
    name: str,
    shard: TableShard,
    covered: torch.Tensor,
) -> None:
    ids = state[f"{name}.ids"]
    rows = state[f"{name}.rows"]
    if len(ids) and int(ids.max()) >= len(shard.index):
        raise ShoalError(
            f"{file}: {name} row {int(ids.max())} does not exist in this task's data "
            f"({len(shard.index)} rows); resume with the data the checkpoint was trained on"
        )
    if rows.shape[1:] != shard.rows.shape[1:]:
        raise ShoalError(
            f"{file}: {name} rows have width {tuple(rows.shape[1:])}, this model "
            f"{tuple(shard.rows.shape[1:])}; resume with the same model and dim"
        )
    mine = torch.from_numpy(shard.index[ids.numpy()] >= 0)
    at = torch.from_numpy(shard.index[ids[mine].numpy()])
    shard.rows[at] = rows[mine]
    covered[at] = True
    for key, value in shard.state.items():
        saved = state.get(f"{name}.state.{key}")
        if saved is not None and saved.shape[1:] == value.shape[1:]:
            value[at] = saved[mine]
