"""PowerSGD: rank-r approximations of gradient matrices by one power iteration.

Vogels, Karimireddy & Jaggi, 2019. Each parameter of the bucket seen as a
matrix M (rows = first dimension, columns = the rest) is approximated as
P Q^T with P = M Q summed over ranks and orthonormalized, and Q = M^T P summed
over ranks; Q is kept and reused next step (a warm start, so one power
iteration per step tracks the dominant subspace). Both sums are linear in M, so
summing the ranks' P and Q gives the factors of the summed gradient: two
all-reduces of r (rows + columns) numbers replace one of rows x columns.
Vectors (biases) and matrices too small to gain are summed uncompressed, in the
same all-reduce as P.

Error feedback: rank i keeps e_i <- M_i - (P Q^T) / n, the part of its
contribution the approximation missed, and adds it to its next gradient; over
all ranks the residuals sum to (sum of M_i) - P Q^T, so nothing is lost.
Orthonormalization is Gram-Schmidt in a fixed order, run on identical inputs on
every rank, so every rank reconstructs the same P Q^T.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shoal.comm.aggregators import BlockingAggregator, BucketSpec
from shoal.comm.compression.base import Compressor


@dataclass(frozen=True)
class _Matrix:
    slot: int
    start: int
    rows: int
    cols: int


def _orthonormalize_(matrix: torch.Tensor, eps: float = 1e-8) -> None:
    """Gram-Schmidt on the columns of `matrix`, in place."""
    for j in range(matrix.shape[1]):
        column = matrix[:, j]
        for i in range(j):
            column -= torch.dot(matrix[:, i], column) * matrix[:, i]
        column /= column.norm() + eps


class PowerSGDCompressor(Compressor):
    """`kind = "powersgd"`: rank-`rank` factors per matrix, with error feedback."""

    kind = "powersgd"

    def __init__(self, rank: int, error_feedback: bool = True, seed: int = 0) -> None:
        super().__init__()
        self.rank = rank
        self.error_feedback = error_feedback
        self.seed = seed

    @classmethod
    def from_config(cls, config: Any) -> Compressor:
        return cls(config.rank, config.error_feedback, config.seed)

    def _layout(self, spec: BucketSpec) -> tuple[list[_Matrix], list[tuple[int, int]]]:
        """Matrices worth compressing, and the (start, end) spans sent uncompressed."""
        matrices, dense = [], []
        start = 0
        for slot, shape in enumerate(spec.shapes):
            numel = int(torch.Size(shape).numel())
            rows = int(shape[0]) if len(shape) >= 2 else 0
            cols = numel // rows if rows else 0
            r = min(self.rank, rows, cols)
            if rows and r * (rows + cols) < rows * cols:
                matrices.append(_Matrix(slot, start, rows, cols))
            elif numel:
                dense.append((start, start + numel))
            start += numel
        return matrices, dense

    def _q(self, spec: BucketSpec, matrix: _Matrix, dtype: torch.dtype) -> torch.Tensor:
        """The warm-started Q of a matrix; first drawn alike on all ranks (a shared seed)."""
        key = f"{spec.index}.q{matrix.slot}"
        if key not in self.state:
            seed = np.random.SeedSequence([self.seed, spec.index, matrix.slot]).generate_state(1)
            generator = torch.Generator().manual_seed(int(seed[0]))
            r = min(self.rank, matrix.rows, matrix.cols)
            self.state[key] = torch.randn(matrix.cols, r, generator=generator).to(dtype)
        return self.state[key]

    def reduce_(
        self, bucket: torch.Tensor, spec: BucketSpec, transport: BlockingAggregator
    ) -> None:
        numel = bucket.numel()
        if numel == 0:
            return
        if self.error_feedback:
            bucket.add_(self.tensor(spec, "residual", (numel,), bucket.dtype))
        matrices, dense = self._layout(spec)
        views = [bucket[m.start : m.start + m.rows * m.cols].view(m.rows, m.cols) for m in matrices]
        qs = [self._q(spec, m, bucket.dtype) for m in matrices]
        # round 1: P = M Q for every matrix, with the uncompressed spans, in one all-reduce
        ps = [view @ q for view, q in zip(views, qs, strict=True)]
        first = torch.cat([p.reshape(-1) for p in ps] + [bucket[a:b] for a, b in dense])
        transport.all_reduce_(first)
        offset = 0
        for p in ps:
            p.copy_(first[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
            _orthonormalize_(p)
        # round 2: Q = M^T P
        new_qs = [view.T @ p for view, p in zip(views, ps, strict=True)]
        second = torch.cat([q.reshape(-1) for q in new_qs]) if new_qs else bucket[:0]
        transport.all_reduce_(second)
        offset = 0
        for matrix, view, p, q in zip(matrices, views, ps, new_qs, strict=True):
            q.copy_(second[offset : offset + q.numel()].view_as(q))
            offset += q.numel()
            approx = p @ q.T
            if self.error_feedback:
                residual = self.state[f"{spec.index}.residual"]
                span = residual[matrix.start : matrix.start + matrix.rows * matrix.cols]
                torch.sub(
                    view.reshape(-1), approx.reshape(-1), alpha=1.0 / transport.world_size, out=span
                )
            view.copy_(approx)
            self.state[f"{spec.index}.q{matrix.slot}"] = q
        first_offset = sum(p.numel() for p in ps)
        for a, b in dense:
            bucket[a:b].copy_(first[first_offset : first_offset + b - a])
            first_offset += b - a
            if self.error_feedback:
                self.state[f"{spec.index}.residual"][a:b].zero_()
