"""Gradient buckets: views, order of launches, accumulation without communication, and the
step's agreement carried by the last bucket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from pydantic import TypeAdapter
from torch import nn

from shoal.comm.aggregators import Aggregator, PendingReduction
from shoal.comm.buckets import BucketedGradientSync, plan_buckets
from shoal.comm.config import AggregationConfig
from shoal.comm.links import CommGroup
from shoal.comm.methods import build_aggregator
from shoal.runtime.stop import STOP
from shoal.shape.hosts import Hosts
from tests.comm.group import TIMEOUT_S, run_in_group


class _Done:
    def wait(self) -> None:
        return None


class RecordingAggregator(Aggregator):
    """The reduction over a world of one (the identity), recording what it was given."""

    def __init__(self) -> None:
        self.launched: list[int] = []

    def start(self, bucket: torch.Tensor) -> PendingReduction:
        self.launched.append(bucket.data_ptr())
        return _Done()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3)
    )


def test_plan_respects_cap_and_dtype() -> None:
    params = [
        ("a", nn.Parameter(torch.zeros(1000))),
        ("b", nn.Parameter(torch.zeros(1000))),
        ("c", nn.Parameter(torch.zeros(1000, dtype=torch.float64))),
        ("d", nn.Parameter(torch.zeros(5000))),
    ]
    groups = plan_buckets(params, cap_bytes=6000)
    assert [[n for n, _ in g] for g in groups] == [["a"], ["b"], ["c"], ["d"]]
    groups = plan_buckets(params[:2], cap_bytes=10_000)
    assert [[n for n, _ in g] for g in groups] == [["a", "b"]]


def test_grads_are_views_and_buckets_launch_in_order_during_backward() -> None:
    model = _model()
    aggregator = RecordingAggregator()
    sync = BucketedGradientSync(model, aggregator, cap_mb=64 * 64 * 4 / 2**20)
    assert len(sync.buckets) >= 2
    order = [b.buffer.data_ptr() for b in sync.buckets]
    sync.zero_grad()
    with sync.accumulate(last=True):
        model(torch.randn(5, 8)).sum().backward()
        assert aggregator.launched == order, "every bucket launched during backward, in order"
    sync.finish()
    for bucket in sync.buckets:
        for param, view in zip(bucket.params, bucket.views, strict=True):
            assert param.grad is view
    expected = _model()
    expected(torch.randn(5, 8))


def test_gradients_match_plain_backward() -> None:
    torch.manual_seed(1)
    x = torch.randn(7, 8)
    plain = _model()
    plain(x).square().sum().backward()
    bucketed = _model()
    sync = BucketedGradientSync(bucketed, RecordingAggregator(), cap_mb=0.01)
    sync.zero_grad()
    with sync.accumulate(last=True):
        bucketed(x).square().sum().backward()
    sync.finish()
    for p, q in zip(plain.parameters(), bucketed.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)


def test_micro_batches_communicate_once() -> None:
    model = _model()
    aggregator = RecordingAggregator()
    sync = BucketedGradientSync(model, aggregator, cap_mb=0.01)
    sync.zero_grad()
    for index in range(4):
        with sync.accumulate(last=index == 3):
            model(torch.randn(3, 8)).sum().backward()
        if index < 3:
            assert aggregator.launched == [], "no communication before the last micro-batch"
    sync.finish()
    assert len(aggregator.launched) == len(sync.buckets)


def test_unused_parameters_still_reduce() -> None:
    model = _model()
    model.add_module("unused", nn.Linear(2, 2))
    aggregator = RecordingAggregator()
    sync = BucketedGradientSync(model, aggregator, cap_mb=0.001)
    sync.zero_grad()
    with sync.accumulate(last=True):
        model[:5](torch.randn(3, 8)).sum().backward()
    sync.finish()
    assert len(aggregator.launched) == len(sync.buckets), "finish() launches the rest"


def test_grads_land_in_views_after_every_step() -> None:
    """zero_grad drops gradients; after each step every .grad is its bucket view again."""
    model = _model()
    sync = BucketedGradientSync(model, RecordingAggregator(), cap_mb=1)
    views = {v.data_ptr() for b in sync.buckets for v in b.views}
    for _ in range(3):
        sync.zero_grad()
        assert all(p.grad is None for p in model.parameters())
        with sync.accumulate(last=True):
            model(torch.randn(4, 8)).sum().backward()
        sync.finish()
        assert {p.grad.data_ptr() for p in model.parameters()} == views


def test_unused_parameter_gets_zero_gradient_not_a_stale_one() -> None:
    model = _model()
    model.add_module("unused", nn.Linear(2, 2))
    sync = BucketedGradientSync(model, RecordingAggregator(), cap_mb=0.001)
    sync.zero_grad()
    with sync.accumulate(last=True):
        (model[:5](torch.randn(3, 8)).sum() + model.unused(torch.ones(1, 2)).sum()).backward()
    sync.finish()
    assert model.unused.weight.grad.abs().sum() > 0
    sync.zero_grad()
    with sync.accumulate(last=True):
        model[:5](torch.randn(3, 8)).sum().backward()
    sync.finish()
    assert torch.equal(model.unused.weight.grad, torch.zeros(2, 2))


def _agreement_rides_on_the_last_bucket(rank: int, world_size: int, method: str) -> None:
    """Each rank's non-finite flag and stop signal arrive with the summed gradients: no
    all-reduce of its own when all is well, the names gathered when a flag is up."""
    hosts = Hosts.from_ranks([("host", "127.0.0.1")] * world_size)
    links = CommGroup.create(rank, world_size, hosts, TIMEOUT_S)
    aggregator = build_aggregator(
        TypeAdapter(AggregationConfig).validate_python({"method": method}), links
    )
    model = _model()
    sync = BucketedGradientSync(model, aggregator, cap_mb=64 * 64 * 4 / 2**20)
    assert sync.carrier == (rank, world_size) and len(sync.buckets) >= 2
    calls: list[int] = []
    real = dist.all_reduce

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    for step, (bad_rank, signal) in enumerate([(None, 0), (None, 15), (1, 0)]):
        STOP.reset()
        STOP.signum = signal if rank == world_size - 1 else 0
        sync.zero_grad()
        with sync.accumulate(last=True):
            loss = model(torch.randn(5, 8)).sum()
            if rank == bad_rank:
                loss = loss * float("nan")
            loss.backward()
        sync.finish()
        dist.all_reduce = counted  # type: ignore[assignment]
        try:
            agreed = sync.agree(None)
        finally:
            dist.all_reduce = real
        assert STOP.take_agreed() == signal, step
        if bad_rank is None:
            assert agreed.nonfinite == {} and not calls, step  # no collective at all
        else:
            assert set(agreed.nonfinite) == {bad_rank}
            assert "0.weight" in agreed.nonfinite[bad_rank]
    STOP.reset()


@pytest.mark.parametrize("method", ["native", "ring", "hierarchical"])
def test_the_steps_agreement_rides_on_the_last_bucket(tmp_path: Path, method: str) -> None:
    assert run_in_group(3, _agreement_rides_on_the_last_bucket, tmp_path, method) == [0, 1, 2]


def test_a_compressed_aggregator_agrees_with_an_all_reduce_of_its_own() -> None:
    """Compression would round or drop the tail: no carrier, the buckets hold gradients only."""
    model = _model()
    sync = BucketedGradientSync(model, RecordingAggregator(), cap_mb=1.0)
    assert sync.carrier is None
    assert sum(b.buffer.numel() for b in sync.buckets) == sum(p.numel() for p in model.parameters())
