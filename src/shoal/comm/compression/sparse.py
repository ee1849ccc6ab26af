"""Sparsification with error feedback: top-k (with optional DGC momentum) and random-k.

Error feedback (Seide et al., 2014; Stich et al., 2018; Karimireddy et al.,
2019): each rank adds what it did not send before to this step's gradient,
p = g + e, sends a sparse part c of p, and keeps e <- p - c for the next step.
Nothing is lost, only delayed: the sum over steps of what was sent plus the
residual equals the sum of the gradients, which is why top-k at 1% still
converges like dense SGD.

Top-k sends the k = ceil(ratio * n) entries of largest magnitude. Ranks pick
different indices, so the (index, value) pairs are all-gathered and every rank
adds all of them into a zeroed bucket in rank order: (n - 1) * k * 8 bytes per
rank on a ring instead of 2 (n - 1) / n * 4 bytes per entry of the bucket.

Momentum correction (Deep Gradient Compression, Lin et al., 2018): with
momentum m, the momentum is applied locally before sparsification, u <- m u + g,
v <- v + u, the top-k of v is sent, and both v and u are cleared where sent
(momentum factor masking). The optimizer then runs without momentum.

Random-k sends k entries at indices drawn from a generator seeded identically on
every rank (k draws with replacement, duplicates merged), so all ranks pick the
same indices and only the values travel, by the method's all-reduce.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from shoal.comm.aggregators import BlockingAggregator, BucketSpec
from shoal.comm.compression.base import Compressor


def keep_count(ratio: float, numel: int) -> int:
    """Entries kept out of `numel`: ceil(ratio * numel), at least one of a non-empty bucket."""
    return min(numel, max(1, math.ceil(ratio * numel))) if numel else 0


class TopKCompressor(Compressor):
    """`kind = "topk"`: the largest-magnitude entries, with error feedback."""

    kind = "topk"

    def __init__(
        self, ratio: float, error_feedback: bool = True, momentum_correction: float = 0.0
    ) -> None:
        super().__init__()
        self.ratio = ratio
        self.error_feedback = error_feedback
        self.momentum = momentum_correction

    @classmethod
    def from_config(cls, config: Any) -> Compressor:
        return cls(config.ratio, config.error_feedback, config.momentum_correction)

    def reduce_(
        self, bucket: torch.Tensor, spec: BucketSpec, transport: BlockingAggregator
    ) -> None:
        numel = bucket.numel()
        if numel == 0:
            return
        shape, dtype = (numel,), bucket.dtype
        if self.momentum:
            velocity = self.tensor(spec, "momentum", shape, dtype)
            velocity.mul_(self.momentum).add_(bucket)
            accumulated = self.tensor(spec, "accumulated", shape, dtype)
            accumulated.add_(velocity)
            candidate = accumulated
        elif self.error_feedback:
            candidate = bucket.add_(self.tensor(spec, "residual", shape, dtype))
        else:
            candidate = bucket
        k = keep_count(self.ratio, numel)
        index = torch.topk(candidate.abs(), k, sorted=False).indices
        values = candidate[index]
        if self.momentum:
            accumulated[index] = 0
            velocity[index] = 0
        elif self.error_feedback:
            residual = self.state[f"{spec.index}.residual"]
            residual.copy_(candidate)
            residual[index] = 0
        index_dtype = torch.int32 if numel < 2**31 else torch.int64
        all_index = transport.all_gather(index.to(index_dtype))
        all_values = transport.all_gather(values)
        bucket.zero_()
        for rank in range(transport.world_size):  # rank order: the same sum on every rank
            bucket.index_add_(0, all_index[rank].long(), all_values[rank])


class RandomKCompressor(Compressor):
    """`kind = "randomk"`: entries at shared random indices, with error feedback."""

    kind = "randomk"

    def __init__(self, ratio: float, error_feedback: bool = True, seed: int = 0) -> None:
        super().__init__()
        self.ratio = ratio
        self.error_feedback = error_feedback
        self.seed = seed

    @classmethod
    def from_config(cls, config: Any) -> Compressor:
        return cls(config.ratio, config.error_feedback, config.seed)

    def _indices(self, spec: BucketSpec, numel: int) -> torch.Tensor:
        k = keep_count(self.ratio, numel)
        if k == numel:
            return torch.arange(numel)
        calls = self.tensor(spec, "calls", (1,), torch.int64)  # the same count on every rank
        seed = np.random.SeedSequence([self.seed, spec.index, int(calls.item())])
        generator = torch.Generator().manual_seed(int(seed.generate_state(1)[0]))
        calls += 1
        return torch.randint(numel, (k,), generator=generator).unique()

    def reduce_(
        self, bucket: torch.Tensor, spec: BucketSpec, transport: BlockingAggregator
    ) -> None:
        numel = bucket.numel()
        if numel == 0:
            return
        if self.error_feedback:
            bucket.add_(self.tensor(spec, "residual", (numel,), bucket.dtype))
        index = self._indices(spec, numel)
        values = bucket[index]
        if self.error_feedback:
            residual = self.state[f"{spec.index}.residual"]
            residual.copy_(bucket)
            residual[index] = 0
        transport.all_reduce_(values)
        bucket.zero_()
        bucket[index] = values
