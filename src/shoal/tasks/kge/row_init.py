"""Initial rows as a function of (key, table, row id): any process builds any rows alone.

A parameter server must start from the same tables as one process, yet hold only
its own rows: with torch's sequential generator, row i's value depends on how many
numbers were drawn before it, so the only way to get it was to draw the whole
table. Here every entry is a counter-based random number instead: splitmix64
(Steele, Lea & Flood, 2014, "Fast splittable pseudorandom number generators";
the finaliser of Java's SplittableRandom) of a counter made of the entry's
position (row id x width + column) and a key per (model key, table). Any number of
servers, any sharding, a restart and one process therefore compute bit-identical
rows, and each computes only the rows it is asked for.

The model key is drawn from torch's default generator when a model is built, so
`seed_everything(seed)` then `build_model()` still decides the tables (a
population's members, seeded apart, still start apart).

A distribution is a `RowInit`: uniform or normal entries (normal by Box-Muller from
two uniforms), optionally each row scaled to unit L2 norm (TransE). Rows are made
in blocks of `BLOCK_ENTRIES` entries, so the float64 temporaries stay small
whatever the number of rows asked for.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from shoal.tasks.kge.model_config import (
    InitConfig,
    NormalInit,
    UniformInit,
    XavierUniformInit,
)

BLOCK_ENTRIES = 1 << 18
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class RowInit:
    """How a table's rows start: entries uniform on [low, high) (`normal` False) or normal
    with mean `low` and standard deviation `high` (`normal` True); `unit_norm`: each row
    then scaled to L2 norm 1."""

    low: float
    high: float
    normal: bool = False
    unit_norm: bool = False

    @staticmethod
    def uniform(low: float, high: float, unit_norm: bool = False) -> RowInit:
        return RowInit(low, high, normal=False, unit_norm=unit_norm)

    @staticmethod
    def gaussian(mean: float, std: float) -> RowInit:
        return RowInit(mean, std, normal=True)


def from_config(init: InitConfig, rows: int, width: int) -> RowInit:
    """The `RowInit` of `task.model.init` for a (rows x width) table; Xavier's fans are those
    torch.nn.init takes from a 2-d tensor (fan_in = width, fan_out = rows)."""
    if isinstance(init, UniformInit):
        return RowInit.uniform(init.a, init.b)
    if isinstance(init, NormalInit):
        return RowInit.gaussian(init.mean, init.std)
    if isinstance(init, XavierUniformInit):
        bound = init.gain * math.sqrt(6.0 / (rows + width))
        return RowInit.uniform(-bound, bound)
    return RowInit.gaussian(0.0, init.gain * math.sqrt(2.0 / (rows + width)))


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, in place on a uint64 array."""
    z ^= z >> np.uint64(30)
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    return z


def table_key(model_key: int, table: str) -> int:
    """The key of one table of a model (a 64-bit mix of the model's key and the name)."""
    salt = zlib.crc32(table.encode())
    mixed = _mix(np.array([(model_key * 0x100000001B3 + salt) & _MASK], dtype=np.uint64))
    return int(mixed[0])


def uniforms(key: int, counters: np.ndarray) -> np.ndarray:
    """A float64 in (0, 1) for each uint64 counter: splitmix64(key + (counter + 1) * golden)."""
    with np.errstate(over="ignore"):  # in place: one array of temporaries at a time
        z = counters + np.uint64(1)
        z *= _GOLDEN
        z += np.uint64(key)
        _mix(z)
        z >>= np.uint64(11)
    out = z.astype(np.float64)
    out *= 2.0**-53
    out += 2.0**-54
    return out


def _block(key: int, ids: np.ndarray, width: int, init: RowInit) -> np.ndarray:
    """float64 rows `ids` (a block) of a table of `width` columns."""
    with np.errstate(over="ignore"):
        counters = ids.astype(np.uint64)[:, None] * np.uint64(width) + np.arange(
            width, dtype=np.uint64
        )
    if init.normal:  # Box-Muller: two independent uniforms per entry
        with np.errstate(over="ignore"):
            counters *= np.uint64(2)
        values = np.log(uniforms(key, counters))
        values *= -2.0
        np.sqrt(values, out=values)
        counters += np.uint64(1)
        angle = uniforms(key, counters)
        angle *= 2.0 * math.pi
        np.cos(angle, out=angle)
        values *= angle
        values *= init.high
        values += init.low
    else:
        values = uniforms(key, counters)
        values *= init.high - init.low
        values += init.low
    if init.unit_norm:
        norms = np.sqrt((values * values).sum(axis=1, keepdims=True))
        values /= np.maximum(norms, 1e-12)
    return values


def initial_rows(key: int, ids: torch.Tensor, width: int, init: RowInit) -> torch.Tensor:
    """Rows `ids` (int64 global ids) of a table keyed `key` (`table_key`), float32
    (len(ids) x width): the same values whichever process asks, for whichever ids."""
    out = torch.empty(len(ids), width, dtype=torch.float32)
    raw = ids.numpy() if len(ids) else np.zeros(0, dtype=np.int64)
    step = max(1, BLOCK_ENTRIES // max(width, 1))
    target = out.numpy()
    for start in range(0, len(raw), step):
        stop = min(start + step, len(raw))
        target[start:stop] = _block(key, raw[start:stop], width, init)
    return out
