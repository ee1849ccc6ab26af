"""Negative sampling: counter-based draws, Bernoulli sides, degree-proportional entities."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shoal.tasks.kge.config import NegativeSamplingConfig
from shoal.tasks.kge.sampling import NegativeSampler, counter_uniform, head_corruption_probability


def test_counter_uniform_is_a_function_of_its_arguments() -> None:
    keys = np.arange(1000)
    a = counter_uniform(7, 1, 3, keys, 16)
    assert a.shape == (1000, 16) and a.min() >= 0 and a.max() < 1
    np.testing.assert_array_equal(a, counter_uniform(7, 1, 3, keys, 16))
    np.testing.assert_array_equal(a[500:], counter_uniform(7, 1, 3, keys[500:], 16))
    assert not np.array_equal(a, counter_uniform(7, 1, 4, keys, 16))  # another epoch
    assert not np.array_equal(a, counter_uniform(8, 1, 3, keys, 16))  # another seed
    draws = counter_uniform(7, 1, 3, np.arange(20000), 16)
    counts = np.histogram(draws, bins=20, range=(0, 1))[0]
    expected = draws.size / 20
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 43.8  # the 0.999 quantile of chi-square with 19 degrees of freedom


def test_bernoulli_side_follows_tails_per_head() -> None:
    """Relation 0 is one-to-many (one head, 3 tails): P(corrupt head) = 3 / (3 + 1);
    relation 1 is many-to-one: 1 / (1 + 3)."""
    triples = torch.tensor([[0, 0, 1], [0, 0, 2], [0, 0, 3], [1, 1, 0], [2, 1, 0], [3, 1, 0]])
    probability = head_corruption_probability(triples, 2)
    assert probability.tolist() == pytest.approx([0.75, 0.25])
    sampler = NegativeSampler(NegativeSamplingConfig(side="bernoulli"), triples, 4, 2, seed=0)
    relations = torch.zeros(20000, dtype=torch.long)
    (drawn,) = sampler.sample(torch.arange(20000), relations)
    assert isinstance(drawn.head, torch.Tensor)
    share = drawn.head.float().mean().item()
    assert share == pytest.approx(0.75, abs=0.02)


def test_degree_proportional_negatives() -> None:
    triples = torch.tensor([[0, 0, 1], [0, 0, 2], [0, 0, 3], [0, 0, 1]])  # degrees 4, 2, 1, 1
    config = NegativeSamplingConfig(num_negatives=64, chunk_size=1, distribution="degree")
    (drawn,) = NegativeSampler(config, triples, 5, 1, seed=1).sample(
        torch.arange(500), torch.zeros(500, dtype=torch.long)
    )
    share = np.bincount(drawn.entities.numpy().ravel(), minlength=5) / drawn.entities.numel()
    np.testing.assert_allclose(share, [0.5, 0.25, 0.125, 0.125, 0.0], atol=0.01)


def test_shared_negatives_per_chunk_and_independent_of_how_a_batch_is_split() -> None:
    triples = torch.randint(0, 50, (200, 3)) % torch.tensor([50, 3, 50])
    config = NegativeSamplingConfig(num_negatives=8, chunk_size=16)
    sampler = NegativeSampler(config, triples, 50, 3, seed=0)
    sampler.set_epoch(2)
    batch = torch.randperm(200)[:64]
    (whole,) = sampler.sample(batch, triples[batch, 1])
    assert whole.entities.shape == (4, 8)  # 64 positives in chunks of 16 share 8 negatives each
    halves = [sampler.sample(part, triples[part, 1])[0] for part in (batch[:32], batch[32:])]
    assert torch.equal(torch.cat([h.entities for h in halves]), whole.entities)
    heads = [h.head for h in halves]
    assert isinstance(whole.head, torch.Tensor) and all(isinstance(h, torch.Tensor) for h in heads)
    assert torch.equal(torch.cat(heads), whole.head)  # type: ignore[arg-type]
    sampler.set_epoch(3)
    assert not torch.equal(sampler.sample(batch, triples[batch, 1])[0].entities, whole.entities)
