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
import io
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from shoal.errors import DataError
from shoal.tasks.classification.config import FileDataConfig
from shoal.tasks.classification.labels import LabelColumn, is_number
from shoal.textfile import read_text

CSV_TEXT = "expected a CSV text with a header row"


@dataclass
class Table:
    """One file's samples: features (float32, finite) and the labels as read."""

    features: np.ndarray
    labels: LabelColumn
    warnings: list[str] = field(default_factory=list)


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
