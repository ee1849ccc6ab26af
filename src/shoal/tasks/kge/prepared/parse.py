"""Tab-separated lines to columns, a block of whole lines at a time, with one-line errors.

The fast path finds every field's start and end in a block with NumPy, after checking
that every line has the expected number of tabs; no field becomes a Python object.
Labels are numbered a block at a time (`LabelIndex`, on `keys.KeyTable`): only a label
never seen before is decoded. Integer ids are parsed from the digits in place. A block
with any irregular line goes through the plain per-line reader, which raises at the
first bad line exactly as reading the whole file line by line would: `file:line: what`.
Blank lines (whitespace only) are skipped; every field is stripped of surrounding
whitespace (the `\\r` of CRLF files among it).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import NoReturn

import numpy as np

from shoal.errors import DataError
from shoal.tasks.kge.prepared.keys import KeyTable, padded
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
    """The fields of a block's lines: where each starts and ends in `data` (rows x columns,
    unstripped), and the line number of each row."""

    data: bytes
    starts: np.ndarray
    ends: np.ndarray
    lines: np.ndarray

    def __len__(self) -> int:
        return len(self.lines)

    def field(self, row: int, column: int) -> bytes:
        return self.data[int(self.starts[row, column]) : int(self.ends[row, column])]

    @cached_property
    def padded(self) -> np.ndarray:
        """`data` with padding for `keys.word_view`."""
        return padded(self.data)

    @cached_property
    def columns(self) -> list[list[bytes]]:
        """Every field as bytes, column by column (for small inputs and error paths)."""
        fields = self.data.replace(b"\n", b"\t").split(b"\t")
        fields.pop()  # after the last newline
        width = self.starts.shape[1]
        return [fields[i::width] for i in range(width)]


def split_block(block: TextBlock, path: Path, form: LineFormat) -> Rows:
    """The rows of a block; blank lines are left out, a malformed line raises."""
    data = block.data
    width = len(form.columns)
    separators, line_ends = _separators(data)
    tabs = np.diff(line_ends, prepend=-1) - 1
    irregular = np.flatnonzero(tabs != width - 1)
    lines = block.first_line + np.arange(len(line_ends), dtype=np.int64)
    if len(irregular):
        texts = data.split(b"\n")
        for index in irregular.tolist():
            if tabs[index] or texts[index].decode().strip():
                raise_first_problem(block, path, form)
        keep = np.ones(len(line_ends), dtype=bool)
        keep[irregular] = False  # every irregular line is blank
        data = b"".join(texts[i] + b"\n" for i in np.flatnonzero(keep).tolist())
        lines = lines[keep]
        separators, _ = _separators(data)
    starts = np.empty_like(separators)
    starts[:1] = 0
    starts[1:] = separators[:-1] + 1
    return Rows(data, starts.reshape(-1, width), separators.reshape(-1, width), lines)


def _separators(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Offsets of the tabs and newlines in `data`, and which of those are newlines."""
    raw = np.frombuffer(data, dtype=np.uint8)
    separators = np.flatnonzero((raw == 9) | (raw == 10))
    return separators, np.flatnonzero(raw[separators] == 10)


def raise_first_problem(block: TextBlock, path: Path, form: LineFormat) -> NoReturn:
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


#: ASCII bytes that `str.strip()` removes (it also removes non-ASCII whitespace: a label
#: is stripped again once decoded)
_SPACE = np.zeros(256, dtype=bool)
_SPACE[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = True
#: what int() strips from bytes (no \x1c-\x1f)
_BYTES_SPACE = np.zeros(256, dtype=bool)
_BYTES_SPACE[[9, 10, 11, 12, 13, 32]] = True
_DIGIT = np.zeros(256, dtype=bool)
_DIGIT[ord("0") : ord("9") + 1] = True
#: digits that always fit an int64
_MAX_DIGITS = 18


def strip_fields(
    raw: np.ndarray, starts: np.ndarray, ends: np.ndarray, space: np.ndarray = _SPACE
) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends moved past the `space` bytes at either end of each field."""
    starts, ends = starts.copy(), ends.copy()
    at = np.flatnonzero(space[raw[starts]] & (starts < ends))
    while len(at):
        starts[at] += 1
        at = at[space[raw[starts[at]]] & (starts[at] < ends[at])]
    at = np.flatnonzero(space[raw[ends - 1]] & (starts < ends))
    while len(at):
        ends[at] -= 1
        at = at[space[raw[ends[at] - 1]] & (starts[at] < ends[at])]
    return starts, ends


class LabelIndex:
    """Labels -> ids, in order of first appearance (`labels[i]` is id i).

    A field is found among the keys seen so far by its bytes, stripped of ASCII
    whitespace (`keys.KeyTable`, a block of fields at once); a key is decoded and stripped
    once, when first seen, and names its label (keys that differ only in non-ASCII
    whitespace name the same one). Once frozen (for the held-out splits) it adds no
    label: an unknown one is -1.
    """

    def __init__(self) -> None:
        self.labels: list[str] = []
        self._canonical: dict[str, int] | None = None  # label -> id, once needed (`_number`)
        self._keys = KeyTable()
        self._key_ids = np.zeros(0, dtype=np.int64)  # key -> label id (-1: unknown)
        self.frozen = False

    def freeze(self) -> None:
        """From now on an unknown label is -1 (the held-out splits, after training's)."""
        self.frozen = True

    def __len__(self) -> int:
        return len(self.labels)

    def ids(self, rows: Rows, columns: list[int]) -> np.ndarray | None:
        """(rows, len(columns)) ids of the fields in `columns`; None when one is empty once
        stripped (the caller re-reads the block line by line to name the line)."""
        buffer = rows.padded
        starts, ends = strip_fields(
            buffer, rows.starts[:, columns].ravel(), rows.ends[:, columns].ravel()
        )
        lengths = ends - starts
        if not lengths.all():
            return None
        keys, first_new = self._keys.find_or_add(buffer, starts, lengths)
        if first_new < len(self._keys):
            label_ids = self._number(self._keys.text(first_new), self._keys.ascii_ends(first_new))
            if label_ids is None:
                return None
            self._key_ids = np.concatenate([self._key_ids, label_ids])
        return self._key_ids[keys].reshape(len(rows), len(columns))

    def _number(self, texts: list[str], plain: np.ndarray) -> np.ndarray | None:
        """Label ids of new keys (None: one is empty once stripped). A key with ASCII ends
        is its own label (already stripped); while every key has been so, two keys never
        name one label, so new keys are new labels, numbered without a dictionary. The
        first key with a non-ASCII end (non-ASCII whitespace may strip off) brings in the
        dictionary of every label, kept from then on."""
        if self._canonical is None and plain.all():
            if self.frozen:
                return np.full(len(texts), -1, dtype=np.int64)
            first = len(self.labels)
            self.labels.extend(texts)
            return np.arange(first, len(self.labels), dtype=np.int64)
        if self._canonical is None:
            self._canonical = dict(zip(self.labels, range(len(self.labels)), strict=True))
        ids = np.fromiter(map(self._label_id, texts), dtype=np.int64, count=len(texts))
        return None if (ids == _EMPTY_LABEL).any() else ids

    def _label_id(self, text: str) -> int:
        assert self._canonical is not None
        label = text.strip()
        if not label:
            return _EMPTY_LABEL
        index = self._canonical.get(label)
        if index is None:
            if self.frozen:
                return -1
            index = len(self.labels)
            self._canonical[label] = index
            self.labels.append(label)
        return index


_EMPTY_LABEL = -2


def parse_ids(
    rows: Rows, block: TextBlock, path: Path, form: LineFormat, columns: int | None = None
) -> np.ndarray:
    """Integer ids of the first `columns` columns (all by default), rows x columns; a field
    that is not a non-negative integer raises with its line.

    Plain digits (surrounded by whitespace) are read in place, a digit position at a
    time; a block with anything else goes through NumPy's conversion of each field."""
    width = len(form.columns) if columns is None else columns
    raw = np.frombuffer(rows.data, dtype=np.uint8)
    starts, ends = strip_fields(
        raw, rows.starts[:, :width].ravel(), rows.ends[:, :width].ravel(), _BYTES_SPACE
    )
    lengths = ends - starts
    if len(lengths) and (lengths.min() < 1 or lengths.max() > _MAX_DIGITS):
        return _parse_ids_by_field(rows, block, path, form, width)
    values = np.zeros(len(starts), dtype=np.int64)
    for j in range(int(lengths.max(initial=0))):
        at = np.flatnonzero(lengths > j)
        digits = raw[starts[at] + j]
        if not _DIGIT[digits].all():
            return _parse_ids_by_field(rows, block, path, form, width)
        values[at] = values[at] * 10 + (digits - ord("0"))
    return values.reshape(len(rows), width)


def _parse_ids_by_field(
    rows: Rows, block: TextBlock, path: Path, form: LineFormat, width: int
) -> np.ndarray:
    """parse_ids through NumPy's conversion of each field (signs, underscores, ...)."""
    out = np.empty((len(rows), width), dtype=np.int64)
    columns = rows.columns
    for column in range(width):
        try:
            values = np.array(columns[column], dtype=np.bytes_).astype(np.int64)
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
