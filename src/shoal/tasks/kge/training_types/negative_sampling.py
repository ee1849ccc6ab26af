"""Negative sampling: each positive triple against sampled corruptions of it.

The rows of every entity a batch touches (heads, tails, every side's negatives) are
gathered once (the sparse-table path, and what a parameter-server worker pulls);
each side of each positive is a query matched against the negatives of its chunk,
i // chunk_size, which for a chunk is one (chunk_size x width) x (width x K) product.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from shoal.tasks.kge import compiled_scoring
from shoal.tasks.kge.config import KGETaskConfig
from shoal.tasks.kge.losses import KGELoss
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
        scored, entities, relations = score_sides(model, batch["triples"], batch["sides"])
        tensors = [scored.head, scored.tail, *scored.relations, *scored.candidates]
        heads = [h for h in scored.heads if isinstance(h, torch.Tensor)]
        losses = compiled_scoring.call(
            side_losses, self.compiled, model, self.loss_fn, tensors + heads,
            scored.head, scored.tail, scored.relations, scored.candidates, scored.heads,
            self.config.negatives.chunk_size,
        )  # fmt: skip
        return losses, entities, relations


@dataclass
class ScoredRows:
    """What a batch's sides are scored from: the rows as the score reads them (dropout
    applied), per side its relation rows, its negatives' rows (chunks, K, width) and which
    side it corrupts (True: heads, False: tails, or one bool per positive)."""

    head: torch.Tensor
    tail: torch.Tensor
    relations: list[torch.Tensor]
    candidates: list[torch.Tensor]
    heads: list[bool | torch.Tensor]


def score_sides(
    model: KGEModel, triples: torch.Tensor, sides: list[SideNegatives]
) -> tuple[ScoredRows, list[torch.Tensor], list[torch.Tensor]]:
    """The rows every side is scored from; then the entity and relation rows each positive
    uses (before dropout), for regularization."""
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
    scored = ScoredRows(
        model.drop_entities(head),
        model.drop_entities(tail),
        [model.drop_relations(relation_parts[len(penalised) + i]) for i in range(len(sides))],
        [
            model.drop_entities(rows.view(*side.entities.shape, -1))
            for rows, side in zip(negative_rows, sides, strict=True)
        ],
        [side.head for side in sides],
    )
    return scored, [head, tail], list(relation_parts[: len(penalised)])


def side_losses(
    model: KGEModel,
    loss_fn: KGELoss,
    head: torch.Tensor,
    tail: torch.Tensor,
    relations: list[torch.Tensor],
    candidates: list[torch.Tensor],
    heads: list[bool | torch.Tensor],
    chunk_size: int,
) -> torch.Tensor:
    """Per-positive losses (n,), summed over the sides: each side's positives and negatives
    scored from their rows (`ScoredRows`), then the loss. No random draws: what
    `compiled_scoring` compiles."""
    total = torch.zeros((), dtype=head.dtype)
    for relation, side_candidates, side_head in zip(relations, candidates, heads, strict=True):
        if isinstance(side_head, bool):
            anchor, target = (tail, head) if side_head else (head, tail)
        else:
            anchor = torch.where(side_head[:, None], tail, head)
            target = torch.where(side_head[:, None], head, tail)
        queries = model.queries(anchor, relation, side_head)
        positive = model.match_rows(queries, target)
        negative = match_chunks(model, queries, side_candidates, chunk_size)
        total = total + loss_fn.sampled(positive, negative)
    return total


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
