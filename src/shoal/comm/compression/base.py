"""The compression seam: a compressor turns a bucket into less traffic over any method.

A :class:`Compressor` replaces this rank's bucket with the (approximate) sum
over ranks, using only the blocking `all_reduce_` and `all_gather` of a
transport (native, ring, tree, hierarchical or parameter server), so every
compressor composes with every exact method. :class:`CompressedAggregator` runs
it on a communication thread, bucket by bucket as backward produces them.

Lossy compressors keep per-rank state (error-feedback residuals, momentum,
warm-started factors) by bucket index. It is part of the job's state: the
strategy gathers every rank's tensors into the checkpoint so resume is exact.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from shoal.comm.aggregators import Aggregator, BlockingAggregator, BucketSpec, PendingReduction
from shoal.comm.threads import CommThread


class Compressor(ABC):
    """Turns one rank's bucket into the compressed sum over ranks, keeping per-rank state."""

    kind: ClassVar[str]

    def __init__(self) -> None:
        self.state: dict[str, torch.Tensor] = {}

    @classmethod
    def from_config(cls, config: Any) -> Compressor:
        return cls()

    @abstractmethod
    def reduce_(
        self, bucket: torch.Tensor, spec: BucketSpec, transport: BlockingAggregator
    ) -> None:
        """Replace `bucket` (this rank's gradients) by the compressed sum over all ranks."""

    def tensor(
        self, spec: BucketSpec, name: str, size: Sequence[int], dtype: torch.dtype
    ) -> torch.Tensor:
        """This rank's state tensor `name` of bucket `spec` (zeros the first time)."""
        key = f"{spec.index}.{name}"
        value = self.state.get(key)
        if value is None:
            value = self.state[key] = torch.zeros(*size, dtype=dtype)
        return value


class CompressedAggregator(Aggregator):
    """Runs a compressor over a transport method, bucket by bucket, on a communication thread."""

    def __init__(self, compressor: Compressor, transport: BlockingAggregator) -> None:
        self.compressor = compressor
        self.transport = transport
        self._specs: dict[tuple[int, int, torch.dtype], BucketSpec] = {}
        self._thread: CommThread | None = None

    def bind(self, buckets: Sequence[BucketSpec]) -> None:
        for spec in buckets:
            self._specs[self._key(spec.buffer)] = spec

    @staticmethod
    def _key(bucket: torch.Tensor) -> tuple[int, int, torch.dtype]:
        return bucket.data_ptr(), bucket.numel(), bucket.dtype

    def spec(self, bucket: torch.Tensor) -> BucketSpec:
        """The bound layout of `bucket`, or (for an unbound tensor) a new flat one."""
        key = self._key(bucket)
        if key not in self._specs:
            index = len(self._specs)
            self._specs[key] = BucketSpec(index, bucket, (f"bucket{index}",), (bucket.shape,))
        return self._specs[key]

    def start(self, bucket: torch.Tensor) -> PendingReduction:
        spec = self.spec(bucket)
        if self._thread is None:
            self._thread = CommThread(
                f"shoal-{self.compressor.kind}-{self.transport.method}",
                self.transport.links.timeout_s,
            )
        return self._thread.submit(
            lambda: self.compressor.reduce_(bucket, spec, self.transport),
            f"{self.compressor.kind} compression over {self.transport.method}",
        )

    def take_sent_bytes(self) -> int:
        return self.transport.take_sent_bytes()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.compressor.state)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.compressor.state = {key: value.clone() for key, value in state.items()}
