"""Class labels: from what a file holds to class ids, refusing label sets that look wrong.

The number of classes is the width of the model's last layer, inferred from the
labels unless the user declares it. A careless label set silently builds the
wrong model: one typo `1000000` among 0/1 makes a million-class model, `dgo`
among `cat`/`dog` a third class. So, before any id is handed out:

errors (one line naming the row, with the remedy):
- an empty label, a negative id, integer ids mixed with names;
- integer ids of which more than half of 0..max never occur: the largest is far
  beyond the others, and its row is named; declaring the number of classes
  accepts the ids as they are;
- a single class (a classifier needs two);
- fractional numbers as labels (the wrong column, most likely: every value
  would become a class of its own);
- with a declared number of classes N: an id >= N, or more than N distinct names.

warnings (training goes on; declaring the number of classes silences them):
- a class with one sample where the median class has at least
  `RARE_CLASS_MEDIAN` (a typo in a named label looks exactly like that);
- more classes than half the samples (an id or a measurement taken for the label).

Named labels get ids in sorted order of the names, over every file of the data
at once, so a validation file that lacks a class maps the others as training does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from shoal.errors import DataError

RARE_CLASS_MEDIAN = 10  # a single-sample class is suspicious where the median class has this many
INT64_MAX = 2**63 - 1


@dataclass
class LabelColumn:
    """The labels of one source as read: text cells (CSV) or integer ids (NPZ, tensors)."""

    values: Sequence[str] | np.ndarray
    locate: Callable[[int], str]  # row -> "file:line" (or "file: row i"), for messages
    name: str = "the labels"  # e.g. "column 'label'", for messages


@dataclass(frozen=True)
class LabelSpace:
    """The classes a model is built for; `names[i]` is class i when the labels are names."""

    num_classes: int
    names: tuple[str, ...] | None = None


def _as_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


@dataclass
class _Parsed:
    """A column's integer ids (if every cell is one), its text cells (if it was text), and
    which cells are names (not integers)."""

    column: LabelColumn
    ids: np.ndarray | None
    cells: list[str] | None
    names: np.ndarray  # bool per row

    def __len__(self) -> int:
        return len(self.names)

    def text(self, row: int) -> str:
        return self.cells[row] if self.cells is not None else str(self.ids[row])  # type: ignore[index]


def _parse(column: LabelColumn) -> _Parsed:
    if isinstance(column.values, np.ndarray):
        ids = column.values.astype(np.int64)
        return _Parsed(column, ids, None, np.zeros(len(ids), dtype=bool))
    cells = [str(v).strip() for v in column.values]
    ints = [_as_int(cell) for cell in cells]
    for row, (cell, value) in enumerate(zip(cells, ints, strict=True)):
        if not cell:
            raise DataError(f"{column.locate(row)}: empty label; every row needs its class")
        if value is not None and abs(value) > INT64_MAX:
            raise DataError(f"{column.locate(row)}: label {cell} is not a usable class id; fix it")
    names = np.fromiter((value is None for value in ints), dtype=bool, count=len(ints))
    if names.any():
        return _Parsed(column, None, cells, names)
    return _Parsed(column, np.asarray(ints, dtype=np.int64), cells, names)


def _check_one_kind(parsed: list[_Parsed]) -> None:
    """Integer ids mixed with names: the odd one out (the minority kind) is named."""
    total = sum(len(p) for p in parsed)
    names = sum(int(p.names.sum()) for p in parsed)
    if names in (0, total):
        return
    odd_is_name = names * 2 <= total
    p, row = next(
        (p, int(np.flatnonzero(p.names == odd_is_name)[0]))
        for p in parsed
        if (p.names == odd_is_name).any()
    )
    kind, other = ("not an integer", "integer ids") if odd_is_name else ("an integer", "names")
    count = total - names if odd_is_name else names
    raise DataError(
        f"{p.column.locate(row)}: label {p.text(row)!r} is {kind}, but {count} of the {total} "
        f"labels are {other}; fix the row, or use names (or ids) for every class"
    )


def fit_labels(
    columns: list[LabelColumn], declared: int | None, declare: str
) -> tuple[LabelSpace, list[str]]:
    """The class space of these label columns, and warnings about it.

    `declared` is the user's number of classes, if any; `declare` says where it
    is set (e.g. "task.data.classes"), for the remedy in messages.
    """
    parsed = [p for p in map(_parse, columns) if len(p)]
    if not parsed:
        raise DataError(f"no labels at all; {declare} cannot be inferred")
    _check_one_kind(parsed)
    if all(p.ids is not None for p in parsed):
        return _fit_ids(parsed, declared, declare)
    return _fit_names(parsed, declared, declare)


def _first(parsed: list[_Parsed], label: int | str) -> str:
    """Where `label` (an id, or a name) first occurs."""
    for p in parsed:
        if isinstance(label, int) and p.ids is not None:
            rows = np.flatnonzero(p.ids == label)
            if len(rows):
                return p.column.locate(int(rows[0]))
        elif isinstance(label, str) and p.cells is not None and label in p.cells:
            return p.column.locate(p.cells.index(label))
    raise AssertionError(f"label {label!r} occurs nowhere")


def _fit_ids(
    parsed: list[_Parsed], declared: int | None, declare: str
) -> tuple[LabelSpace, list[str]]:
    for p in parsed:
        assert p.ids is not None
        bad = np.flatnonzero((p.ids < 0) | (p.ids >= (declared or INT64_MAX)))
        if len(bad):
            row = int(bad[0])
            bound = f"in 0..{declared - 1} ({declare} = {declared})" if declared else ">= 0"
            raise DataError(
                f"{p.column.locate(row)}: label {int(p.ids[row])} is not a class id {bound}; "
                "fix the row" + ("" if declared else ", or use class names")
            )
    ids = np.concatenate([p.ids for p in parsed if p.ids is not None])
    distinct, counts = np.unique(ids, return_counts=True)
    if declared is not None:
        return LabelSpace(declared), []
    _require_two([str(i) for i in distinct], parsed, declare)
    top = int(distinct[-1])
    if top + 1 > 2 * len(distinct):
        shown = ", ".join(str(i) for i in distinct[:-1][:5]) + (
            ", ..." if len(distinct) > 6 else ""
        )
        raise DataError(
            f"{_first(parsed, top)}: label {top} is far beyond the other "
            f"class ids ({shown}): it would build a model of {top + 1} classes, "
            f"{top + 1 - len(distinct)} of them empty; fix the row, or set "
            f"{declare} = {top + 1} if the ids are right"
        )
    space = LabelSpace(top + 1)
    pairs = [(int(i), int(n)) for i, n in zip(distinct, counts, strict=True)]
    return space, _suspicious(parsed, pairs, space, declare)


def _fit_names(
    parsed: list[_Parsed], declared: int | None, declare: str
) -> tuple[LabelSpace, list[str]]:
    counts = Counter(cell for p in parsed for cell in p.cells or [])
    names = sorted(counts)
    if declared is not None:
        if len(names) > declared:
            rare = min(names, key=lambda n: counts[n])
            raise DataError(
                f"{_first(parsed, rare)}: {len(names)} distinct labels but {declare} = "
                f"{declared}; the rarest, {rare!r}, is here: fix it, or raise {declare}"
            )
        return LabelSpace(declared, tuple(names)), []
    _no_fractions(parsed, declare)
    _require_two(names, parsed, declare)
    space = LabelSpace(len(names), tuple(names))
    return space, _suspicious(parsed, list(counts.items()), space, declare)


def _as_fraction(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if np.isfinite(value) and value != round(value) else None


def _no_fractions(parsed: list[_Parsed], declare: str) -> None:
    """Labels that are all numbers, some fractional: a measurement, not classes."""
    if not all(is_number(cell) for p in parsed for cell in p.cells or []):
        return
    for p in parsed:
        for row, cell in enumerate(p.cells or []):
            if _as_fraction(cell) is not None:
                raise DataError(
                    f"{p.column.locate(row)}: label {cell!r} in {p.column.name} is a fractional "
                    "number: every value would be a class of its own; take the labels from "
                    f"another column, or set {declare} to use these values as class names"
                )


def is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _require_two(distinct: list[str], parsed: list[_Parsed], declare: str) -> None:
    if len(distinct) < 2:
        raise DataError(
            f"{parsed[0].column.locate(0)}: every label is {distinct[0]!r}: a classifier needs "
            f"at least two classes; if the others occur elsewhere, set {declare}"
        )


def _suspicious(
    parsed: list[_Parsed],
    counts: list[tuple[int, int]] | list[tuple[str, int]],
    space: LabelSpace,
    declare: str,
) -> list[str]:
    """Warnings about classes of a single sample: a typo among well populated classes, or
    a label column that holds an id per sample."""
    total = sum(n for _, n in counts)
    single = [label for label, n in counts if n == 1]
    accept = f"set {declare} = {space.num_classes} to accept"
    if len(counts) * 2 > total and total >= 2 * RARE_CLASS_MEDIAN:
        column = parsed[0].column
        return [
            f"{column.locate(0)}: {column.name} holds {len(counts)} classes for {total} "
            f"samples; are these the labels? if they are, {accept} them"
        ]
    median = float(np.median([n for _, n in counts]))
    if not single or median < RARE_CLASS_MEDIAN:
        return []
    more = f" (and {len(single) - 1} more such classes)" if len(single) > 1 else ""
    return [
        f"{_first(parsed, single[0])}: class {single[0]!r} has a single sample while the "
        f"median class has {median:g}{more}; a typo? fix the row, or {accept} it"
    ]


def encode(column: LabelColumn, space: LabelSpace, source: str) -> np.ndarray:
    """The class ids of `column` in `space`; `source` names the data the space was fitted on."""
    p = _parse(column)
    if space.names is None:
        if p.ids is None:
            row = int(np.flatnonzero(p.names)[0])
            raise DataError(
                f"{column.locate(row)}: label {p.text(row)!r} is not an integer class id, as "
                f"the labels of {source} are; fix the row"
            )
        bad = np.flatnonzero((p.ids < 0) | (p.ids >= space.num_classes))
        if len(bad):
            row = int(bad[0])
            raise DataError(
                f"{column.locate(row)}: label {int(p.ids[row])} is not one of the "
                f"{space.num_classes} class ids of {source} (0..{space.num_classes - 1}); "
                "fix the row, or declare the number of classes"
            )
        return p.ids
    index = {name: i for i, name in enumerate(space.names)}
    for row in range(len(p)):
        if p.text(row) not in index:
            known = ", ".join(space.names[:5]) + (", ..." if len(space.names) > 5 else "")
            raise DataError(
                f"{column.locate(row)}: label {p.text(row)!r} is not one of the classes of "
                f"{source} ({known}); fix the row"
            )
    return np.asarray([index[p.text(row)] for row in range(len(p))], dtype=np.int64)
