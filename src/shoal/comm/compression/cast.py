"""`fp16` / `bf16`: send the bucket in half precision, sum, and cast back.

Halves the bytes of every method. The sum is accumulated in the low precision
along the method's path, so each addition rounds to 8 (bf16) or 11 (fp16)
significant bits; fp16 also flushes magnitudes below 6e-8 to zero (gradients of a
loss divided by a large batch can be that small: prefer bf16, which has
float32's range). No error feedback: the rounding error is unbiased noise far
below the gradient noise.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from shoal.comm.aggregators import BlockingAggregator, BucketSpec
from shoal.comm.compression.base import Compressor


class CastCompressor(Compressor):
    """Casts buckets to `dtype` for the reduction."""

    dtype: ClassVar[torch.dtype]

    def reduce_(
        self, bucket: torch.Tensor, spec: BucketSpec, transport: BlockingAggregator
    ) -> None:
        if bucket.dtype == self.dtype:
            transport.all_reduce_(bucket)
            return
        low = bucket.to(self.dtype)
        transport.all_reduce_(low)
        bucket.copy_(low)


class Float16Cast(CastCompressor):
    """`kind = "fp16"`: IEEE half precision."""

    kind = "fp16"
    dtype = torch.float16


class BFloat16Cast(CastCompressor):
    """`kind = "bf16"`: bfloat16, float32's range with 8 significant bits."""

    kind = "bf16"
    dtype = torch.bfloat16
