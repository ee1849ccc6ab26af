"""Negative sampling, drawn from counter-based random numbers.

Every draw is a pure function of (seed, epoch, sample index, slot): a hash
(SplitMix64's finalizer) of those numbers, like Philox in cuRAND and JAX. So the
negatives of a triple do not depend on which worker trains it, in which order, or
whether the run was resumed in between: N data-parallel workers draw exactly the
negatives one process draws, and a resumed run draws what an uninterrupted one
would have.

Shared negatives (`chunk_size` > 1, DGL-KE's "joint" sampling): consecutive
positives of a batch form chunks; a chunk draws one set of `num_negatives`
entities, keyed by its first sample index, and each of its positives is scored
against all of them, which is one matrix product per chunk.

Sides: by default each positive is corrupted on one side (`side`: uniform or
Bernoulli). With `num_negatives_s` / `num_negatives_o` every positive is
corrupted on both sides, each side with its own count and its own stream of
draws: one `SideNegatives` per side, one loss term per side.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from shoal.tasks.kge.config import NegativeSamplingConfig

_STREAM_SIDE = 0x5ADE
_STREAM_ENTITY = 0xE17  # one side per positive
_STREAM_HEADS = 0xE18  # both sides: the heads
_STREAM_TAILS = 0xE19  # both sides: the tails

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: a bijection of uint64 that scatters every input bit."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def counter_uniform(seed: int, stream: int, epoch: int, keys: np.ndarray, slots: int) -> np.ndarray:
    """Uniform floats in [0, 1) of shape (len(keys), slots), a function of the arguments alone."""
    with np.errstate(over="ignore"):
        head = mix64(np.array([seed, stream, epoch], dtype=np.uint64))
        base = mix64(mix64(head[0] ^ head[1]) ^ head[2])
        per_key = mix64(base ^ mix64(keys.astype(np.uint64)))
        bits = mix64(per_key[:, None] ^ mix64(np.arange(slots, dtype=np.uint64))[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


@dataclass
class TrainStats:
    """What negative sampling needs to know of the training triples, without reading them:
    each entity's degree, each relation's counts. A prepared graph stores both; small
    graphs in memory count them here (`from_triples`), with the same results."""

    #: (entities, 2): occurrences as head, as tail (repeated triples counted)
    entity_degree: np.ndarray
    #: (relations, 3): triples, distinct heads, distinct tails
    relation_counts: np.ndarray

    @classmethod
    def from_triples(
        cls, triples: torch.Tensor, num_entities: int, num_relations: int
    ) -> TrainStats:
        h, r, t = (triples[:, i].numpy() for i in range(3))
        degree = np.stack(
            [np.bincount(h, minlength=num_entities), np.bincount(t, minlength=num_entities)], axis=1
        )
        keys = max(num_entities, int(max(h.max(), t.max())) + 1)
        counts = np.stack(
            [
                np.bincount(r, minlength=num_relations),
                np.bincount(np.unique(r * keys + h) // keys, minlength=num_relations),
                np.bincount(np.unique(r * keys + t) // keys, minlength=num_relations),
            ],
            axis=1,
        )
        return cls(degree, counts)

    def head_probability(self) -> torch.Tensor:
        """P(corrupt the head) per relation, tph / (tph + hpt) (Wang et al., 2014, "TransH").

        tph is the mean number of tails per (head, relation), hpt the mean number of
        heads per (relation, tail). For a one-to-many relation, replacing the head is
        less likely to produce a triple that is in fact true.
        """
        count = self.relation_counts[:, 0].astype(np.float64)
        tph = count / np.maximum(self.relation_counts[:, 1], 1)
        hpt = count / np.maximum(self.relation_counts[:, 2], 1)
        probability = np.where(count > 0, tph / np.maximum(tph + hpt, 1e-12), 0.5)
        return torch.from_numpy(probability)

    def degree(self) -> np.ndarray:
        """Occurrences of each entity, as head or tail."""
        return np.asarray(self.entity_degree[:, 0] + self.entity_degree[:, 1])


def head_corruption_probability(triples: torch.Tensor, num_relations: int) -> torch.Tensor:
    """Bernoulli's P(corrupt the head) per relation of in-memory `triples` (`TrainStats`)."""
    num_entities = int(max(triples[:, 0].max(), triples[:, 2].max())) + 1
    return TrainStats.from_triples(triples, num_entities, num_relations).head_probability()


@dataclass
class SideNegatives:
    """One side's corruptions of a batch of positives.

    `head[i]` says whether positive i's head is replaced (else its tail): one value per
    positive, or one bool for every positive (a fixed side); `entities[c]` are the
    replacement entities of chunk c, which covers positives
    [c * chunk_size, (c + 1) * chunk_size).
    """

    head: torch.Tensor | bool
    entities: torch.Tensor

    def to(self, device: torch.device) -> SideNegatives:
        head = self.head.to(device) if isinstance(self.head, torch.Tensor) else self.head
        return SideNegatives(head, self.entities.to(device))


class NegativeSampler:
    """Draws each positive's corrupted side and the replacement entities of each chunk."""

    def __init__(
        self,
        config: NegativeSamplingConfig,
        train: torch.Tensor,
        num_entities: int,
        num_relations: int,
        seed: int,
        stats: TrainStats | None = None,
    ) -> None:
        """`stats` of `train` (a prepared graph's); counted from `train` when not given."""
        self.config = config
        self.num_entities = num_entities
        self.seed = seed
        self.epoch = 0
        needs_stats = config.side == "bernoulli" or config.distribution == "degree"
        if stats is None and needs_stats:
            stats = TrainStats.from_triples(train, num_entities, num_relations)
        if config.side == "bernoulli":
            assert stats is not None
            self.head_probability = stats.head_probability()
        else:
            self.head_probability = torch.full((num_relations,), 0.5, dtype=torch.float64)
        self.cumulative: np.ndarray | None = None
        if config.distribution == "degree":
            assert stats is not None
            self.cumulative = np.cumsum(stats.degree().astype(np.float64))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def sample(self, indices: torch.Tensor, relations: torch.Tensor) -> list[SideNegatives]:
        """Corruptions of the positives with sample ids `indices` (of relations `relations`):
        one `SideNegatives` per loss term."""
        keys = indices.numpy()
        chunk_keys = keys[:: self.config.chunk_size]
        sides = []
        for side, count in self.config.side_counts:
            if side == "either":
                u_side = counter_uniform(self.seed, _STREAM_SIDE, self.epoch, keys, 1)[:, 0]
                head: torch.Tensor | bool = (
                    torch.from_numpy(u_side) < self.head_probability[relations]
                )
                stream = _STREAM_ENTITY
            else:
                head = side == "head"
                stream = _STREAM_HEADS if head else _STREAM_TAILS
            u = counter_uniform(self.seed, stream, self.epoch, chunk_keys, count)
            sides.append(SideNegatives(head, torch.from_numpy(self.entities_at(u))))
        return sides

    def entities_at(self, u: np.ndarray) -> np.ndarray:
        """Entities for uniform draws `u`: uniform over entities, or by degree (inverse CDF)."""
        if self.cumulative is None:
            ids = (u * self.num_entities).astype(np.int64)
            return np.minimum(ids, self.num_entities - 1)
        ids = np.searchsorted(self.cumulative, u * self.cumulative[-1], side="right")
        return np.minimum(ids, self.num_entities - 1).astype(np.int64)
