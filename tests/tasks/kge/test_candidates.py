"""Sampled ranking's candidates: distinct, never the answer, all entities when k allows,
and a function of (seed, side, query) alone."""

from __future__ import annotations

import numpy as np

from shoal.tasks.kge.candidates import sample_candidates


def test_distinct_never_the_answer_and_everyone_when_k_allows() -> None:
    answers = np.array([0, 5, 9, 3, 7])
    drawn = sample_candidates(1, False, np.arange(5), answers, 6, 10)
    assert drawn.shape == (5, 6)
    for row, answer in zip(drawn, answers, strict=True):
        assert (
            len(set(row.tolist())) == 6 and answer not in row and row.min() >= 0 and row.max() < 10
        )
    every = sample_candidates(1, False, np.arange(5), answers, 50, 10)
    assert [sorted(row.tolist()) for row in every] == [
        [e for e in range(10) if e != answer] for answer in answers
    ]


def test_draws_depend_on_the_query_not_on_its_company() -> None:
    queries = np.arange(100, 140)
    answers = np.arange(40) % 7
    whole = sample_candidates(3, True, queries, answers, 20, 1000)
    halves = [
        sample_candidates(3, True, queries[s], answers[s], 20, 1000)
        for s in (slice(0, 13), slice(13, 40))
    ]
    assert np.array_equal(np.concatenate(halves), whole)
    assert not np.array_equal(sample_candidates(3, False, queries, answers, 20, 1000), whole)
    assert not np.array_equal(sample_candidates(4, True, queries, answers, 20, 1000), whole)


def test_candidates_are_spread_over_all_entities() -> None:
    drawn = sample_candidates(0, False, np.arange(4000), np.zeros(4000, dtype=np.int64), 25, 101)
    counts = np.bincount(drawn.ravel(), minlength=101)[1:]  # entity 0 is every answer
    expected = drawn.size / 100
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 148.2  # 0.999 quantile, 99 degrees of freedom
