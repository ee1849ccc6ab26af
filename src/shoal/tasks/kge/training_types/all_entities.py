"""1vsAll and KvsAll: queries scored against every entity with one matrix product.

1vsAll (LibKGE `1vsAll`): a sample is a training triple (h, r, t); its loss is the
tail query (h, r, ?) against every entity with t the answer, plus the head query
(?, r, t) with h the answer. KvsAll (Dettmers et al., 2018; LibKGE `KvsAll`): a
sample is a distinct query of the training data, (h, r, ?) or (?, r, t), scored
against every entity with *all* its known answers labelled 1 (optionally smoothed).

Candidates are the whole entity table, so a step reads every row: these types
need the table in the worker (local, data_parallel), not a parameter server.
Entity dropout applies to the candidates as well (LibKGE's `embed_all`), one mask
per side per batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from shoal.tasks.kge.config import KGETaskConfig, KvsAllTraining
from shoal.tasks.kge.models import KGEModel
from shoal.tasks.kge.training_types.base import TrainingType, sample_relation_ids
from shoal.tasks.kge.triples import KGData


def _side_scores(
    model: KGEModel, anchor: torch.Tensor, relation: torch.Tensor, head: bool | torch.Tensor
) -> torch.Tensor:
    """(n, E) scores of the queries built from (undropped) anchor and relation rows."""
    queries = model.queries(model.drop_entities(anchor), model.drop_relations(relation), head)
    return model.match(queries, model.drop_entities(model.all_entities()))


class OneVsAll(TrainingType):
    """A sample is a training triple: its tail query and its head query against every entity."""

    @property
    def train_size(self) -> int:
        return len(self.data.train)

    def batch(self, indices: torch.Tensor, device: torch.device) -> dict[str, Any]:
        return {"triples": self.data.train[indices].to(device)}

    def scored_loss(
        self, model: KGEModel, batch: dict[str, Any]
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        triples = batch["triples"]
        h, r, t = triples[:, 0], triples[:, 1], triples[:, 2]
        head, tail = model.entity_rows(h), model.entity_rows(t)
        losses = torch.zeros(len(triples), device=triples.device)
        for is_head, anchor, answer in ((False, head, t), (True, tail, h)):
            relation = model.relation_rows(model.relation_ids(r, is_head))
            scores = _side_scores(model, anchor, relation, is_head)
            losses = losses + self.loss_fn.all_entities(scores, answer)
        relations = [model.relation_rows(ids) for ids in sample_relation_ids(model, r)]
        return losses, [head, tail], relations


class KvsAll(TrainingType):
    """A sample is a distinct query of the training triples, with all its known answers.

    Queries are ordered tail queries (h, r, ?) first, then head queries (?, r, t), each
    sorted by (entity, relation): a fixed numbering, so the epoch's shuffled batches
    are a function of the seed as for triples. Weighted regularization counts the rows
    a query reads: its entity and the relation row it uses.
    """

    def __init__(self, config: KGETaskConfig, data: KGData, seed: int) -> None:
        super().__init__(config, data, seed)
        assert isinstance(config.training, KvsAllTraining)
        self.smoothing = config.training.label_smoothing
        train = data.train.numpy()
        parts = [
            _queries(train[:, 0], train[:, 1], train[:, 2], self.num_relations, head=False),
            _queries(train[:, 2], train[:, 1], train[:, 0], self.num_relations, head=True),
        ]
        self.anchor = torch.from_numpy(np.concatenate([p[0] for p in parts]))
        self.relation = torch.from_numpy(np.concatenate([p[1] for p in parts]))
        self.head = torch.from_numpy(np.concatenate([p[2] for p in parts]))
        counts = np.concatenate([p[3] for p in parts])
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.answers = np.concatenate([p[4] for p in parts])

    @property
    def train_size(self) -> int:
        return len(self.anchor)

    def batch(self, indices: torch.Tensor, device: torch.device) -> dict[str, Any]:
        chosen = indices.numpy()
        counts = self.offsets[chosen + 1] - self.offsets[chosen]
        starts = np.repeat(self.offsets[chosen], counts)
        within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        rows = torch.from_numpy(np.repeat(np.arange(len(chosen)), counts))
        columns = torch.from_numpy(self.answers[starts + within])
        labels = torch.zeros(len(chosen), self.num_entities)
        labels[rows, columns] = 1.0
        if self.smoothing > 0:
            labels = (1.0 - self.smoothing) * labels + 1.0 / self.num_entities
        return {
            "anchor": self.anchor[indices].to(device),
            "relation": self.relation[indices].to(device),
            "head": self.head[indices].to(device),
            "labels": labels.to(device),
        }

    def scored_loss(
        self, model: KGEModel, batch: dict[str, Any]
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        anchor = model.entity_rows(batch["anchor"])
        relation = model.relation_rows(model.relation_ids(batch["relation"], batch["head"]))
        scores = _side_scores(model, anchor, relation, batch["head"])
        losses = self.loss_fn.all_entities(scores, batch["labels"])
        return losses, [anchor], [relation]


def _queries(
    anchors: np.ndarray, relations: np.ndarray, answers: np.ndarray, num_relations: int, head: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Distinct (anchor, relation) queries sorted by key, their answer counts and answers."""
    keys = anchors.astype(np.int64) * num_relations + relations
    order = np.lexsort((answers, keys))
    keys, answers = keys[order], answers[order]
    distinct, counts = np.unique(keys, return_counts=True)
    flags = np.full(len(distinct), head)
    return distinct // num_relations, distinct % num_relations, flags, counts, answers
