"""Compression keeps its promises: error feedback loses nothing, only delays it.

Run on a world of one (no process group needed): the sum over ranks is then this
rank's own compressed contribution, which is exactly what the bookkeeping is about.
"""

from __future__ import annotations

import pytest
import torch

from shoal.comm.aggregators import BucketSpec
from shoal.comm.compression.base import CompressedAggregator, Compressor
from shoal.comm.compression.powersgd import PowerSGDCompressor
from shoal.comm.compression.sparse import RandomKCompressor, TopKCompressor, keep_count
from shoal.comm.links import CommGroup
from shoal.comm.ring import RingAllReduce
from shoal.shape.hosts import Hosts

SHAPES = ((24, 40), (40,), (7, 3, 5), (11,))
NUMEL = sum(torch.Size(s).numel() for s in SHAPES)


def _aggregator(compressor: Compressor) -> tuple[CompressedAggregator, torch.Tensor]:
    links = CommGroup(rank=0, world_size=1, hosts=Hosts.single(1), timeout_s=10)
    aggregator = CompressedAggregator(compressor, RingAllReduce(links))
    bucket = torch.zeros(NUMEL)
    names = tuple(f"p{i}" for i in range(len(SHAPES)))
    aggregator.bind([BucketSpec(0, bucket, names, tuple(torch.Size(s) for s in SHAPES))])
    return aggregator, bucket


COMPRESSORS = {
    "topk-1%": lambda: TopKCompressor(ratio=0.01),
    "topk-10%": lambda: TopKCompressor(ratio=0.1),
    "randomk-5%": lambda: RandomKCompressor(ratio=0.05),
    "powersgd-r1": lambda: PowerSGDCompressor(rank=1),
}


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_error_feedback_conserves_mass(name: str) -> None:
    """sum over steps of what was sent + the residual == sum of the true gradients."""
    aggregator, bucket = _aggregator(COMPRESSORS[name]())
    generator = torch.Generator().manual_seed(0)
    true_sum = torch.zeros(NUMEL, dtype=torch.float64)
    sent_sum = torch.zeros(NUMEL, dtype=torch.float64)
    for _ in range(30):
        gradient = torch.randn(NUMEL, generator=generator)
        true_sum += gradient.double()
        bucket.copy_(gradient)
        aggregator.start(bucket).wait()
        sent_sum += bucket.double()
    residual = aggregator.state_dict()["0.residual"].double()
    torch.testing.assert_close(sent_sum + residual, true_sum, rtol=0, atol=1e-4)
    assert residual.abs().sum() > 0, "something was held back: the test would be vacuous"


def test_topk_sends_the_largest_entries_and_carries_the_rest() -> None:
    aggregator, bucket = _aggregator(TopKCompressor(ratio=0.01))
    k = keep_count(0.01, NUMEL)
    gradient = torch.randn(NUMEL, generator=torch.Generator().manual_seed(1))
    bucket.copy_(gradient)
    aggregator.start(bucket).wait()
    sent = bucket.nonzero().flatten()
    assert len(sent) == k
    assert set(sent.tolist()) == set(gradient.abs().topk(k).indices.tolist())
    # a small entry is not lost: fed back every step, it is eventually sent
    smallest = int(gradient.abs().argmin())
    assert aggregator.state_dict()["0.residual"][smallest] == gradient[smallest]
    for _ in range(NUMEL // k + 1):
        bucket.zero_()
        aggregator.start(bucket).wait()
        if bucket[smallest] != 0:
            break
    assert bucket[smallest] == pytest.approx(gradient[smallest].item(), rel=1e-6)


def test_momentum_correction_conserves_the_velocity() -> None:
    """DGC: what is sent plus what is accumulated equals the sum of the momentum velocities."""
    momentum = 0.9
    aggregator, bucket = _aggregator(TopKCompressor(ratio=0.05, momentum_correction=momentum))
    generator = torch.Generator().manual_seed(2)
    sent_sum = torch.zeros(NUMEL, dtype=torch.float64)
    velocity = torch.zeros(NUMEL, dtype=torch.float64)
    for _ in range(20):
        gradient = torch.randn(NUMEL, generator=generator)
        bucket.copy_(gradient)
        before = aggregator.state_dict().get("0.momentum", torch.zeros(NUMEL)).double()
        aggregator.start(bucket).wait()
        velocity += momentum * before + gradient.double()  # u_t before masking
        sent_sum += bucket.double()
    accumulated = aggregator.state_dict()["0.accumulated"].double()
    torch.testing.assert_close(sent_sum + accumulated, velocity, rtol=0, atol=1e-3)


def test_powersgd_is_exact_on_a_low_rank_gradient() -> None:
    aggregator, bucket = _aggregator(PowerSGDCompressor(rank=2))
    generator = torch.Generator().manual_seed(3)
    low_rank = torch.randn(24, 2, generator=generator) @ torch.randn(2, 40, generator=generator)
    bucket.zero_()
    bucket[: 24 * 40] = low_rank.reshape(-1)
    aggregator.start(bucket).wait()
    torch.testing.assert_close(bucket[: 24 * 40].view(24, 40), low_rank, rtol=1e-4, atol=1e-4)
