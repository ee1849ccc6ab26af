"""Negative sampling: each positive triple against sampled corruptions of it.

The rows of every entity a batch touches (heads, tails, every side's negatives) are
gathered once (the sparse-table path, and what a parameter-server worker pulls);
each side of each positive is a query matched against the negatives of its chunk,
i // chunk_size, which for a chunk is one (chunk_size x width) x (width x K) product.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from shoal.tasks.kge.config import KGETaskConfig
from shoal.tasks.kge.models import KGEModel
from shoal.tasks.kge.sampling import NegativeSampler, SideNegatives
from shoal.tasks.kge.training_types.base import TrainingType, sample_relation_ids
from shoal.tasks.kge.triples import KGData


class NegativeSampling(TrainingType):
    """A sample is a training triple; its loss sums one term per corrupted side."""

    def __init__(self, config: KGETaskConfig, data: KGData, seed: int) -> None:
        super().__init__(config, data, seed)
        self.sampler = NegativeSampler(
            config.negatives, data.train, self.num_entities, self.num_relations, seed, data.stats
        )

    @property
    def train_size(self) -> int:
        return len(self.data.train)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def batch(self, indices: torch.Tensor, device: torch.device) -> dict[str, Any]:
        triples = self.data.train[indices]
        sides = self.sampler.sample(indices, triples[:, 1])
        return {"triples": triples.to(device), "sides": [side.to(device) for side in sides]}

    def rows_touched(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        triples, sides = batch["triples"], batch["sides"]
        entities = [triples[:, 0], triples[:, 2], *(side.entities.reshape(-1) for side in sides)]
        relations = [triples[:, 1]]
        if self.config.model.reciprocal:
            relations.append(triples[:, 1] + self.num_relations)
        return torch.unique(torch.cat(entities)), torch.unique(torch.cat(relations))

    def scored_loss(
        self, model: KGEModel, batch: dict[str, Any]
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        scored, entities, relations = score_sides(
            model, batch["triples"], batch["sides"], self.config.negatives.chunk_size
        )
        losses = [self.loss_fn.sampled(pos, neg) for pos, neg in scored]
        return torch.stack(losses).sum(dim=0), entities, relations


def score_sides(
    model: KGEModel, triples: torch.Tensor, sides: list[SideNegatives], chunk_size: int
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[torch.Tensor], list[torch.Tensor]]:
    """Per side: scores of the positives (n,) and of their negatives (n, K); then the entity
    and relation rows each positive uses (before dropout), for regularization."""
    n = len(triples)
    h, r, t = triples[:, 0], triples[:, 1], triples[:, 2]
    negatives = [side.entities.reshape(-1) for side in sides]
    ids, where = torch.unique(torch.cat([h, t, *negatives]), return_inverse=True)
    # one gather for every use, by index_select (backward: one index_add_, no sort), split
    # into its uses (backward: one cat; slices would each zero-fill a gradient of it all)
    sizes = [n, n, *(len(part) for part in negatives)]
    head, tail, *negative_rows = model.entity_rows(ids).index_select(0, where).split(sizes)
    penalised = sample_relation_ids(model, r)
    wanted = penalised + [model.relation_ids(r, side.head) for side in sides]
    relation_ids, relation_where = torch.unique(torch.cat(wanted), return_inverse=True)
    relation_table = model.relation_rows(relation_ids)
    relation_parts = relation_table.index_select(0, relation_where).split(n)
    head_used, tail_used = model.drop_entities(head), model.drop_entities(tail)
    scored = []
    for index, side in enumerate(sides):
        candidates = negative_rows[index].view(*side.entities.shape, -1)
        relation = model.drop_relations(relation_parts[len(penalised) + index])
        if isinstance(side.head, bool):
            anchor, target = (tail_used, head_used) if side.head else (head_used, tail_used)
        else:
            anchor = torch.where(side.head[:, None], tail_used, head_used)
            target = torch.where(side.head[:, None], head_used, tail_used)
        queries = model.queries(anchor, relation, side.head)
        positive = model.match_rows(queries, target)
        negative = match_chunks(model, queries, model.drop_entities(candidates), chunk_size)
        scored.append((positive, negative))
    return scored, [head, tail], list(relation_parts[: len(penalised)])


def match_chunks(
    model: KGEModel, queries: torch.Tensor, candidates: torch.Tensor, chunk_size: int
) -> torch.Tensor:
    """(n, K) scores: query i against the candidates of its chunk, i // chunk_size."""
    n = len(queries)
    chunks, k = candidates.shape[:2]
    chunk = min(chunk_size, n)
    if chunk == 1:
        return model.match_each(queries, candidates)
    padded = F.pad(queries, (0, 0, 0, chunks * chunk - n)).view(chunks, chunk, -1)
    return model.match(padded, candidates).reshape(chunks * chunk, k)[:n]
