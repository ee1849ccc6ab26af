"""Writing the filter index: for every query of the known triples, its answers, sorted.

Two directions: `tails` answers tail queries (h, r, ?) keyed h * R + r, `heads` head
queries (?, r, t) keyed t * R + r. Each is three arrays: the distinct keys, sorted;
`offsets` (one more than the keys); `answers`, ascending within each key, every
known triple of every split once. A lookup is a binary search over memory maps
(`filter_index.py`).

Memory stays bounded by `budget` entries, whatever the graph's size: the triples are
distributed into buckets of anchor entities (ranges cut from the exact count of
triples per anchor, so every bucket but one holding a single huge anchor stays under
`budget`), written to a scratch file, and each bucket is sorted on its own; the
buckets come out in key order, so their concatenation is sorted. A graph under
`budget` is sorted in memory in one go.

Sorting also yields what Bernoulli negative sampling needs and would otherwise read
every triple for: the distinct (head, relation) and (tail, relation) pairs of the
training split, counted per relation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from shoal.tasks.kge.prepared.npy import NpyWriter, row_blocks

DIRECTIONS = {"tails": (0, 2), "heads": (2, 0)}  # name: (anchor column, answer column)
CHUNK_ROWS = 1 << 20


def filter_files(direction: str) -> tuple[str, str, str]:
    return (
        f"filter_{direction}_keys.npy",
        f"filter_{direction}_offsets.npy",
        f"filter_{direction}_answers.npy",
    )


def build_filter(
    folder: Path,
    splits: list[tuple[np.ndarray, bool]],
    num_entities: int,
    num_relations: int,
    budget: int,
    beat: Callable[[], None],
) -> dict[str, np.ndarray]:
    """Write both directions; per direction, the training split's distinct anchors per
    relation (R,). `splits`: (triples, is_train)."""
    if num_entities * num_relations >= 1 << 62:
        raise ValueError(f"{num_entities} entities x {num_relations} relations overflow int64 keys")
    return {
        direction: _build_direction(
            folder, direction, splits, num_entities, num_relations, budget, beat
        )
        for direction in DIRECTIONS
    }


def _build_direction(
    folder: Path,
    direction: str,
    splits: list[tuple[np.ndarray, bool]],
    num_entities: int,
    num_relations: int,
    budget: int,
    beat: Callable[[], None],
) -> np.ndarray:
    anchor, answer = DIRECTIONS[direction]
    per_anchor = np.zeros(num_entities, dtype=np.int64)
    for triples, _ in splits:
        for rows in row_blocks(triples, CHUNK_ROWS):
            per_anchor += np.bincount(triples[rows, anchor], minlength=num_entities)
    bounds = _bucket_bounds(per_anchor, budget)
    names = filter_files(direction)
    distinct = np.zeros(num_relations, dtype=np.int64)
    with (
        NpyWriter(folder / names[0], np.int64) as keys_out,
        NpyWriter(folder / names[1], np.int64) as offsets_out,
        NpyWriter(folder / names[2], np.int64) as answers_out,
    ):
        offsets_out.append(np.zeros(1, dtype=np.int64))
        written = 0
        for keys, answers, train in _buckets(
            folder, splits, anchor, answer, num_relations, per_anchor, bounds
        ):
            beat()
            query_keys, counts, answers, query_train = _sorted_unique(keys, answers, train)
            keys_out.append(query_keys)
            offsets_out.append(written + np.cumsum(counts))
            answers_out.append(answers)
            written += int(counts.sum())
            distinct += np.bincount(
                query_keys[query_train] % num_relations, minlength=num_relations
            )
    return distinct


def _bucket_bounds(per_anchor: np.ndarray, budget: int) -> np.ndarray:
    """Anchor ids where buckets start, then the end: each bucket at most `budget` triples,
    unless one anchor alone has more (it gets a bucket of its own)."""
    cumulative = np.cumsum(per_anchor)
    bounds = [0]
    done = 0
    while len(cumulative) and int(cumulative[-1]) - done > budget:
        cut = int(np.searchsorted(cumulative, done + budget, side="right"))
        cut = max(cut, bounds[-1] + 1)
        bounds.append(cut)
        done = int(cumulative[cut - 1])
    bounds.append(len(per_anchor))
    return np.asarray(bounds, dtype=np.int64)


def _buckets(
    folder: Path,
    splits: list[tuple[np.ndarray, bool]],
    anchor: int,
    answer: int,
    num_relations: int,
    per_anchor: np.ndarray,
    bounds: np.ndarray,
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(keys, answers, is_train) of each bucket, in bucket order."""
    if len(bounds) == 2:  # one bucket: straight from the splits
        parts = [_keyed(t[:], anchor, answer, num_relations, train) for t, train in splits]
        yield (
            np.concatenate([p[0] for p in parts]),
            np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]),
        )
        return
    starts = np.concatenate([[0], np.cumsum(np.add.reduceat(per_anchor, bounds[:-1]))])
    total = int(starts[-1])
    scratch = folder / ".filter-scratch"
    keys = np.lib.format.open_memmap(scratch.with_suffix(".keys.npy"), "w+", np.int64, (total,))
    answers = np.lib.format.open_memmap(
        scratch.with_suffix(".answers.npy"), "w+", np.int64, (total,)
    )
    train = np.lib.format.open_memmap(scratch.with_suffix(".train.npy"), "w+", np.uint8, (total,))
    try:
        cursor = starts[:-1].copy()
        for triples, is_train in splits:
            for rows in row_blocks(triples, CHUNK_ROWS):
                chunk_keys, chunk_answers, chunk_train = _keyed(
                    triples[rows], anchor, answer, num_relations, is_train
                )
                bucket = np.searchsorted(bounds, triples[rows, anchor], side="right") - 1
                order = np.argsort(bucket, kind="stable")
                counts = np.bincount(bucket, minlength=len(bounds) - 1)
                within = 0
                for index in np.flatnonzero(counts).tolist():
                    picked = order[within : within + counts[index]]
                    at = slice(int(cursor[index]), int(cursor[index] + counts[index]))
                    keys[at], answers[at], train[at] = (
                        chunk_keys[picked],
                        chunk_answers[picked],
                        chunk_train[picked],
                    )
                    cursor[index] += counts[index]
                    within += int(counts[index])
        for index in range(len(bounds) - 1):
            at = slice(int(starts[index]), int(starts[index + 1]))
            yield np.array(keys[at]), np.array(answers[at]), np.array(train[at])
    finally:
        del keys, answers, train
        for suffix in (".keys.npy", ".answers.npy", ".train.npy"):
            scratch.with_suffix(suffix).unlink(missing_ok=True)


def _keyed(
    triples: np.ndarray, anchor: int, answer: int, num_relations: int, is_train: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keys = triples[:, anchor] * num_relations + triples[:, 1]
    return keys, np.ascontiguousarray(triples[:, answer]), np.full(len(keys), is_train, np.uint8)


def _sorted_unique(
    keys: np.ndarray, answers: np.ndarray, train: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Distinct query keys, their answer counts, the distinct answers (ascending within a
    key) and whether any of a query's triples is a training triple."""
    if len(keys) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, np.zeros(0, dtype=bool)
    distinct = _packed_distinct(keys, answers, train)
    if distinct is None:
        distinct = _lexsorted_distinct(keys, answers, train)
    keys, answers, train = distinct
    new_key = np.ones(len(keys), dtype=bool)
    new_key[1:] = keys[1:] != keys[:-1]
    key_starts = np.flatnonzero(new_key)
    counts = np.diff(np.append(key_starts, len(keys)))
    query_train = np.maximum.reduceat(train, key_starts).astype(bool)
    return keys[key_starts], counts, answers, query_train


def _packed_distinct(
    keys: np.ndarray, answers: np.ndarray, train: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The distinct (key, answer) pairs, sorted, and whether one of each pair's triples is
    a training triple, from one sort of single int64 numbers: key, answer and a flag
    packed by bit shifts (0 for training, so it sorts first among equals and the first
    of a run says whether any is). Only the distinct pairs are unpacked; shifts, not
    divisions, since unpacking every entry with `//` and `%` cost as much as the sort.
    None where the three do not fit in 62 bits."""
    low = int(keys.min())
    answer_bits = int(answers.max()).bit_length()
    if answer_bits > 60 or int(answers.min()) < 0 or (int(keys.max()) - low) >> (61 - answer_bits):
        return None
    packed = keys - low
    packed <<= answer_bits
    packed |= answers
    packed <<= 1
    packed += train == 0
    packed.sort()
    pairs = packed >> 1
    first = np.ones(len(packed), dtype=bool)
    np.not_equal(pairs[1:], pairs[:-1], out=first[1:])
    del pairs
    picked = packed[np.flatnonzero(first)]
    train = ((picked & 1) == 0).astype(np.uint8)
    picked >>= 1
    distinct_answers = picked & ((1 << answer_bits) - 1)
    picked >>= answer_bits
    picked += low
    return picked, distinct_answers, train


def _lexsorted_distinct(
    keys: np.ndarray, answers: np.ndarray, train: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """As `_packed_distinct`, for keys too far apart to pack: a lexsort."""
    order = np.lexsort((answers, keys))
    keys, answers, train = keys[order], answers[order], train[order]
    first = np.ones(len(keys), dtype=bool)
    first[1:] = (keys[1:] != keys[:-1]) | (answers[1:] != answers[:-1])
    starts = np.flatnonzero(first)
    return keys[starts], answers[starts], np.maximum.reduceat(train, starts)
