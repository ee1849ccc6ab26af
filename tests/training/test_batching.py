"""Data sharding and the learning-rate schedule."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
import torch

from shoal.training import batching
from shoal.training.batching import (
    EpochPlan,
    local_share,
    micro_batches,
    steps_per_epoch,
)
from shoal.training.optim import WarmupDecay
from shoal.training.permutation import KeyedPermutation


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize(("samples", "batch"), [(100, 10), (101, 7), (13, 20), (9, 4)])
def test_every_sample_exactly_once_per_epoch(
    world_size: int, samples: int, batch: int, limit: str
) -> None:
    plan = EpochPlan(samples, batch, epoch=2, seed=5)
    seen: list[int] = []
    for step in range(plan.num_steps):
        global_batch = plan.global_batch(step)
        shares = [local_share(global_batch, r, world_size) for r in range(world_size)]
        sizes = [len(s) for s in shares]
        assert max(sizes) - min(sizes) <= 1, "shares differ by at most one sample"
        assert torch.equal(torch.cat(shares), global_batch), "shares tile the global batch in order"
        seen += torch.cat(shares).tolist()
    assert sorted(seen) == list(range(samples))


def _order(plan: EpochPlan) -> torch.Tensor:
    return torch.cat([plan.global_batch(step) for step in range(plan.num_steps)])


@pytest.fixture(params=["numpy", "keyed"])
def limit(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both orders: NumPy's permutation (small epochs) and the keyed one (large epochs)."""
    if request.param == "keyed":
        monkeypatch.setattr(batching, "MATERIALISED_SAMPLES", 0)
    return str(request.param)


def test_global_batches_depend_on_seed_and_epoch_not_world_size(limit: str) -> None:
    a = _order(EpochPlan(50, 8, epoch=0, seed=1))
    assert torch.equal(a, _order(EpochPlan(50, 8, epoch=0, seed=1)))  # any rank, a resume
    assert not torch.equal(a, _order(EpochPlan(50, 8, epoch=1, seed=1)))
    assert not torch.equal(a, _order(EpochPlan(50, 8, epoch=0, seed=2)))
    assert torch.equal(_order(EpochPlan(50, 8, epoch=0, seed=1, shuffle=False)), torch.arange(50))


@pytest.mark.parametrize("samples", [1, 2, 3, 1000, 4097])
def test_up_to_the_limit_the_order_is_numpys_permutation_bit_for_bit(samples: int) -> None:
    """The order every run before had: NumPy's int64 permutation for (seed, epoch)."""
    plan = EpochPlan(samples, 7, epoch=3, seed=11)
    expected = np.random.default_rng([11, 3]).permutation(samples)
    assert torch.equal(_order(plan), torch.from_numpy(expected))
    assert plan.global_batch(0).dtype == torch.int64


def test_an_epoch_beyond_the_limit_holds_no_order_of_its_samples() -> None:
    """200M samples: NumPy's order would take 1.6 GB as int64 (0.8 GB as int32); the plan
    and a block of batches of it take less than 1 MiB of the Python heap, NumPy's arrays
    included."""
    samples = 200_000_000
    tracemalloc.start()
    try:
        plan = EpochPlan(samples, 1024, epoch=0, seed=1)
        batch = plan.global_batch(plan.num_steps // 2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(batch) == 1024 and int(batch.min()) >= 0 and int(batch.max()) < samples
    assert peak < 1 << 20, f"{peak / 2**20:.1f} MiB traced"
    assert samples > batching.MATERIALISED_SAMPLES


@pytest.mark.parametrize("batch", [1000, 4096, 20000])
def test_keyed_batches_computed_by_blocks_are_the_keyed_order(
    batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches are cut from blocks of the keyed order; visited in any order (a resume, a
    step revisited), each is the order's own slice, also where the batch does not divide
    the block or exceeds it."""
    monkeypatch.setattr(batching, "MATERIALISED_SAMPLES", 0)
    samples = 100_003
    plan = EpochPlan(samples, batch, epoch=4, seed=9)
    order = KeyedPermutation(samples, 9, 4)
    last = plan.num_steps - 1
    for step in [0, 1, 17, 3, last, 2, last - 1, 17]:
        start = step * batch
        expected = order.at(start, min(start + batch, samples))
        assert torch.equal(plan.global_batch(step), torch.from_numpy(expected)), step
    assert len(plan.global_batch(last)) == samples - last * batch
    plan.global_batch(1).fill_(-1)  # a caller changing its batch leaves the block as it was
    assert torch.equal(plan.global_batch(1), torch.from_numpy(order.at(batch, 2 * batch)))


def test_drop_last_and_step_counts(limit: str) -> None:
    assert steps_per_epoch(101, 10, drop_last=False) == 11
    assert steps_per_epoch(101, 10, drop_last=True) == 10
    plan = EpochPlan(101, 10, epoch=0, seed=0, drop_last=True)
    assert plan.num_steps == 10 and all(len(plan.global_batch(s)) == 10 for s in range(10))


def test_micro_batches_cover_the_share() -> None:
    parts = micro_batches(torch.arange(10), 3)
    assert [len(p) for p in parts] == [4, 3, 3]
    assert [len(p) for p in micro_batches(torch.arange(2), 4)] == [1, 1, 0, 0]


def test_warmup_then_cosine_decay() -> None:
    factor = WarmupDecay(warmup_steps=4, total_steps=14, decay="cosine", min_ratio=0.1)
    assert [factor(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert factor(4) == pytest.approx(1.0)
    assert factor(9) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert factor(14) == pytest.approx(0.1)
    assert factor(100) == pytest.approx(0.1)


def test_linear_and_constant_schedules() -> None:
    linear = WarmupDecay(0, 10, "linear", 0.0)
    assert [linear(s) for s in (0, 5, 10)] == pytest.approx([1.0, 0.5, 0.0])
    assert WarmupDecay(0, 10, "constant", 0.0)(7) == 1.0


@pytest.mark.parametrize(("size", "chunk"), [(32, 4), (31, 4), (10, 16), (7, 1)])
def test_shares_and_micro_batches_are_whole_units_of_the_batch_on_any_world_size(
    size: int, chunk: int
) -> None:
    """Every sample once, in order, and every share (and micro-batch) starts on a unit of
    the whole batch."""
    batch = torch.randperm(100)[:size]
    for world_size in (1, 2, 3, 5):
        for split in (
            [local_share(batch, r, world_size, chunk) for r in range(world_size)],
            micro_batches(batch, world_size, chunk),
        ):
            assert torch.equal(torch.cat(split), batch)
            starts = [sum(len(s) for s in split[:r]) for r in range(world_size) if len(split[r])]
            assert all(start % chunk == 0 for start in starts)
    assert [len(local_share(torch.arange(32), r, 3, 4)) for r in range(3)] == [12, 12, 8]
    assert [len(p) for p in micro_batches(torch.arange(32), 3, 8)] == [16, 8, 8]
