"""A shuffled order of [0, n) whose every position is computed on its own: no process
holds the order of a whole epoch, however large n is.

Position i's sample is a keyed pseudo-random permutation of i: a 4-round Feistel network
over the smallest even power of two that holds n (SplitMix64's finalizer as round
function, one key per round from (seed, epoch)), cycle-walked into range (Black and
Rogaway, 2002): a value outside [0, n) is permuted again until it falls inside, which
takes fewer than four passes on average. A slice of the order costs its own length, on
any rank and after any resume: the order is a function of (seed, epoch, n) alone.
"""

from __future__ import annotations

import numpy as np

_ROUNDS = 4
_WORD = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_STREAM = 0x5EB0  # keeps these keys apart from other draws keyed by (seed, epoch)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: a bijection of uint64 that scatters every input bit."""
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


class KeyedPermutation:
    """The order of [0, size) for (seed, epoch); `at(start, stop)` is its slice."""

    def __init__(self, size: int, seed: int, epoch: int) -> None:
        self.size = size
        self._half = max(1, ((max(size, 2) - 1).bit_length() + 1) // 2)  # 4^half >= size
        words = np.array([seed & _WORD, epoch & _WORD, _STREAM], dtype=np.uint64)
        mixed = _mix64(words)
        key = _mix64(_mix64(mixed[0] ^ mixed[1]) ^ mixed[2])
        with np.errstate(over="ignore"):
            self._keys = _mix64(key ^ (np.arange(1, _ROUNDS + 1, dtype=np.uint64) * _GOLDEN))

    def at(self, start: int, stop: int) -> np.ndarray:
        """The samples at positions start, ..., stop - 1 of the order (int64)."""
        stop = min(stop, self.size)
        values = self._pass(np.arange(start, max(start, stop), dtype=np.uint64))
        outside = np.flatnonzero(values >= self.size)
        while len(outside):  # cycle-walking: permute again until inside the range
            values[outside] = self._pass(values[outside])
            outside = outside[values[outside] >= self.size]
        return values.astype(np.int64)

    def _pass(self, values: np.ndarray) -> np.ndarray:
        """One pass of the Feistel network over [0, 4^half)."""
        mask = np.uint64((1 << self._half) - 1)
        shift = np.uint64(self._half)
        left, right = values >> shift, values & mask
        for key in self._keys:
            left, right = right, left ^ (_mix64(right ^ key) & mask)
        return (left << shift) | right
