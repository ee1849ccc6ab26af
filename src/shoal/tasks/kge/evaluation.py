"""Filtered link-prediction evaluation: rank the true entity among all entities.

For each held-out triple (h, r, t), tail prediction scores (h, r, e) for every
entity e and head prediction scores (e, r, t). The *filtered* rank (Bordes et
al., 2013) ignores every other entity that also forms a known true triple
(in train, valid or test), so the model is not punished for ranking another
correct answer first. Ties count as the mean of the best and worst rank they
allow (the "realistic" rank of Berrendorf et al., 2020): rank = 1 + #greater +
#equal / 2. A NaN score counts as the worst score. MRR, MR and Hits@k average
over both directions.

Memory stays bounded: triples are ranked `batch_size` at a time, so the score
matrix is batch_size x entities, and distance models cut their (triples x
entities x width) intermediate into blocks of at most `block_elements`. The known
answers come from the prepared graph's filter index on disk, a batch of queries at
a time (`FilterIndex.of_split`), or from triples in memory (`FilterIndex.build`).

Sampled ranking (`rank_sampled`, OGB's wikikg2 protocol) compares the answer with
`count` entities drawn per query and side (`candidates.py`) instead of all of them;
a candidate that is another known answer is left out, found by a binary search in
the filter index. With `count` at least the entities, it is the full ranking.

With reciprocal relations, head prediction (?, r, t) is the tail query (t, r^-1, ?),
as the model was trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from shoal.tasks.kge.candidates import sample_candidates
from shoal.tasks.kge.models import KGEModel
from shoal.tasks.kge.prepared.filter_index import GraphFilter, SplitAnswers


class QueryAnswers(Protocol):
    """The known answers of a list of queries, by position."""

    def rows(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(row within [start, stop), entity) pairs of the queries start..stop-1."""
        ...


@dataclass
class Answers:
    """Per query, in CSR form: the entities that complete it into a known true triple."""

    offsets: np.ndarray
    entities: np.ndarray

    def rows(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(row within [start, stop), entity) pairs of the queries start..stop-1."""
        lo, hi = int(self.offsets[start]), int(self.offsets[stop])
        counts = np.diff(self.offsets[start : stop + 1])
        rows = np.repeat(np.arange(stop - start), counts)
        return torch.from_numpy(rows), torch.from_numpy(self.entities[lo:hi])


def _answers(known_keys: np.ndarray, known_values: np.ndarray, keys: np.ndarray) -> Answers:
    """For each of `keys`, every value paired with it in (known_keys, known_values). Vectorised."""
    order = np.argsort(known_keys, kind="stable")
    sorted_keys, sorted_values = known_keys[order], known_values[order]
    lo = np.searchsorted(sorted_keys, keys, side="left")
    hi = np.searchsorted(sorted_keys, keys, side="right")
    counts = hi - lo
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    within = np.arange(offsets[-1]) - np.repeat(offsets[:-1], counts)
    return Answers(offsets, sorted_values[np.repeat(lo, counts) + within])


@dataclass
class FilterIndex:
    """The known answers of a split's tail queries (h, r, ?) and head queries (?, r, t)."""

    tails: QueryAnswers
    heads: QueryAnswers

    @classmethod
    def of_split(cls, graph: GraphFilter, triples: torch.Tensor) -> FilterIndex:
        """The answers of `triples`' queries, looked up in a prepared graph's index on disk
        as each batch is ranked."""
        return cls(
            tails=SplitAnswers(graph, triples.numpy(), head=False),
            heads=SplitAnswers(graph, triples.numpy(), head=True),
        )

    @classmethod
    def build(cls, known: torch.Tensor, triples: torch.Tensor, num_relations: int) -> FilterIndex:
        k, q = known.numpy(), triples.numpy()
        n = num_relations  # a query (entity, relation) is keyed entity * n + relation
        return cls(
            tails=_answers(k[:, 0] * n + k[:, 1], k[:, 2], q[:, 0] * n + q[:, 1]),
            heads=_answers(k[:, 2] * n + k[:, 1], k[:, 0], q[:, 2] * n + q[:, 1]),
        )


def realistic_ranks(
    scores: torch.Tensor,
    target: torch.Tensor,
    exclude_rows: torch.Tensor | None = None,
    exclude_entities: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rank of each row's `target` column: 1 + #greater + #equal / 2 (float64).

    `exclude_*` are (row, entity) pairs left out of the comparison (the filter);
    `scores` is modified in place.
    """
    scores = torch.nan_to_num_(scores, nan=-torch.inf)
    rows = torch.arange(len(target))
    true = scores[rows, target].clone()
    # an excluded entry becomes NaN: neither greater than nor equal to anything
    if exclude_rows is not None and exclude_entities is not None and len(exclude_rows):
        scores[exclude_rows, exclude_entities] = torch.nan
    scores[rows, target] = torch.nan  # the target itself is neither greater nor a tie
    greater = (scores > true[:, None]).sum(dim=1)
    equal = (scores == true[:, None]).sum(dim=1)
    return 1.0 + greater.double() + equal.double() / 2.0


@torch.no_grad()
def rank_triples(
    model: KGEModel,
    triples: torch.Tensor,
    answers: FilterIndex | None,
    start: int,
    stop: int,
    batch_size: int,
    block_elements: int,
    device: torch.device,
) -> torch.Tensor:
    """Filtered ranks of triples[start:stop], tail then head prediction per batch (float64, CPU)."""
    served = model.served  # tables on a parameter server: candidates stream in blocks
    candidates = model.all_entities() if served is None else None
    ranks = []
    for lo in range(start, stop, batch_size):
        hi = min(lo + batch_size, stop)
        batch = triples[lo:hi].to(device)
        h, r, t = batch[:, 0], batch[:, 1], batch[:, 2]
        for side in ("tail", "head"):
            head = side == "head"
            anchor_ids, target = (t, h) if head else (h, t)
            anchor = (
                candidates[anchor_ids] if candidates is not None else model.entity_rows(anchor_ids)
            )
            relation = model.relation_rows(model.relation_ids(r, head))
            queries = model.queries(anchor, relation, head)
            if candidates is not None:
                scores = model.score_all(queries, candidates, block_elements).float()
            else:
                assert served is not None
                blocks = [
                    model.score_all(queries, model.prepare_entities(block), block_elements)
                    for block in served.entity_blocks()
                ]
                scores = torch.cat(blocks, dim=1).float()
            rows = entities = None
            if answers is not None:
                rows, entities = (answers.tails if side == "tail" else answers.heads).rows(lo, hi)
                rows, entities = rows.to(device), entities.to(device)
            ranks.append(realistic_ranks(scores, target, rows, entities).cpu())
    return torch.cat(ranks) if ranks else torch.zeros(0, dtype=torch.float64)


@torch.no_grad()
def rank_sampled(
    model: KGEModel,
    triples: torch.Tensor,
    known: GraphFilter | None,
    start: int,
    stop: int,
    count: int,
    num_entities: int,
    seed: int,
    batch_size: int,
    block_elements: int,
    device: torch.device,
) -> torch.Tensor:
    """Ranks of triples[start:stop] among `count` sampled entities per query and side, tail
    then head prediction per batch (float64, CPU); `known` filters them (None: raw).

    Candidate j of query i is keyed by i, the triple's index in `triples`, so the draws do
    not depend on the batch or the worker."""
    ranks = []
    for lo in range(start, stop, batch_size):
        hi = min(lo + batch_size, stop)
        batch = triples[lo:hi].numpy()
        h, r, t = batch[:, 0], batch[:, 1], batch[:, 2]
        for head in (False, True):
            anchor, target = (t, h) if head else (h, t)
            drawn = sample_candidates(seed, head, np.arange(lo, hi), target, count, num_entities)
            columns = np.concatenate([target[:, None], drawn], axis=1)  # the answer first
            scores = _score_columns(model, anchor, r, head, columns, block_elements, device)
            rows = entities = None
            if known is not None:
                others = known.side(head).contains(known.keys(anchor, r), drawn)
                found_rows, found_columns = np.nonzero(others)
                rows = torch.from_numpy(found_rows).to(device)
                entities = torch.from_numpy(found_columns + 1).to(device)
            answer = torch.zeros(len(batch), dtype=torch.long, device=device)
            ranks.append(realistic_ranks(scores, answer, rows, entities).cpu())
    return torch.cat(ranks) if ranks else torch.zeros(0, dtype=torch.float64)


def _score_columns(
    model: KGEModel,
    anchor: np.ndarray,
    relation: np.ndarray,
    head: bool,
    columns: np.ndarray,
    block_elements: int,
    device: torch.device,
) -> torch.Tensor:
    """(n, columns) scores: query i against the entities of row i of `columns`, the
    gathered (rows x columns x width) intermediate cut to at most `block_elements`."""
    anchor_ids = torch.from_numpy(anchor).to(device)
    relation_ids = model.relation_ids(torch.from_numpy(relation).to(device), head)
    queries = model.queries(model.entity_rows(anchor_ids), model.relation_rows(relation_ids), head)
    ids, where = torch.unique(torch.from_numpy(columns).to(device), return_inverse=True)
    rows = model.entity_rows(ids)
    width = rows.shape[-1]
    step = max(1, block_elements // max(1, columns.shape[1] * width))
    parts = [
        model.match_each(queries[lo : lo + step], rows[where[lo : lo + step]]).float()
        for lo in range(0, len(columns), step)
    ]
    return torch.cat(parts) if parts else queries.new_zeros(0, columns.shape[1])


def rank_metric_sums(ranks: torch.Tensor, hits_at: list[int]) -> list[float]:
    """[count, sum of 1/rank, sum of rank, hits@k counts...]: additive over ranks and workers."""
    sums = [float(len(ranks)), float((1.0 / ranks).sum()), float(ranks.sum())]
    return sums + [float((ranks <= k).sum()) for k in hits_at]


def metrics_from_sums(sums: list[float], hits_at: list[int]) -> dict[str, float]:
    count = max(sums[0], 1.0)
    metrics = {"mrr": sums[1] / count, "mr": sums[2] / count}
    for k, hits in zip(hits_at, sums[3:], strict=True):
        metrics[f"hits@{k}"] = hits / count
    return metrics
