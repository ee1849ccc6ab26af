"""Preparing a graph from files: labelled TSV triples, or triples of integer ids.

TSV (`head<TAB>relation<TAB>tail` labels, as `load_kg` always read them): ids follow
the sorted order of the labels seen in training, so they are known only at the end
of the training file. Its triples are written once with provisional ids (order of
first appearance) and renumbered block by block; the held-out splits are read after
it, their unseen labels counted and the first one's line kept in the manifest.

Ids (DGL-KE's `udd_hrt`: `head<TAB>relation<TAB>tail` non-negative integers), with
optional `id<TAB>name` files for entities and relations (DGL-KE's entities.dict,
relations.dict; ids 0, 1, 2, ... in order): nothing to renumber; without a names
file, there are max id + 1 entities (or relations), named by their ids.

Memory: one block of text and its fields at a time, plus, for TSV, one dictionary
entry per distinct label (the names must be known to number them); the triples
themselves go to disk as they are read.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from shoal.errors import DataError
from shoal.tasks.kge.prepared.names import write_names
from shoal.tasks.kge.prepared.npy import NpyWriter, open_npy, row_blocks
from shoal.tasks.kge.prepared.parse import (
    TRIPLE_LINES,
    TRIPLES,
    LabelIndex,
    LineFormat,
    Rows,
    parse_ids,
    raise_first_problem,
    split_block,
)
from shoal.tasks.kge.prepared.progress import PrepareProgress
from shoal.tasks.kge.prepared.writer import CHUNK_ROWS, FILTER_BUDGET, GraphWriter
from shoal.textfile import TextBlock, text_blocks

NAMES = LineFormat(("id", "name"), "expected id<TAB>name lines")
NAME_BLOCK = 1 << 16
BLOCK_BYTES = 8 << 20  # text read and split at once


def _source(path: Path, digest: str, read_at_ns: int) -> dict[str, Any]:
    """What the cache compares a source file with: its stat when it was read, its sha256."""
    stat = path.stat()
    return {
        "path": str(path),
        "bytes": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "read_at_ns": read_at_ns,
        "sha256": digest,
    }


class _Reading:
    """The text blocks of one file, with the bytes read reported to the progress bar."""

    def __init__(self, path: Path, expected: str, progress: PrepareProgress) -> None:
        self.path = path
        self.expected = expected
        self.progress = progress
        self.digest = hashlib.sha256()
        self.read_at_ns = time.time_ns()

    def blocks(self) -> Iterator[TextBlock]:
        self.progress.phase(f"reading {self.path.name}", self.path.stat().st_size)
        blocks = text_blocks(self.path, self.expected, BLOCK_BYTES, self.digest)
        for block in blocks:
            yield block
            self.progress.advance_to(block.consumed)

    def source(self) -> dict[str, Any]:
        return _source(self.path, self.digest.hexdigest(), self.read_at_ns)


def _label_ids(
    rows: Rows, block: TextBlock, path: Path, entities: LabelIndex, relations: LabelIndex
) -> np.ndarray:
    """(rows, 3) ids of a block's labels (-1: unknown to a frozen index)."""
    ends = entities.ids(rows, [0, 2])
    middle = relations.ids(rows, [1])
    if ends is None or middle is None:
        raise_first_problem(block, path, TRIPLES)  # a field empty once stripped
    return np.stack([ends[:, 0], middle[:, 0], ends[:, 1]], axis=1)


def _sorted_order(labels: list[str]) -> tuple[list[int], np.ndarray]:
    """The provisional ids in the labels' sorted order, and provisional id -> final id."""
    order = sorted(range(len(labels)), key=labels.__getitem__)
    final = np.empty(len(labels), dtype=np.int64)
    final[np.asarray(order, dtype=np.int64)] = np.arange(len(labels), dtype=np.int64)
    return order, final


def _renumber(ids: np.ndarray, entities: np.ndarray, relations: np.ndarray) -> np.ndarray:
    return np.stack([entities[ids[:, 0]], relations[ids[:, 1]], entities[ids[:, 2]]], axis=1)


def _in_order(labels: list[str], order: list[int]) -> Iterator[list[str]]:
    for start in range(0, len(order), NAME_BLOCK):
        yield list(map(labels.__getitem__, order[start : start + NAME_BLOCK]))


def prepare_tsv(
    files: dict[str, Path],
    folder: Path,
    progress: PrepareProgress,
    budget: int = FILTER_BUDGET,
) -> dict[str, Any]:
    """Prepare labelled TSV splits (`files`: train, and optionally valid and test) into
    `folder`; returns the manifest."""
    preparation = _TsvPreparation(GraphWriter(folder, progress, budget), progress)
    sources = {"train": preparation.train(files["train"])}
    for name, path in files.items():
        if name != "train":
            sources[name] = preparation.held_out(name, path)
    writer = preparation.writer
    return writer.finish(len(preparation.entities), len(preparation.relations), "tsv", sources)


class _TsvPreparation:
    """The label indexes a TSV graph is numbered with, and the splits written with them."""

    def __init__(self, writer: GraphWriter, progress: PrepareProgress) -> None:
        self.writer = writer
        self.progress = progress
        self.entities, self.relations = LabelIndex(), LabelIndex()
        self.entity_ids = self.relation_ids = np.zeros(0, dtype=np.int64)

    def train(self, path: Path) -> dict[str, Any]:
        """Read training triples with provisional ids, number the labels in sorted order,
        write the names and the renumbered triples; the source's record."""
        folder = self.writer.folder
        provisional = folder / ".train-provisional.npy"
        reading = _Reading(path, TRIPLE_LINES, self.progress)
        with NpyWriter(provisional, np.int64, (3,)) as scratch:
            for block in reading.blocks():
                rows = split_block(block, path, TRIPLES)
                scratch.append(_label_ids(rows, block, path, self.entities, self.relations))
        if scratch.rows == 0:
            raise DataError(f"{path}: no triples; {TRIPLE_LINES}")
        self.progress.phase("numbering labels")
        entity_order, self.entity_ids = _sorted_order(self.entities.labels)
        relation_order, self.relation_ids = _sorted_order(self.relations.labels)
        write_names(folder, "entity", _in_order(self.entities.labels, entity_order))
        write_names(folder, "relation", _in_order(self.relations.labels, relation_order))
        del entity_order, relation_order
        scratch_ids = open_npy(provisional)
        with self.writer.split("train") as out:
            for part in row_blocks(scratch_ids, CHUNK_ROWS):
                out.append(_renumber(scratch_ids[part], self.entity_ids, self.relation_ids))
        del scratch_ids
        provisional.unlink()
        self.writer.describe_split("train", str(path))
        self.entities.freeze()
        self.relations.freeze()
        return reading.source()

    def held_out(self, name: str, path: Path) -> dict[str, Any]:
        """Write a held-out split; triples with labels unseen in training are counted and
        left out (the first one's line recorded). The source's record."""
        reading = _Reading(path, TRIPLE_LINES, self.progress)
        unseen, first_unseen, total = 0, None, 0
        with self.writer.split(name) as out:
            for block in reading.blocks():
                rows = split_block(block, path, TRIPLES)
                ids = _label_ids(rows, block, path, self.entities, self.relations)
                known = (ids >= 0).all(axis=1)
                total += len(ids)
                if not known.all():
                    unseen += int((~known).sum())
                    if first_unseen is None:
                        first_unseen = _unseen_message(path, rows, ids, int(np.argmin(known)))
                out.append(_renumber(ids[known], self.entity_ids, self.relation_ids))
        if total == 0:
            raise DataError(f"{path}: no triples; {TRIPLE_LINES}")
        self.writer.describe_split(name, str(path), unseen, first_unseen)
        return reading.source()


def _unseen_message(path: Path, rows: Rows, ids: np.ndarray, row: int) -> str:
    """`file:line: entity 'x' never occurs in the training triples`."""
    what = [
        f"{kind} {rows.field(row, column).decode().strip()!r}"
        for column, kind in enumerate(("entity", "relation", "entity"))
        if ids[row, column] < 0
    ]
    return (
        f"{path}:{int(rows.lines[row])}: {' and '.join(what)} never occurs in the training triples"
    )


def _read_names(
    path: Path, table: str, folder: Path, progress: PrepareProgress
) -> tuple[int, dict[str, Any]]:
    """Stream an `id<TAB>name` file into the table's names; how many there are."""
    reading = _Reading(path, NAMES.expected, progress)
    count = 0

    def blocks() -> Iterator[list[str]]:
        nonlocal count
        for block in reading.blocks():
            rows = split_block(block, path, NAMES)
            ids = parse_ids(rows, block, path, NAMES, columns=1)
            expected = np.arange(count, count + len(rows), dtype=np.int64)
            wrong = np.flatnonzero(ids[:, 0] != expected)
            if len(wrong):
                at = int(wrong[0])
                raise DataError(
                    f"{path}:{int(rows.lines[at])}: id {int(ids[at, 0])} where {count + at} was "
                    f"expected; ids must be 0, 1, 2, ... in order"
                )
            names = [field.decode().strip() for field in rows.columns[1]]
            count += len(names)
            yield names

    write_names(folder, table, blocks())
    if count == 0:
        raise DataError(f"{path}: no {table} names; {NAMES.expected}")
    return count, reading.source()


def prepare_ids(
    files: dict[str, Path],
    folder: Path,
    progress: PrepareProgress,
    entity_names: Path | None = None,
    relation_names: Path | None = None,
    budget: int = FILTER_BUDGET,
) -> dict[str, Any]:
    """Prepare splits of integer ids (DGL-KE's udd_hrt) into `folder`; returns the manifest."""
    writer = GraphWriter(folder, progress, budget)
    sources: dict[str, Any] = {}
    limits: list[int | None] = [None, None]
    for position, (table, names) in enumerate(
        (("entity", entity_names), ("relation", relation_names))
    ):
        if names is not None:
            limits[position], sources[f"{table}_names"] = _read_names(
                names, table, folder, progress
            )
    highest = np.full(3, -1, dtype=np.int64)
    for name, path in files.items():
        reading = _Reading(path, TRIPLE_LINES, progress)
        with writer.split(name) as out:
            for block in reading.blocks():
                rows = split_block(block, path, TRIPLES)
                ids = parse_ids(rows, block, path, TRIPLES)
                _check_limits(ids, rows, path, limits, entity_names, relation_names)
                highest = np.maximum(highest, ids.max(axis=0, initial=-1))
                out.append(ids)
            if out.rows == 0:
                raise DataError(f"{path}: no triples; {TRIPLE_LINES}")
        sources[name] = reading.source()
        writer.describe_split(name, str(path))
    num_entities = limits[0] or int(max(highest[0], highest[2])) + 1
    num_relations = limits[1] or int(highest[1]) + 1
    for table, names, count in (
        ("entity", entity_names, num_entities),
        ("relation", relation_names, num_relations),
    ):
        if names is None:
            write_names(folder, table, _id_names(count))
    return writer.finish(num_entities, num_relations, "ids", sources)


def _check_limits(
    ids: np.ndarray,
    rows: Rows,
    path: Path,
    limits: list[int | None],
    entity_names: Path | None,
    relation_names: Path | None,
) -> None:
    """Every id names a row of its names file (when there is one)."""
    for column, (limit, names, kind) in enumerate(
        (
            (limits[0], entity_names, "entity"),
            (limits[1], relation_names, "relation"),
            (limits[0], entity_names, "entity"),
        )
    ):
        if limit is None:
            continue
        over = np.flatnonzero(ids[:, column] >= limit)
        if len(over):
            at = int(over[0])
            raise DataError(
                f"{path}:{int(rows.lines[at])}: {kind} id {int(ids[at, column])} is not in "
                f"{names} (ids 0 to {limit - 1})"
            )


def _id_names(count: int) -> Iterator[list[str]]:
    for start in range(0, count, NAME_BLOCK):
        yield [str(i) for i in range(start, min(start + NAME_BLOCK, count))]
