"""Reading samples from a CSV or an NPZ file, checked where they are read.

A bad value surfaces here, as `file:line: column 'x': ...`, never later as
"non-finite gradients" with advice to lower the learning rate: features must
be finite numbers that fit in float32 (1e39 parses as a float but becomes inf
when the features are stored), the header must name every column once, every
row must have the header's width. The text itself (gzip, a byte-order mark,
bytes that are not UTF-8) is read by `shoal/textfile.py`, as every text input is.
Labels stay as read (text or ids) until `labels.py` has seen every file.
"""

from __future__ import annotations

import csv
import gzip
import io
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from shoal.errors import DataError
from shoal.tasks.classification.config import FileDataConfig
from shoal.tasks.classification.labels import LabelColumn, is_number
from shoal.textfile import GZIP_MAGIC, read_text, text_size

CSV_TEXT = "expected a CSV text with a header row"
#: bytes held at the peak of reading a file, per byte of its text (CSV: the text, csv's rows
#: of Python floats at 32 bytes a value, the float64 array and its float32 copy) or of its
#: arrays uncompressed (NPZ: the arrays and the float32 copy of the features). Measured
#: with tracemalloc around `load_files` on files of 4 to 200 columns: CSV 9.0 to 11.8, NPZ
#: 1.7 to 2.05
CSV_PEAK_PER_BYTE = 10
NPZ_PEAK_PER_BYTE = 2


@dataclass
class Table:
    """One file's samples: features (float32, finite) and the labels as read."""

    features: np.ndarray
    labels: LabelColumn
    warnings: list[str] = field(default_factory=list)


def files_memory(config: FileDataConfig) -> tuple[str, int, int]:
    """What reading the files holds at its peak, estimated from their sizes (a CSV's text,
    gzip's too; an NPZ's arrays uncompressed), and the features a sample has (the CSV
    header's columns but the label, the NPZ features' row size; 0 when unreadable): the
    launcher's estimate before the job starts (`launch/memory.py`), which reads no data."""
    paths = [Path(config.path)] + ([Path(config.valid_path)] if config.valid_path else [])
    size = held = features = 0
    for path in paths:
        if path.suffix.lower() == ".npz":
            arrays, width = _npz_size(path, config.features_key)
            size, held = size + arrays, held + NPZ_PEAK_PER_BYTE * arrays
        else:
            text, width = text_size(path), _csv_width(path)
            size, held = size + text, held + CSV_PEAK_PER_BYTE * text
        features = features or width
    return f"task.data: {size:,} bytes of files", held, features


def _csv_width(path: Path) -> int:
    """Columns of the header row but the label's (0: unreadable)."""
    try:
        with path.open("rb") as raw:
            gzipped = raw.read(2) == GZIP_MAGIC
        opener = gzip.open if gzipped else open
        with opener(path, "rb") as file:
            first = file.readline(1 << 20).decode("utf-8", "replace")
    except (OSError, EOFError, zlib.error):
        return 0
    return max(len(next(csv.reader([first]), [])) - 1, 0)


def _npz_size(path: Path, features_key: str) -> tuple[int, int]:
    """(bytes of the arrays uncompressed, values per sample of `features_key`); the file's
    own size and 0 when it cannot be read as an archive."""
    try:
        with zipfile.ZipFile(path) as archive:
            size = sum(info.file_size for info in archive.infolist())
            with archive.open(f"{features_key}.npy") as member:
                if np.lib.format.read_magic(member) == (1, 0):
                    shape = np.lib.format.read_array_header_1_0(member)[0]
                else:
                    shape = np.lib.format.read_array_header_2_0(member)[0]
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return text_size(path), 0
    return size, int(np.prod(shape[1:])) if len(shape) > 1 else 0


def read_table(path: Path, config: FileDataConfig) -> Table:
    if path.suffix.lower() == ".npz":
        return read_npz(path, config.features_key, config.labels_key)
    return read_csv(path, config.label_column)


def _header(
    path: Path, reader: Iterator[list[str]], label_column: str | None
) -> tuple[list[str], int]:
    """The column names and the label's position; each name must be there once.

    A header of numbers only is probably the first sample, which would be lost:
    that is a warning (pandas' default header 0,1,...,n-1 excepted)."""
    try:
        header = next(reader)
    except StopIteration:
        raise DataError(f"{path}:1: empty file; expected a header row of column names") from None
    except csv.Error as exc:
        raise DataError(f"{path}:1: not a readable CSV text: {exc}") from None
    header = [name.strip() for name in header]
    seen: dict[str, int] = {}
    for column, name in enumerate(header, start=1):
        if not name:
            raise DataError(
                f"{path}:1: column {column} of the header has no name (a stray comma?); "
                "name every column"
            )
        if name in seen:
            raise DataError(
                f"{path}:1: column name {name!r} appears twice (columns {seen[name]} and "
                f"{column}); make the names unique"
            )
        seen[name] = column
    if label_column is None:
        label_at = len(header) - 1
    elif label_column in header:
        label_at = header.index(label_column)
    else:
        raise DataError(
            f"{path}:1: no column {label_column!r} (task.data.label_column); "
            f"columns: {', '.join(header)}"
        )
    if len(header) < 2:
        separator = next((s for s in ";\t|" if s in header[0]), None)
        hint = f" (is it separated by {separator!r}? shoal reads commas)" if separator else ""
        raise DataError(f"{path}:1: need at least one feature column and a label column{hint}")
    return header, label_at


def _numeric_header(path: Path, header: list[str]) -> list[str]:
    if not all(is_number(name) for name in header) or header == [
        str(i) for i in range(len(header))
    ]:
        return []
    return [
        f"{path}:1: the header row holds only numbers ({', '.join(header[:4])}"
        f"{', ...' if len(header) > 4 else ''}); it is read as column names, not as a "
        "sample: add a header row if it is data"
    ]


def read_csv(path: Path, label_column: str | None) -> Table:
    """A CSV with a header row; numeric features; numeric or named labels."""
    reader = csv.reader(io.StringIO(read_text(path, CSV_TEXT), newline=""))
    header, label_at = _header(path, reader, label_column)
    rows: list[list[float]] = []
    raw_labels: list[str] = []
    lines: list[int] = []
    try:
        for row in reader:
            line = reader.line_num
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise DataError(f"{path}:{line}: expected {len(header)} columns, got {len(row)}")
            values = []
            for index, cell in enumerate(row):
                if index == label_at:
                    continue
                try:
                    values.append(float(cell))
                except ValueError:
                    raise DataError(
                        f"{path}:{line}: column {header[index]!r}: not a number: {cell!r}"
                    ) from None
            rows.append(values)
            raw_labels.append(row[label_at])
            lines.append(line)
    except csv.Error as exc:
        raise DataError(f"{path}:{reader.line_num}: not a readable CSV text: {exc}") from None
    if not rows:
        raise DataError(f"{path}: no data rows after the header")
    features = np.asarray(rows, dtype=np.float64)
    feature_names = [name for i, name in enumerate(header) if i != label_at]

    def at_row(row: int, column: int) -> str:
        return f"{path}:{lines[row]}: column {feature_names[column]!r}"

    return Table(
        _finite_float32(features, at_row, "remove the row or fill in the value"),
        LabelColumn(
            raw_labels,
            lambda row: f"{path}:{lines[row]}",
            f"column {header[label_at]!r} (task.data.label_column)",
        ),
        _numeric_header(path, header),
    )


def _finite_float32(features: np.ndarray, at: Callable[[int, int], str], remedy: str) -> np.ndarray:
    """`features` as float32; the first value that is nan, inf, or too large is an error.

    `at(row, column)` says where a value is (`column` counts the flattened features)."""
    with np.errstate(over="ignore", invalid="ignore"):
        single = features.astype(np.float32, copy=False)
    bad = ~np.isfinite(single.reshape(len(single), -1))
    if bad.any():
        row, column = (int(i) for i in np.argwhere(bad)[0])
        value = float(features.reshape(len(features), -1)[row, column])
        what = (
            f"{value:g} is too large for float32 (|x| <= 3.4e38)"
            if np.isfinite(value)
            else f"not a finite number: {value}"
        )
        raise DataError(f"{at(row, column)}: {what}; {remedy}")
    return single


def read_npz(path: Path, features_key: str, labels_key: str) -> Table:
    """Arrays `features_key` (n, ...) and `labels_key` (n,) of an NPZ archive, never unpickled."""
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: not a readable NPZ archive: {exc}") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DataError(
            f"{path}: a single .npy array, not an NPZ archive; save features and labels "
            f"with numpy.savez({features_key}=..., {labels_key}=...)"
        )
    with archive:
        for key, field in ((features_key, "features_key"), (labels_key, "labels_key")):
            if key not in archive.files:
                arrays = ", ".join(archive.files)
                raise DataError(f"{path}: no array {key!r} (task.data.{field}); arrays: {arrays}")
        try:
            x, y = archive[features_key], archive[labels_key]
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise DataError(f"{path}: not a readable NPZ archive: {exc}") from None
    if x.ndim < 2 or y.ndim != 1 or len(x) != len(y):
        raise DataError(
            f"{path}: expected features of shape (n, ...) and labels of shape (n,), "
            f"got {x.shape} and {y.shape}"
        )
    if not any(np.issubdtype(x.dtype, kind) for kind in (np.floating, np.integer, np.bool_)):
        raise DataError(
            f"{path}: {features_key} has dtype {x.dtype}; features must be real numbers"
        )
    if not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{path}: labels must be integer class ids >= 0, got dtype {y.dtype}")
    if len(y) == 0:
        raise DataError(f"{path}: {labels_key} is empty; no samples")
    if y.max() > np.iinfo(np.int64).max:  # uint64 beyond int64 would wrap around
        row = int(np.argmax(y))
        raise DataError(f"{path}: {labels_key}[{row}] = {y[row]} is not a usable class id")

    def at_row(row: int, column: int) -> str:
        index = np.unravel_index(column, x.shape[1:])
        return f"{path}: {features_key}[{', '.join(str(i) for i in (row, *index))}]"

    return Table(
        _finite_float32(x, at_row, "fix or drop that sample"),
        LabelColumn(
            y.astype(np.int64),
            lambda row: f"{path}: {labels_key}[{row}]",
            f"array {labels_key!r} (task.data.labels_key)",
        ),
    )
