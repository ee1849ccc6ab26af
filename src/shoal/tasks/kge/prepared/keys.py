"""Byte strings found in a block of text, kept in a hash table of NumPy arrays.

Numbering a graph's labels with a Python dictionary costs a lookup per field: two
thirds of a TSV preparation's time at 4M triples (a profile: 8.3 of 12.7 s). Here a
whole block's fields are looked up at once. A field is given by where it starts and
how long it is in the block's bytes; it is read as 8-byte words (an unaligned view:
`word_view`), hashed word by word, and found by open addressing in `KeyTable`, every
field still unresolved moving one slot on per round. A slot matches only when its key's
bytes equal the field's, so a hash collision costs a probe, never a wrong answer. A key
never seen before is added in the round that finds an empty slot (one per slot and
round: another field aiming at the same slot compares with it in the next round).
"""

from __future__ import annotations

import numpy as np

#: the low `i` bytes of a word (i = 0..8)
_MASKS = np.array([(1 << (8 * i)) - 1 for i in range(9)], dtype=np.uint64)
_EMPTY = -1
_K0 = np.uint64(0x9E3779B97F4A7C15)
_K1 = np.uint64(0xFF51AFD7ED558CCD)
_K2 = np.uint64(0xC4CEB9FE1A85EC53)
PADDING = 8  # bytes after the last field, so that its last word can be read whole


def padded(data: bytes) -> np.ndarray:
    """`data` as bytes with PADDING zeros after it, for `word_view`."""
    return np.frombuffer(data + bytes(PADDING), dtype=np.uint8)


def word_view(buffer: np.ndarray) -> np.ndarray:
    """The 8 bytes starting at every offset of `buffer` as a little-endian uint64: one
    gather reads a word at any offset (the last PADDING - 1 offsets are left out)."""
    return np.ndarray((len(buffer) - PADDING + 1,), dtype="<u8", buffer=buffer, strides=(1,))


def _word(words: np.ndarray, starts: np.ndarray, lengths: np.ndarray, j: int) -> np.ndarray:
    """Word `j` of each field, the bytes past its end zeroed."""
    return words[starts + 8 * j] & _MASKS[np.minimum(lengths - 8 * j, 8)]


def hash_fields(words: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each field's bytes (its length, then its words; MurmurHash3's
    finaliser mixes every bit into the low ones, which pick the slot)."""
    with np.errstate(over="ignore"):
        hashes = lengths.astype(np.uint64) * _K0
        word_counts = (lengths + 7) // 8
        hashes = (hashes ^ _word(words, starts, lengths, 0)) * _K1  # every field: a word
        for j in range(1, int(word_counts.max(initial=0))):
            at = np.flatnonzero(word_counts > j)
            word = _word(words, starts[at], lengths[at], j)
            hashes[at] = (hashes[at] ^ word) * _K1
        hashes ^= hashes >> np.uint64(33)
        hashes *= _K2
        hashes ^= hashes >> np.uint64(33)
    return hashes


def _equal(
    words_a: np.ndarray,
    starts_a: np.ndarray,
    words_b: np.ndarray,
    starts_b: np.ndarray,
    lengths: np.ndarray,
) -> np.ndarray:
    """Whether fields of equal `lengths` hold the same bytes, pair by pair."""
    same = _word(words_a, starts_a, lengths, 0) == _word(words_b, starts_b, lengths, 0)
    word_counts = (lengths + 7) // 8
    for j in range(1, int(word_counts.max(initial=0))):
        at = np.flatnonzero(word_counts > j)
        a = _word(words_a, starts_a[at], lengths[at], j)
        b = _word(words_b, starts_b[at], lengths[at], j)
        same[at] &= a == b
    return same


class _Growing:
    """A 1-D array appended to, its capacity doubled as needed."""

    def __init__(self, dtype: type | np.dtype, capacity: int = 1 << 10) -> None:
        self.array = np.zeros(capacity, dtype=dtype)
        self.size = 0

    def append(self, values: np.ndarray) -> None:
        end = self.size + len(values)
        if end > len(self.array):
            grown = np.zeros(max(end, 2 * len(self.array)), dtype=self.array.dtype)
            grown[: self.size] = self.array[: self.size]
            self.array = grown
        self.array[self.size : end] = values
        self.size = end

    def view(self) -> np.ndarray:
        return self.array[: self.size]


def gather_ranges(buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """`buffer[s : s + l]` for every (s, l), one after another (every l > 0)."""
    total = int(lengths.sum())
    steps = np.ones(total, dtype=np.int64)
    begins = np.cumsum(lengths) - lengths
    steps[0] = starts[0]
    steps[begins[1:]] = starts[1:] - (starts[:-1] + lengths[:-1] - 1)
    return buffer[np.cumsum(steps)]


class KeyTable:
    """Distinct byte strings (keys), numbered 0, 1, 2, ... as they are first found.

    The keys' bytes are kept one after another, each followed by a newline, in one
    array (`text` decodes a run of them at once).
    """

    def __init__(self) -> None:
        self._bytes = _Growing(np.uint8, 1 << 16)
        self._bytes.append(np.zeros(PADDING, dtype=np.uint8))  # the last key's padding
        self._bytes.size = 0
        self._starts = _Growing(np.int64)
        self._lengths = _Growing(np.int64)
        self._hashes = _Growing(np.uint64)
        self._slots = np.full(1 << 10, _EMPTY, dtype=np.int64)

    def __len__(self) -> int:
        return self._starts.size

    def find_or_add(
        self, buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray
    ) -> tuple[np.ndarray, int]:
        """The key of each field of `buffer` (made with `padded`; every length > 0), and
        the number of keys before this call: keys from there on are new."""
        before = len(self)
        self._reserve(before + len(starts))
        words = word_view(buffer)
        hashes = hash_fields(words, starts, lengths)
        mask = len(self._slots) - 1
        found = np.empty(len(starts), dtype=np.int64)
        pending = np.arange(len(starts), dtype=np.int64)
        slots = (hashes & np.uint64(mask)).astype(np.int64)
        while len(pending):
            key = self._slots[slots]
            resolved = np.zeros(len(pending), dtype=bool)
            advance = np.zeros(len(pending), dtype=bool)
            at = np.flatnonzero(key != _EMPTY)
            held, fields = key[at], pending[at]
            match = (self._hashes.array[held] == hashes[fields]) & (
                self._lengths.array[held] == lengths[fields]
            )
            match[match] = _equal(
                words,
                starts[fields[match]],
                word_view(self._bytes.array),
                self._starts.array[held[match]],
                lengths[fields[match]],
            )
            found[fields[match]] = held[match]
            resolved[at[match]] = True
            advance[at[~match]] = True
            empty = np.flatnonzero(key == _EMPTY)
            if len(empty):  # one field per empty slot becomes its key; the rest compare next
                claim = slots[empty]
                self._slots[claim] = -2 - empty
                won = empty[self._slots[claim] == -2 - empty]
                winners = pending[won]
                self._add(buffer, starts[winners], lengths[winners], hashes[winners])
                keys = np.arange(len(self) - len(winners), len(self), dtype=np.int64)
                self._slots[slots[won]] = keys
                found[winners] = keys
                resolved[won] = True
            slots[advance] = (slots[advance] + 1) & mask
            pending, slots = pending[~resolved], slots[~resolved]
        return found, before

    def ascii_ends(self, first: int) -> np.ndarray:
        """Whether each key from `first` on begins and ends with an ASCII byte."""
        starts = self._starts.view()[first:]
        ends = starts + self._lengths.view()[first:] - 1
        return (self._bytes.array[starts] < 0x80) & (self._bytes.array[ends] < 0x80)

    def text(self, first: int) -> list[str]:
        """The keys from `first` on, decoded (their bytes must be UTF-8)."""
        if first >= len(self):
            return []
        start = int(self._starts.array[first])
        return bytes(self._bytes.array[start : self._bytes.size]).decode().split("\n")[:-1]

    def _add(
        self, buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray, hashes: np.ndarray
    ) -> None:
        if not len(starts):
            return
        with_newline = gather_ranges(buffer, starts, lengths + 1)
        with_newline[np.cumsum(lengths + 1) - 1] = ord("\n")
        self._starts.append(self._bytes.size + np.cumsum(lengths + 1) - lengths - 1)
        self._lengths.append(lengths)
        self._hashes.append(hashes)
        self._bytes.append(with_newline)
        self._bytes.append(np.zeros(PADDING, dtype=np.uint8))  # padding, past `size`
        self._bytes.size -= PADDING

    def _reserve(self, keys: int) -> None:
        """At least twice as many slots as `keys` (short probes), rehashing when it grows."""
        if 2 * keys <= len(self._slots):
            return
        size = len(self._slots)
        while size < 2 * keys:
            size *= 2
        self._slots = np.full(size, _EMPTY, dtype=np.int64)
        mask = size - 1
        pending = np.arange(len(self), dtype=np.int64)
        slots = (self._hashes.view() & np.uint64(mask)).astype(np.int64)
        while len(pending):  # distinct keys: each takes the first empty slot it wins
            empty = self._slots[slots] == _EMPTY
            self._slots[slots[empty]] = pending[empty]
            placed = np.zeros(len(pending), dtype=bool)
            placed[empty] = self._slots[slots[empty]] == pending[empty]
            pending, slots = pending[~placed], (slots[~placed] + 1) & mask
