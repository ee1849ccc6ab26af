"""The hash table of byte strings: a field's key is found by its bytes, whatever the hashes
do (all colliding included), across calls and while the table grows."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.tasks.kge.prepared import keys
from shoal.tasks.kge.prepared.keys import KeyTable, gather_ranges, padded


def _fields(strings: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The strings as one tab-separated buffer: (padded buffer, starts, lengths)."""
    data = b"\t".join(strings) + b"\n"
    lengths = np.array([len(s) for s in strings], dtype=np.int64)
    starts = np.cumsum(lengths + 1) - lengths - 1
    return padded(data), starts, lengths


def _strings(rng: np.random.Generator, count: int) -> list[bytes]:
    """Byte strings of 1 to 40 bytes over a small alphabet (many share their first words),
    with prefixes of one another and strings equal but for their last byte."""
    alphabet = ["a", "b", "é", "x", " ", "東"]
    out = []
    for _ in range(count):
        length = int(rng.integers(1, 30))
        out.append("".join(rng.choice(alphabet, length)).encode())
    out += [b"abcdefgh", b"abcdefghi", b"abcdefgh" * 2, b"abcdefgh" * 2 + b"j", b"a", b"b"]
    return out


def _check(table: KeyTable, batches: list[list[bytes]]) -> None:
    seen: dict[bytes, int] = {}
    for batch in batches:
        buffer, starts, lengths = _fields(batch)
        found, first_new = table.find_or_add(buffer, starts, lengths)
        new_strings = [s.decode() for s in dict.fromkeys(s for s in batch if s not in seen)]
        assert len(table) - first_new == len(new_strings)
        assert sorted(table.text(first_new)) == sorted(new_strings)
        for key, text in enumerate(table.text(first_new), start=first_new):
            seen[text.encode()] = key
        assert found.tolist() == [seen[s] for s in batch]


@pytest.mark.parametrize("collide", [False, True])
def test_every_string_gets_one_key_across_calls_and_growth(
    monkeypatch: pytest.MonkeyPatch, collide: bool
) -> None:
    """With `collide`, every string hashes to one of three values: keys are still exact."""
    if collide:
        real = keys.hash_fields
        monkeypatch.setattr(
            keys, "hash_fields", lambda w, s, n: real(w, s, n) % np.uint64(3) * np.uint64(64)
        )
    rng = np.random.default_rng(0)
    pool = _strings(rng, 3000 if not collide else 300)
    batches = [[pool[i] for i in rng.integers(0, len(pool), size)] for size in (5, 700, 2500)]
    _check(KeyTable(), batches)


def test_gather_ranges_concatenates_slices() -> None:
    buffer = np.arange(20, dtype=np.uint8)
    got = gather_ranges(buffer, np.array([3, 0, 10]), np.array([2, 1, 4]))
    assert got.tolist() == [3, 4, 0, 10, 11, 12, 13]
