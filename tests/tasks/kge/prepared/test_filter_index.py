"""Lookups in the on-disk filter index against a brute-force search."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.tasks.kge.prepared.filter_build import (
    _lexsorted_distinct,
    _packed_distinct,
    _sorted_unique,
)
from shoal.tasks.kge.prepared.filter_index import QueryIndex


def test_answers_and_membership_match_a_brute_force_search() -> None:
    rng = np.random.default_rng(0)
    pairs = np.unique(rng.integers(0, [30, 50], size=(400, 2)), axis=0)  # (key, answer)
    keys, starts = np.unique(pairs[:, 0], return_index=True)
    offsets = np.append(starts, len(pairs)).astype(np.int64)
    index = QueryIndex(keys.astype(np.int64), offsets, pairs[:, 1].astype(np.int64))
    queries = np.arange(-2, 33, dtype=np.int64)  # keys absent from the index too
    rows, answers = index.answers_of(queries)
    expected = sorted((i, int(a)) for i, q in enumerate(queries) for k, a in pairs if k == q)
    assert sorted(zip(rows.tolist(), answers.tolist(), strict=True)) == expected
    candidates = rng.integers(0, 50, size=(len(queries), 40))
    known = {(int(k), int(a)) for k, a in pairs}
    truth = np.array(
        [
            [(int(q), int(c)) in known for c in row]
            for q, row in zip(queries, candidates, strict=True)
        ]
    )
    assert np.array_equal(index.contains(queries, candidates), truth)
    assert truth.any() and not truth.all()


@pytest.mark.parametrize("spread", [7, 1 << 58], ids=["packed-sort", "lexsort"])
def test_sorting_dedups_and_keeps_whether_a_training_triple_asked(spread: int) -> None:
    """Keys far apart cannot be packed with their answers into one int64: a lexsort then."""
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 20, 500) * spread
    answers = rng.integers(0, 30, 500)
    train = (rng.random(500) < 0.3).astype(np.uint8)
    query_keys, counts, sorted_answers, query_train = _sorted_unique(keys, answers, train)
    expected = sorted(set(zip(keys.tolist(), answers.tolist(), strict=True)))
    assert sorted_answers.tolist() == [a for _, a in expected]
    assert np.repeat(query_keys, counts).tolist() == [k for k, _ in expected]
    trained = {int(k) for k, t in zip(keys, train, strict=True) if t}
    assert query_train.tolist() == [int(k) in trained for k in query_keys]


@pytest.mark.parametrize("key_bits", [41, 42], ids=["packs-in-62-bits", "one-bit-too-wide"])
def test_packing_at_its_limit_agrees_with_the_lexsort(key_bits: int) -> None:
    """20-bit answers leave 41 bits of key range under 62: the widest range that packs
    must give what the lexsort gives, and one bit wider must not be packed at all."""
    rng = np.random.default_rng(2)
    keys = np.concatenate([[5, 5 + (1 << key_bits) - 1], 5 + rng.integers(0, 1 << key_bits, 300)])
    answers = np.concatenate([[0, (1 << 20) - 1], rng.integers(0, 1 << 20, 300)])
    keys, answers = np.concatenate([keys, keys[:50]]), np.concatenate([answers, answers[:50]])
    train = (rng.random(len(keys)) < 0.5).astype(np.uint8)
    packed = _packed_distinct(keys, answers, train)
    if key_bits == 42:
        assert packed is None
        return
    assert packed is not None
    for got, want in zip(packed, _lexsorted_distinct(keys, answers, train), strict=True):
        assert got.tolist() == want.tolist()
