"""Tab-separated lines to columns, a block of whole lines at a time, with one-line errors.

The fast path splits a block with two C calls (`bytes.replace`, `bytes.split`) after
numpy has checked that every line has the expected number of tabs; fields stay
bytes, and only a field never seen before is decoded (`LabelIndex`). A block with
any irregular line goes through the plain per-line reader, which raises at the first
bad line exactly as reading the whole file line by line would: `file:line: what`.
Blank lines (whitespace only) are skipped; every field is stripped of surrounding
whitespace (the `\\r` of CRLF files among it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np

from shoal.errors import DataError
from shoal.textfile import TextBlock

TRIPLE_LINES = "expected head<TAB>relation<TAB>tail lines"
TRIPLE_COLUMNS = ("head", "relation", "tail")


@dataclass(frozen=True)
class LineFormat:
    """What a line of a file holds: its columns' names, and what to say when it does not."""

    columns: tuple[str, ...]
    expected: str

    def columns_error(self, path: Path, line: int, got: int) -> DataError:
        return DataError(
            f"{path}:{line}: expected {len(self.columns)} tab-separated columns "
            f"({', '.join(self.columns)}), got {got}"
        )


TRIPLES = LineFormat(TRIPLE_COLUMNS, TRIPLE_LINES)


@dataclass
class Rows:
    """The fields of a block's lines, column by column (raw bytes, unstripped), and the
    line number of each row."""

    columns: list[list[bytes]]
    lines: np.ndarray

    def __len__(self) -> int:
        return len(self.lines)


def split_block(block: TextBlock, path: Path, form: LineFormat) -> Rows:
    """The rows of a block; blank lines are left out, a malformed line raises."""
    data = block.data
    tabs_wanted = len(form.columns) - 1
    raw = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(raw == 10)
    tabs = np.diff(np.searchsorted(np.flatnonzero(raw == 9), ends), prepend=0)
    irregular = np.flatnonzero(tabs != tabs_wanted)
    lines = block.first_line + np.arange(len(ends), dtype=np.int64)
    if len(irregular):
        texts = data.split(b"\n")
        for index in irregular.tolist():
            if tabs[index] or texts[index].decode().strip():
                raise_first_problem(block, path, form)
        keep = np.ones(len(ends), dtype=bool)
        keep[irregular] = False  # every irregular line is blank
        data = b"".join(texts[i] + b"\n" for i in np.flatnonzero(keep).tolist())
        lines = lines[keep]
    fields = data.replace(b"\n", b"\t").split(b"\t")
    fields.pop()  # after the last newline
    width = len(form.columns)
    return Rows([fields[i::width] for i in range(width)], lines)


def raise_first_problem(block: TextBlock, path: Path, form: LineFormat) -> None:
    """Raise the error of the block's first bad line, read line by line."""
    width = len(form.columns)
    text = block.data.decode()
    for number, line in enumerate(text.split("\n")[:-1], start=block.first_line):
        cells = line.split("\t")
        if len(cells) == width and all(cell.strip() for cell in cells):
            continue
        if len(cells) == 1 and not line.strip():
            continue  # a blank line
        if len(cells) != width:
            raise form.columns_error(path, number, len(cells))
        empty = [name for name, cell in zip(form.columns, cells, strict=True) if not cell.strip()]
        raise DataError(f"{path}:{number}: empty {' and '.join(empty)}")
    raise AssertionError("raise_first_problem: the block has no bad line")


class LabelIndex:
    """Labels -> ids, in order of first appearance (`labels[i]` is id i).

    Keyed by the raw field, so a label is decoded and stripped once, however often it
    occurs. Once frozen (for the held-out splits) it adds no label: an unknown one is -1.
    """

    def __init__(self) -> None:
        self.labels: list[str] = []
        self._canonical: dict[str, int] = {}
        self._raw: dict[bytes, int] = {}
        self.frozen = False

    def freeze(self) -> None:
        """From now on an unknown label is -1 (the held-out splits, after training's)."""
        self.frozen = True

    def __len__(self) -> int:
        return len(self.labels)

    def ids(self, fields: list[bytes]) -> np.ndarray | None:
        """The ids of `fields`; None when one is empty once stripped (the caller re-reads the
        block line by line to name the line)."""
        new = set(fields)
        new.difference_update(self._raw.keys())
        for field in new:
            label = field.decode().strip()
            if not label:
                return None
            index = self._canonical.get(label)
            if index is None:
                if self.frozen:
                    index = -1
                else:
                    index = len(self.labels)
                    self._canonical[label] = index
                    self.labels.append(label)
            self._raw[field] = index
        return np.fromiter(map(self._raw.__getitem__, fields), dtype=np.int64, count=len(fields))


def parse_ids(
    rows: Rows, block: TextBlock, path: Path, form: LineFormat, columns: int | None = None
) -> np.ndarray:
    """Integer ids of the first `columns` columns (all by default), rows x columns; a field
    that is not a non-negative integer raises with its line."""
    width = len(form.columns) if columns is None else columns
    out = np.empty((len(rows), width), dtype=np.int64)
    for column in range(width):
        try:
            values = np.array(rows.columns[column], dtype=np.bytes_).astype(np.int64)
        except (ValueError, OverflowError):
            values = None
        if values is None or (values < 0).any():
            _raise_bad_id(rows, block, path, form, width)
        out[:, column] = values
    return out


def _raise_bad_id(
    rows: Rows, block: TextBlock, path: Path, form: LineFormat, width: int
) -> NoReturn:
    for row in range(len(rows)):
        for name, fields in zip(form.columns[:width], rows.columns, strict=False):
            text = fields[row].decode().strip()
            if not text:
                raise_first_problem(block, path, form)
            if not (text.isascii() and text.isdigit()) or int(text) >= 1 << 63:
                raise DataError(
                    f"{path}:{int(rows.lines[row])}: {name} {text!r} is not an id "
                    f"(a non-negative integer); {form.expected}"
                )
    raise AssertionError("_raise_bad_id: no bad id found")
