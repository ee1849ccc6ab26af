"""Aggregators: sum a flat gradient bucket over all ranks, in place, asynchronously.

The contract every method shares: `start` is called with a bucket as soon as
its gradients are ready and returns a handle; after `handle.wait()` the bucket
holds the sum over ranks, identical on every rank (so replicas stay identical).
The trainer scales the loss by 1/global_batch, so the sum is the global mean
gradient.

Methods other than `native` are written as *blocking* `all_reduce_` and
`all_gather` on the aggregator's private group (:mod:`shoal.comm.links`), and
`start` runs them on a communication thread (:mod:`shoal.comm.threads`), in the
order buckets were started. Compression (:mod:`shoal.comm.compression`) wraps
any of them and calls the same two operations.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
import torch.distributed as dist

from shoal.comm.links import CommGroup
from shoal.comm.threads import CommThread


class PendingReduction(Protocol):
    def wait(self) -> object: ...


@dataclass(frozen=True)
class BucketSpec:
    """What a bucket holds: its buffer and the parameters laid out in it, in order."""

    index: int
    buffer: torch.Tensor
    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]


class Aggregator(ABC):
    """Sums flat buckets across the process group."""

    def bind(self, buckets: Sequence[BucketSpec]) -> None:  # noqa: B027 - optional hook
        """Learn the buckets' layout once, before the first step (compressors need shapes)."""

    @abstractmethod
    def start(self, bucket: torch.Tensor) -> PendingReduction:
        """Begin summing `bucket` over all ranks; the result lands in `bucket`."""

    def take_sent_bytes(self) -> int:
        """Bytes this rank sent since the last call."""
        return 0

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's own state (compression residuals); the same keys and shapes on every rank."""
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:  # noqa: B027
        """Restore what `state_dict` returned on this rank."""


class BlockingAggregator(Aggregator):
    """A method given as blocking `all_reduce_` / `all_gather`, run on a communication thread.

    `all_gather` defaults to an all-reduce of a zero-filled `[world_size, n]`
    buffer in which each rank fills its own row: correct for every method, at
    twice the bandwidth of a dedicated all-gather (ring and native override it).
    """

    method: ClassVar[str]

    def __init__(self, links: CommGroup) -> None:
        self.links = links
        self._thread: CommThread | None = None
        self._reported_bytes = 0
        self._scratch: dict[torch.dtype, torch.Tensor] = {}

    @classmethod
    def from_config(cls, config: Any, links: CommGroup) -> BlockingAggregator:
        """Build from the method's `[strategy.aggregation]` config."""
        return cls(links)

    @property
    def rank(self) -> int:
        return self.links.rank

    @property
    def world_size(self) -> int:
        return self.links.world_size

    def start(self, bucket: torch.Tensor) -> PendingReduction:
        if self._thread is None:
            self._thread = CommThread(f"shoal-{self.method}", self.links.timeout_s)
        return self._thread.submit(lambda: self.all_reduce_(bucket), f"{self.method} all-reduce")

    @abstractmethod
    def all_reduce_(self, tensor: torch.Tensor) -> None:
        """Sum `tensor` (contiguous, 1-D) over all ranks, in place; blocks until done."""

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's 1-D `tensor` (equal lengths), as the rows of a [world_size, n] tensor."""
        rows = torch.zeros(self.world_size, tensor.numel(), dtype=tensor.dtype)
        rows[self.rank].copy_(tensor)
        self.all_reduce_(rows.view(-1))
        return rows

    def scratch(self, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """A reusable receive buffer (fresh allocations of many MiB cost page faults each step)."""
        buffer = self._scratch.get(dtype)
        if buffer is None or buffer.numel() < numel:
            buffer = torch.empty(numel, dtype=dtype)
            self._scratch[dtype] = buffer
        return buffer[:numel]

    def take_sent_bytes(self) -> int:
        sent = self.links.sent_bytes - self._reported_bytes
        self._reported_bytes = self.links.sent_bytes
        return sent


class NativeAllReduce(BlockingAggregator):
    """The backend's own all-reduce (gloo: ring / halving-doubling; NCCL: ring / tree).

    Its traffic is not visible to shoal; `sent_bytes` counts what a
    bandwidth-optimal all-reduce sends per rank, 2 (n - 1) / n of the bucket
    (gloo's ring for large messages), and (n - 1) x the input for an all-gather.
    """

    method = "native"

    def start(self, bucket: torch.Tensor) -> PendingReduction:
        self._count_all_reduce(bucket)
        work = dist.all_reduce(bucket, op=dist.ReduceOp.SUM, group=self.links.group, async_op=True)
        assert work is not None  # async_op=True always returns a Work
        return work

    def all_reduce_(self, tensor: torch.Tensor) -> None:
        if self.world_size == 1 or tensor.numel() == 0:
            return
        self._count_all_reduce(tensor)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.links.group)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        rows = torch.empty(self.world_size, tensor.numel(), dtype=tensor.dtype)
        if self.world_size == 1 or tensor.numel() == 0:
            rows.copy_(tensor.view(1, -1).expand_as(rows))
            return rows
        self.links.sent_bytes += (self.world_size - 1) * tensor.numel() * tensor.element_size()
        dist.all_gather(list(rows.unbind(0)), tensor, group=self.links.group)
        return rows

    def _count_all_reduce(self, tensor: torch.Tensor) -> None:
        n = self.world_size
        if n > 1:
            nbytes = tensor.numel() * tensor.element_size()
            self.links.sent_bytes += math.ceil(2 * (n - 1) * nbytes / n)
