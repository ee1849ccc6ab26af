"""Read the CSV file once: a header, then rows of numbers; every problem names file:line."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from shoal.extend import DataError, read_text
from shoal_regression.config import RegressionConfig

EXPECTED = "expected a CSV file with a header row and a number in every column"


@dataclass
class Table:
    """Features (n, d) and targets (n,), float32, split into train and valid."""

    columns: list[str]
    target: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    valid_x: torch.Tensor
    valid_y: torch.Tensor


def read_table(config: RegressionConfig) -> Table:
    path = Path(config.path)
    rows = list(csv.reader(read_text(path, EXPECTED).splitlines()))
    if not rows or not rows[0]:
        raise DataError(f"{path}: empty; {EXPECTED}")
    header = [name.strip() for name in rows[0]]
    target = config.target if config.target is not None else header[-1]
    if target not in header:
        raise DataError(f"{path}:1: no column {target!r} (task.target); columns: {header}")
    if len(header) < 2:
        raise DataError(f"{path}:1: one column only; a regression needs features and a target")
    values: list[list[float]] = []
    for line, row in enumerate(rows[1:], start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise DataError(f"{path}:{line}: {len(row)} values, the header has {len(header)}")
        numbers = []
        for name, cell in zip(header, row, strict=True):
            try:
                number = float(cell)
            except ValueError:
                raise DataError(f"{path}:{line}: column {name}: {cell!r} is not a number") from None
            if not math.isfinite(number):
                raise DataError(f"{path}:{line}: column {name}: {cell!r} is not finite")
            numbers.append(number)
        values.append(numbers)
    if len(values) < 2:
        raise DataError(f"{path}: {len(values)} data rows; need at least 2 (train and valid)")
    table = torch.tensor(values, dtype=torch.float32)
    column = header.index(target)
    y = table[:, column]
    x = torch.cat([table[:, :column], table[:, column + 1 :]], dim=1)
    order = torch.randperm(len(table), generator=torch.Generator().manual_seed(config.seed))
    n_valid = max(1, round(config.valid_fraction * len(table)))
    valid, train = order[:n_valid], order[n_valid:]
    features = [name for name in header if name != target]
    return Table(features, target, x[train], y[train], x[valid], y[valid])
