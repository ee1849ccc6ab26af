"""Gradient buckets: parameters' .grad tensors are views into a few flat buffers.

Why: reducing one large flat buffer is far cheaper than one collective per
parameter, and a bucket can be sent as soon as all its gradients exist, while
backward is still computing the rest (the overlap DDP gets from its reducer).
Parameters are bucketed in reverse registration order, the order in which
backward produces their gradients, and buckets are launched strictly in index
order so that every rank issues the same collectives in the same sequence.
Because .grad *is* the buffer, there is no copy in or out.

When the aggregator sums exactly (every method without compression), the last
bucket launched also carries the step's agreement (`training/nonfinite.py`): a
tail of one non-finite flag and one stop signal per rank, small integers that
any summation order keeps exact. Every bucket is checked before it is launched,
in index order, so the flags are complete when the last one goes; the step then
needs no all-reduce of its own to agree (the names of non-finite gradients are
gathered only when a flag is up, on every rank alike).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from shoal.comm.aggregators import Aggregator, BlockingAggregator, BucketSpec, PendingReduction
from shoal.runtime.stop import STOP
from shoal.training.contracts import GradientSync
from shoal.training.nonfinite import agree_on_nonfinite, agreed_from, is_finite, nonfinite_names

FIRST_BUCKET_BYTES = 1 << 20  # a small first bucket starts communication early, as in DDP


@dataclass
class Bucket:
    index: int
    buffer: torch.Tensor  # what the aggregator sums: the gradients, then the agreement's tail
    params: list[nn.Parameter]
    names: list[str]
    views: list[torch.Tensor] = field(default_factory=list)
    pending: int = 0
    grads: torch.Tensor = field(init=False)  # the buffer's gradients (all but the tail)

    def __post_init__(self) -> None:
        self.grads = self.buffer[: sum(p.numel() for p in self.params)]


def plan_buckets(
    named_params: list[tuple[str, nn.Parameter]], cap_bytes: int
) -> list[list[tuple[str, nn.Parameter]]]:
    """Group parameters (already in backward order) into buckets of at most ~cap_bytes.

    A bucket holds one dtype on one device; a parameter larger than the cap gets a
    bucket of its own.
    """
    groups: list[list[tuple[str, nn.Parameter]]] = []
    current: list[tuple[str, nn.Parameter]] = []
    size = 0
    limit = min(FIRST_BUCKET_BYTES, cap_bytes)
    for name, param in named_params:
        nbytes = param.numel() * param.element_size()
        compatible = not current or (
            current[0][1].dtype == param.dtype and current[0][1].device == param.device
        )
        if current and (not compatible or size + nbytes > limit):
            groups.append(current)
            current, size, limit = [], 0, cap_bytes
        current.append((name, param))
        size += nbytes
    if current:
        groups.append(current)
    return groups


class BucketedGradientSync(GradientSync):
    """Reduces gradient buckets with an aggregator, overlapping the backward pass."""

    def __init__(
        self,
        model: nn.Module,
        aggregator: Aggregator,
        cap_mb: float,
        broadcast_buffers: bool = True,
    ) -> None:
        self.aggregator = aggregator
        # Buffers (batch-norm statistics) are not trained by gradients; rank 0's copy wins.
        self.buffers = [b for b in model.buffers() if b.numel()] if broadcast_buffers else []
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.buckets: list[Bucket] = []
        groups = plan_buckets(named[::-1], int(cap_mb * (1 << 20)))
        #: (rank, world size) whose agreement rides on the last bucket (None: an all-reduce)
        self.carrier = _carrier(aggregator)
        for index, group in enumerate(groups):
            first = group[0][1]
            total = sum(p.numel() for _, p in group)
            if self.carrier is not None and index == len(groups) - 1:
                total += 2 * self.carrier[1]  # the tail: flags, then stop signals
            buffer = torch.zeros(total, dtype=first.dtype, device=first.device)
            bucket = Bucket(index, buffer, [p for _, p in group], [n for n, _ in group])
            offset = 0
            for _, param in group:
                bucket.views.append(buffer[offset : offset + param.numel()].view_as(param))
                offset += param.numel()
            self.buckets.append(bucket)
        self._bucket_of: dict[int, tuple[Bucket, int]] = {}
        for bucket in self.buckets:
            for slot, param in enumerate(bucket.params):
                self._bucket_of[id(param)] = (bucket, slot)
                param.grad = bucket.views[slot]
                param.register_post_accumulate_grad_hook(self._on_grad_ready)
        aggregator.bind(
            [
                BucketSpec(b.index, b.buffer, tuple(b.names), tuple(p.shape for p in b.params))
                for b in self.buckets
            ]
        )
        self._armed = False
        self._next_launch = 0
        self._ready: list[bool] = [False] * len(self.buckets)
        self._handles: list[PendingReduction] = []
        self._nonfinite: list[str] = []

    def begin_step(self) -> None:
        for buffer in self.buffers:
            dist.broadcast(buffer, src=0)

    def zero_grad(self) -> None:
        """Drop gradients instead of zeroing the buckets.

        Backward then hands each parameter a fresh gradient, which the hook moves
        into its bucket view once (a copy); zeroing 40 MiB of buckets first and
        adding into them would cost a memset and an extra read every step.
        """
        for bucket in self.buckets:
            for param in bucket.params:
                param.grad = None
            bucket.pending = len(bucket.params)
        self._ready = [False] * len(self.buckets)
        self._next_launch = 0
        self._handles = []
        self._nonfinite = []

    @contextmanager
    def accumulate(self, last: bool) -> Iterator[None]:
        self._armed = last
        try:
            yield
        finally:
            self._armed = False

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        bucket, slot = self._bucket_of[id(param)]
        view = bucket.views[slot]
        if param.grad is not view:  # a fresh gradient: move it into the bucket, keep the view
            if param.grad is not None and param.grad.data_ptr() != view.data_ptr():
                view.copy_(param.grad)
            param.grad = view  # later micro-batches accumulate into the view in place
        if not self._armed:
            return
        bucket.pending -= 1
        if bucket.pending == 0:
            self._ready[bucket.index] = True
            self._launch_ready()

    def _launch_ready(self) -> None:
        while self._next_launch < len(self.buckets) and self._ready[self._next_launch]:
            bucket = self.buckets[self._next_launch]
            self._prepare(bucket)
            self._handles.append(self.aggregator.start(bucket.buffer))
            self._next_launch += 1

    def _prepare(self, bucket: Bucket) -> None:
        """Unscale, and keep non-finite local gradients away from peers and compression state.

        The check must happen here, before the bucket is summed in place: afterwards
        a NaN from one rank is everywhere and nobody can tell whose it was.
        """
        if self.loss_scale != 1.0:
            bucket.grads.div_(self.loss_scale)
        if not is_finite(bucket.grads):
            self._nonfinite += nonfinite_names(zip(bucket.names, bucket.views, strict=True))
            bucket.grads.zero_()
        if self.carrier is not None and bucket.index == len(self.buckets) - 1:
            rank, world_size = self.carrier
            tail = bucket.buffer[bucket.grads.numel() :]
            tail.zero_()
            tail[rank] = 1.0 if self._nonfinite else 0.0
            tail[world_size + rank] = float(STOP.signum)

    def finish(self) -> float:
        """Launch buckets that never filled (unused parameters, empty shards), then wait.

        A parameter that got no gradient this step contributes zeros, as in DDP, so
        every rank reduces the same buckets; the optimizer then sees a zero gradient.
        """
        for index in range(self._next_launch, len(self.buckets)):
            bucket = self.buckets[index]
            for param, view in zip(bucket.params, bucket.views, strict=True):
                if param.grad is None:
                    view.zero_()
                    param.grad = view
            self._ready[index] = True
        self._launch_ready()
        started = time.perf_counter()
        for handle in self._handles:
            handle.wait()
        waited = time.perf_counter() - started
        self._handles = []
        return waited

    def bytes_per_step(self) -> int:
        return sum(b.grads.numel() * b.grads.element_size() for b in self.buckets)

    def nonfinite(self) -> dict[int, list[str]]:
        device = self.buckets[0].buffer.device if self.buckets else torch.device("cpu")
        if self.carrier is None or not self.buckets:
            return agree_on_nonfinite(self._nonfinite, device)
        last = self.buckets[-1]
        tail = last.buffer[last.grads.numel() :].tolist()  # summed: every rank's slots
        world_size = self.carrier[1]
        return agreed_from(self._nonfinite, device, tail[:world_size], tail[world_size:])

    def take_sent_bytes(self) -> int:
        return self.aggregator.take_sent_bytes()

    def rank_state_dict(self) -> dict[str, torch.Tensor]:
        return self.aggregator.state_dict()

    def load_rank_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.aggregator.load_state_dict(state)


def _carrier(aggregator: Aggregator) -> tuple[int, int] | None:
    """(rank, world size) when `aggregator` sums exactly over the whole job (a method
    without compression, on the default group's ranks): its last bucket can carry the
    step's agreement. None otherwise (compression would drop or round the tail)."""
    if not isinstance(aggregator, BlockingAggregator) or not dist.is_initialized():
        return None
    links = aggregator.links
    if links.world_size != dist.get_world_size() or links.rank != dist.get_rank():
        return None
    return links.rank, links.world_size
