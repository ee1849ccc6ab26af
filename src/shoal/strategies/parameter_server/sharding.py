"""Which server owns a row: every row of every table is owned by exactly one server.

Both sides compute the same owner array once (a worker to route its requests, a
server to lay out its shard): `owners[id]` is the server of row `id`. It costs 4
bytes per row, far less than the row itself (a dim-200 float32 row is 800 bytes),
and makes a user partition as cheap to route as a hash. A server keeps its rows
in id order; `local_index` maps a global id to its position in the shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from shoal.errors import DataError
from shoal.strategies.parameter_server.config import (
    FileShardingConfig,
    RangeShardingConfig,
    ShardingConfig,
)
from shoal.textfile import read_text

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)


def hash_owners(num_rows: int, num_servers: int) -> np.ndarray:
    """Owner by a multiplicative mix of the id: consecutive ids land on different servers."""
    with np.errstate(over="ignore"):
        x = np.arange(num_rows, dtype=np.uint64) * _GOLDEN
        x = (x ^ (x >> np.uint64(31))) * _M1
        x = x ^ (x >> np.uint64(29))
    return (x % np.uint64(num_servers)).astype(np.int32)


def range_owners(num_rows: int, num_servers: int) -> np.ndarray:
    """Contiguous ranges whose sizes differ by at most one, server 0 first."""
    base, extra = divmod(num_rows, num_servers)
    sizes = [base + (1 if s < extra else 0) for s in range(num_servers)]
    return np.repeat(np.arange(num_servers, dtype=np.int32), sizes)


def _as_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def file_owners(path: str, names: Sequence[str], num_servers: int) -> np.ndarray:
    """Owners from `entity<TAB>server` lines; every name must appear exactly once."""
    index = {name: i for i, name in enumerate(names)}
    owners = np.full(len(names), -1, dtype=np.int32)
    text = read_text(Path(path), "expected 'entity<TAB>server' lines")
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        parts = line.split("\t")
        where = f"{path}:{number}"
        name, server = parts[0].strip(), _as_int(parts[1]) if len(parts) == 2 else None
        if server is None:
            raise DataError(f"{where}: expected 'entity<TAB>server', got {line.strip()!r}")
        if name not in index:
            raise DataError(f"{where}: entity {name!r} is not in the training data")
        if not 0 <= server < num_servers:
            raise DataError(
                f"{where}: server {server} is out of range for num_servers = {num_servers}"
            )
        if owners[index[name]] >= 0:
            raise DataError(f"{where}: entity {name!r} is listed twice")
        owners[index[name]] = server
    missing = np.flatnonzero(owners < 0)
    if len(missing):
        raise DataError(
            f"{path}: {len(missing)} entities have no server, e.g. {names[int(missing[0])]!r}; "
            "list every training entity once"
        )
    return owners


def table_owners(
    config: ShardingConfig, num_servers: int, names: Sequence[str], relation: bool
) -> np.ndarray:
    """The owner of each row of a table (`names` its row names)."""
    if isinstance(config, RangeShardingConfig):
        return range_owners(len(names), num_servers)
    if isinstance(config, FileShardingConfig) and not relation:
        return file_owners(config.path, names, num_servers)
    return hash_owners(len(names), num_servers)


def shard_ids(owners: np.ndarray, server: int) -> np.ndarray:
    """The global ids server `server` owns, ascending."""
    return np.flatnonzero(owners == server).astype(np.int64)


def local_index(owners: np.ndarray, server: int) -> np.ndarray:
    """global id -> position in server `server`'s shard (-1 for a row it does not own)."""
    index = np.full(len(owners), -1, dtype=np.int64)
    ids = shard_ids(owners, server)
    index[ids] = np.arange(len(ids))
    return index


def owner_positions(owners: np.ndarray) -> np.ndarray:
    """global id -> its position in its owner's shard: one array for every server (each row
    has one owner), int32 while the table allows."""
    dtype = np.int32 if len(owners) < 2**31 else np.int64
    positions = np.empty(len(owners), dtype=dtype)
    for server in np.unique(owners):
        ids = np.flatnonzero(owners == server)
        positions[ids] = np.arange(len(ids), dtype=dtype)
    return positions
