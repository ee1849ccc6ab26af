"""Entity and relation names on disk: UTF-8 bytes end to end, and where each name starts.

`<table>_names.bin` holds the names one after another; `<table>_names_offsets.npy`
(int64, one more than the names) says where name i starts and ends. A name is read
when asked for, so a process that maps the files holds no Python string per entity.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import overload

import numpy as np

from shoal.tasks.kge.prepared.npy import NpyWriter


def names_files(table: str) -> tuple[str, str]:
    """The file names of a table's names: the bytes, the offsets."""
    return f"{table}_names.bin", f"{table}_names_offsets.npy"


def write_names(folder: Path, table: str, blocks: Iterable[Sequence[str]]) -> int:
    """Write names given a block at a time, in id order; how many were written."""
    data_name, offsets_name = names_files(table)
    count = 0
    position = 0
    with (
        open(folder / data_name, "wb") as data,
        NpyWriter(folder / offsets_name, np.int64) as offsets,
    ):
        offsets.append(np.zeros(1, dtype=np.int64))
        for block in blocks:
            encoded, lengths = _encoded(block)
            offsets.append(position + np.cumsum(lengths))
            data.write(encoded)
            position += len(encoded)
            count += len(lengths)
    return count


def _encoded(names: Sequence[str]) -> tuple[bytes, np.ndarray]:
    """The names' UTF-8 bytes one after another, and each one's length: encoded at once,
    joined by newlines that NumPy then finds (a name with a newline of its own, which no
    text line holds, is encoded alone)."""
    joined = ("\n".join(names) + "\n").encode() if names else b""
    ends = np.flatnonzero(np.frombuffer(joined, dtype=np.uint8) == 10)
    if len(ends) != len(names):
        encoded = [name.encode() for name in names]
        return b"".join(encoded), np.fromiter(map(len, encoded), np.int64, len(encoded))
    return joined.replace(b"\n", b""), np.diff(ends, prepend=-1) - 1


class Names(Sequence[str]):
    """The names of one table, read from the memory-mapped files as they are asked for."""

    def __init__(self, data: np.ndarray, offsets: np.ndarray) -> None:
        self._data = data
        self._offsets = offsets

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"name {index} of {len(self)}")
        lo, hi = int(self._offsets[index]), int(self._offsets[index + 1])
        return bytes(self._data[lo:hi]).decode()

    def __iter__(self) -> Iterator[str]:
        block = 1 << 16
        for start in range(0, len(self), block):
            stop = min(start + block, len(self))
            offsets = self._offsets[start : stop + 1]
            raw = bytes(self._data[int(offsets[0]) : int(offsets[-1])])
            edges = (offsets - offsets[0]).tolist()
            for lo, hi in itertools.pairwise(edges):
                yield raw[lo:hi].decode()

    def __eq__(self, other: object) -> bool:
        """Equal to any sequence of the same names, in the same order (a list of labels)."""
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Names({len(self)} names)"
