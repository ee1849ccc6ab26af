"""The knowledge-graph embedding task: a training type's loss, filtered ranking evaluation."""

from __future__ import annotations

import sys
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from shoal.protocols.capabilities import ServedTable
from shoal.protocols.task import LossOutput, Task, rank_slice
from shoal.runtime.collectives import all_reduce_sum
from shoal.runtime.context import WorkerContext
from shoal.tasks.kge import compiled_scoring
from shoal.tasks.kge.config import KGETaskConfig, LogisticLossConfig, MarginRankingLossConfig
from shoal.tasks.kge.evaluation import (
    FilterIndex,
    metrics_from_sums,
    rank_metric_sums,
    rank_sampled,
    rank_triples,
)
from shoal.tasks.kge.export import export_embeddings, write_id_maps
from shoal.tasks.kge.models import KGEModel, RowSource, build_kge_model, relation_table_rows
from shoal.tasks.kge.prepared.progress import PrepareProgress
from shoal.tasks.kge.training_types import build_training_type
from shoal.tasks.kge.triples import load_kg
from shoal.training.batching import steps_per_epoch

ROTATE_DEFAULT_GAMMA = 12.0  # RotatE's initialisation range when the loss has no margin


class KGETask(Task):
    """Link prediction: entity and relation embeddings trained on (head, relation, tail) triples.

    The graph is a prepared folder every rank maps (TSV files are prepared into a cache
    on first use): a rank reads the training triples of its own batches, the held-out
    triples it ranks and the filter index entries of their queries, nothing else.
    Training follows `task.training`: negative sampling (each positive triple against
    corruptions of it, shared within chunks), 1vsAll or KvsAll (queries against every
    entity); its loss is a sum over the batch's samples. Evaluation is the filtered
    ranking of every valid/test triple against all entities, or against sampled ones
    (`evaluation.ranking`), split over the ranks. Test metrics come from the best model
    by validation MRR.
    """

    config_class: ClassVar[type[KGETaskConfig]] = KGETaskConfig

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        config = ctx.config.task
        assert isinstance(config, KGETaskConfig)
        self.config = config
        self.data = load_kg(
            config.data, _prepare_progress(ctx), stall_s=ctx.config.faults.timeout_s
        )
        self.num_entities = len(self.data.entities)
        self.num_relations = len(self.data.relations)
        # sparse gradients (allowed by KGETaskConfig.check): torch's default, said explicitly:
        # left implicit, the first sparse optimizer step of every run warns that the checks
        # are "implicitly disabled" (a user who turned the checks on keeps them)
        if config.sparse_gradients and not torch.sparse.check_sparse_tensor_invariants.is_enabled():
            torch.sparse.check_sparse_tensor_invariants.disable()
        self.training = build_training_type(config, self.data, ctx.config.train.seed)
        train = ctx.config.train
        per_epoch = steps_per_epoch(self.training.train_size, train.batch_size, train.drop_last)
        planned = [n for n in (train.max_steps, train.epochs and train.epochs * per_epoch) if n]
        self.training.compiled = compiled_scoring.planned(
            config.compiled_scoring, min(planned) if planned else None
        )
        self._ranked: dict[str, torch.Tensor] = {}
        self.embeddings_dir = ctx.paths.root / "embeddings"
        if ctx.is_main:
            write_id_maps(self.embeddings_dir, self.data.entities, self.data.relations)
        for split in self.data.splits.values():
            if split.unseen:
                ctx.log.warning(
                    "%s: %d triples name an entity or relation absent from training; they are "
                    'left out of evaluation (task.data.unseen = "skip")',
                    split.path,
                    split.unseen,
                )
        ctx.log.info(
            "kge data: %d entities, %d relations, %d training triples, %s",
            self.num_entities,
            self.num_relations,
            len(self.data.train),
            ", ".join(f"{n} {len(s.triples)}" for n, s in self.data.splits.items()) or "no splits",
        )

    # ------------------------------------------------------------ the Task contract
    @property
    def train_size(self) -> int:
        return self.training.train_size

    @property
    def relation_rows(self) -> int:
        """Rows of the relation table (twice the relations with reciprocal relations)."""
        return relation_table_rows(self.num_relations, self.config.model)

    @property
    def relation_labels(self) -> list[str]:
        """A name per relation row: the relations, then (reciprocal) their inverses."""
        labels = list(self.data.relations.labels)
        if self.config.model.reciprocal:
            labels += [f"{label}^-1" for label in self.data.relations.labels]
        return labels

    def build_model(self) -> nn.Module:
        loss = self.config.loss
        gamma = ROTATE_DEFAULT_GAMMA
        if isinstance(loss, LogisticLossConfig | MarginRankingLossConfig) and loss.margin > 0:
            gamma = loss.margin
        model = build_kge_model(
            self.config.model, self.num_entities, self.num_relations, self.config.dim, gamma
        )
        model.sparse = self.config.sparse_gradients
        return model

    def set_epoch(self, epoch: int) -> None:
        self.training.set_epoch(epoch)

    @property
    def batch_unit(self) -> int:
        """A chunk of positives shares one set of negatives, keyed by its first sample."""
        return self.config.negatives.chunk_size

    def train_batch(self, indices: torch.Tensor) -> dict[str, Any]:
        return self.training.batch(indices, self.ctx.device)

    def rows_touched(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The unique entity and relation ids a training batch reads: what a parameter-server
        worker pulls for it (heads, tails and negatives; relations)."""
        return self.training.rows_touched(batch)

    def loss(self, model: nn.Module, batch: Any) -> LossOutput:
        assert isinstance(model, KGEModel)
        return self.training.loss(model, batch)

    # ------------------------------------------------------------ served tables
    def served_tables(self) -> dict[str, ServedTable]:
        return {
            "entity": ServedTable(self.data.entities.labels),
            "relation": ServedTable(self.relation_labels, small=True),
        }

    def table_weights(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The model's tables by name (a model built on the meta device: their shapes)."""
        assert isinstance(model, KGEModel)
        return {"entity": model.entity.weight, "relation": model.relation.weight}

    def initial_rows(self, model: nn.Module, table: str, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of `table` as `model` starts (a function of its key and the ids)."""
        assert isinstance(model, KGEModel)
        return model.initial_rows(table, ids)

    def serve(self, model: nn.Module, source: RowSource) -> None:
        """The model reads its rows from `source` from now on; its tables are dropped."""
        assert isinstance(model, KGEModel)
        model.serve_tables(source)

    def rows_held(self, samples: int) -> tuple[int, int]:
        """Heads and tails of `samples` positives and every chunk's shared negatives; a
        relation per positive (and its reciprocal)."""
        negatives = self.config.negatives
        chunks = -(-samples // negatives.chunk_size)
        per_chunk = sum(count for _, count in negatives.side_counts)
        entities = min(self.num_entities, 2 * samples + chunks * per_chunk)
        return entities, min(self.relation_rows, 2 * samples)

    def eval_batch_size(self) -> int:
        return self.config.evaluation.batch_size

    def eval_splits(self) -> list[str]:
        return ["valid"] if "valid" in self.data.splits else []

    def test_splits(self) -> list[str]:
        return ["test"] if "test" in self.data.splits else []

    def summary(self) -> dict[str, Any]:
        return {
            "entities": self.num_entities,
            "relations": self.num_relations,
            "train_triples": len(self.data.train),
            **{f"{n}_triples": len(s.triples) for n, s in self.data.splits.items()},
            **{f"{n}_unseen_skipped": s.unseen for n, s in self.data.splits.items()},
        }

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        if split not in self.data.splits:
            return {}
        assert isinstance(model, KGEModel)
        evaluation = self.config.evaluation
        triples = self._split_for_ranking(split)
        part = rank_slice(len(triples), self.ctx.rank, self.ctx.world_size)
        was_training = model.training
        model.eval()
        if evaluation.ranking == "sampled":
            assert evaluation.sampled_negatives is not None
            ranks = rank_sampled(
                model,
                triples,
                self.data.filter if evaluation.filtered else None,
                part.start,
                part.stop,
                evaluation.sampled_negatives,
                self.num_entities,
                self.ctx.config.train.seed,
                evaluation.batch_size,
                evaluation.block_elements,
                self.ctx.device,
            )
        else:
            answers = FilterIndex.of_split(self.data.filter, triples)
            ranks = rank_triples(
                model,
                triples,
                answers if evaluation.filtered else None,
                part.start,
                part.stop,
                evaluation.batch_size,
                evaluation.block_elements,
                self.ctx.device,
            )
        model.train(was_training)
        sums = all_reduce_sum(self.ctx, rank_metric_sums(ranks, evaluation.hits_at))
        return metrics_from_sums(sums, evaluation.hits_at)

    def save_artifacts(self, model: nn.Module) -> None:
        if self.ctx.is_main:
            assert isinstance(model, KGEModel)
            export_embeddings(self.embeddings_dir, model, self.config)

    # ------------------------------------------------------------ helpers
    def _split_for_ranking(self, split: str) -> torch.Tensor:
        """The triples ranked for `split` (a fixed sample with max_triples); their known
        answers are looked up in the graph's filter index as each batch is ranked."""
        if split not in self._ranked:
            triples = self.data.splits[split].triples
            limit = self.config.evaluation.max_triples
            if limit is not None and limit < len(triples):
                chosen = np.sort(np.random.default_rng(0).permutation(len(triples))[:limit])
                triples = triples[torch.from_numpy(chosen)]
            self._ranked[split] = triples
        return self._ranked[split]


def _prepare_progress(ctx: WorkerContext) -> PrepareProgress:
    """How a rank that prepares a TSV graph shows it: a bar on a terminal, log lines else."""
    mode = ctx.config.monitor.progress
    if mode == "off":
        return PrepareProgress("off", ctx.log.info)  # still logs what it prepared
    if mode == "bar" or (mode == "auto" and sys.stderr.isatty()):
        return PrepareProgress("bar", ctx.log.info)
    return PrepareProgress("plain", ctx.log.info)
