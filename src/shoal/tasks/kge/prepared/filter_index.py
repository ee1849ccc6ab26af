"""Looking up the filter index on disk: binary searches over memory-mapped arrays.

`answers_of` lists every known answer of some queries (the full filtered ranking
leaves them all out); `contains` asks of each sampled candidate whether it is a known
answer of its query (sampled ranking), a binary search within the query's answers,
so a query with millions of answers costs no more than one with three.
"""

from __future__ import annotations

import numpy as np
import torch


class QueryIndex:
    """One direction of the index: sorted query keys, offsets, answers sorted per key."""

    def __init__(self, keys: np.ndarray, offsets: np.ndarray, answers: np.ndarray) -> None:
        self.keys = keys
        self.offsets = offsets
        self.answers = answers

    def spans(self, query_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[lo, hi) of each query's answers (empty for a query with none)."""
        if len(self.keys) == 0:
            empty = np.zeros(len(query_keys), dtype=np.int64)
            return empty, empty
        at = np.searchsorted(self.keys, query_keys)
        clipped = np.minimum(at, len(self.keys) - 1)
        found = (at < len(self.keys)) & (self.keys[clipped] == query_keys)
        lo = np.where(found, self.offsets[clipped], 0)
        hi = np.where(found, self.offsets[clipped + 1], 0)
        return lo, hi

    def answers_of(self, query_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(query position, answer) pairs: every known answer of every query."""
        lo, hi = self.spans(query_keys)
        counts = hi - lo
        rows = np.repeat(np.arange(len(query_keys)), counts)
        within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        return rows, np.asarray(self.answers[np.repeat(lo, counts) + within])

    def contains(self, query_keys: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """(n, k) bool: whether candidates[i, j] is a known answer of query i."""
        lo, hi = self.spans(query_keys)
        lo = np.repeat(lo[:, None], candidates.shape[1], axis=1)
        hi = np.repeat(hi[:, None], candidates.shape[1], axis=1)
        end = hi.copy()
        active = lo < hi
        while active.any():  # lower bound of the candidate within [lo, hi)
            mid = (lo + hi) // 2
            below = np.zeros_like(active)
            below[active] = self.answers[mid[active]] < candidates[active]
            lo = np.where(active & below, mid + 1, lo)
            hi = np.where(active & ~below, mid, hi)
            active = lo < hi
        inside = lo < end
        found = np.zeros(candidates.shape, dtype=bool)
        found[inside] = self.answers[lo[inside]] == candidates[inside]
        return found


class SplitAnswers:
    """The known answers of the queries of some triples, one side, read from the index a
    batch at a time (the `rows` contract of `evaluation.Answers`): a worker reads the
    triples and index entries of its own batches only."""

    def __init__(self, graph: GraphFilter, triples: np.ndarray, head: bool) -> None:
        self.graph = graph
        self.triples = triples
        self.head = head

    def rows(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        part = self.triples[start:stop]
        anchors = part[:, 2] if self.head else part[:, 0]
        keys = self.graph.keys(anchors, part[:, 1])
        rows, answers = self.graph.side(self.head).answers_of(keys)
        return torch.from_numpy(rows), torch.from_numpy(answers)


class GraphFilter:
    """Both directions: tail queries (h, r, ?) keyed h * R + r, head queries (?, r, t)
    keyed t * R + r, as the in-memory `evaluation.FilterIndex` keys them."""

    def __init__(self, tails: QueryIndex, heads: QueryIndex, num_relations: int) -> None:
        self.tails = tails
        self.heads = heads
        self.num_relations = num_relations

    def keys(self, anchors: np.ndarray, relations: np.ndarray) -> np.ndarray:
        return anchors.astype(np.int64) * self.num_relations + relations

    def side(self, head: bool) -> QueryIndex:
        return self.heads if head else self.tails
