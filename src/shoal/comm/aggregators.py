"""Aggregators: sum a flat gradient bucket over all ranks, in place, asynchronously.

The contract every method shares (native now; ring, tree, ... join it): `start`
is called with a bucket as soon as its gradients are ready and returns a handle;
after `handle.wait()` the bucket holds the sum over ranks. The trainer scales the
loss by 1/global_batch, so the sum is the global mean gradient.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

import torch
import torch.distributed as dist

from shoal.registry import Registry


class PendingReduction(Protocol):
    def wait(self) -> object: ...


class Aggregator(ABC):
    """Sums flat buckets across the process group."""

    @abstractmethod
    def start(self, bucket: torch.Tensor) -> PendingReduction:
        """Begin summing `bucket` over all ranks; the result lands in `bucket`."""


class NativeAllReduce(Aggregator):
    """The backend's own all-reduce (gloo: ring/halving-doubling; NCCL: ring/tree)."""

    def start(self, bucket: torch.Tensor) -> PendingReduction:
        work = dist.all_reduce(bucket, op=dist.ReduceOp.SUM, async_op=True)
        assert work is not None  # async_op=True always returns a Work
        return work


AGGREGATORS: Registry[type[Aggregator]] = Registry("aggregation method")
AGGREGATORS.add("native", NativeAllReduce)
