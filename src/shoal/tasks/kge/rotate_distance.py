"""RotatE's pairwise distance, -sum_i |q_i - c_i| over complex dimensions, fast on CPU.

Every (query, candidate) pair needs its own |q_i - c_i| for each of the k complex
dimensions: there is no matrix-product shortcut as for TransE-L2 (the modulus is
taken per dimension, before the sum). What can be avoided is the cost around that
(n, m, k) work: every elementwise torch op reads and writes its (n, m, k) operands
once, and the scoring needs about twenty of them (forward 6, backward 14).

`rotate_distances` is one autograd function with its own backward, which keeps
nothing of size (n, m, k) between forward and backward. Gradients: with
d_i = |q_i - c_i| and g the incoming gradient of a score, dscore/dq_i =
-(q_i - c_i) / d_i (a unit vector in the plane, real and imaginary parts), summed
over candidates for q and over queries (with the sign flipped) for c; so the
gradient of c is the gradient of q with the roles of queries and candidates
swapped (d is symmetric), and one kernel serves both.

Two implementations of the same arithmetic:
- compiled (the default where torch.compile works): the forward and that gradient
  kernel are each one loop nest that torch.compile (Inductor, C++ with SIMD) fuses:
  the differences, moduli and products live in registers, never in memory, and the
  gradient's sum runs over the innermost, contiguous axis (candidates transposed to
  (2k, m)). Compiled for static shapes, within compilation.py's budget of shapes;
  Inductor caches the kernels on disk for later processes.
- tiles (where compilation is unavailable or fails: no C++ compiler, another device):
  tiles of (queries x candidates) whose three (n', m', k) buffers stay in cache,
  written in place, and a backward that recomputes a tile's differences.
Measured (benchmarks/kge_rotate_speed.py micro and train): RESULTS.md, "RotatE's
training speed".
"""

from __future__ import annotations

from typing import Any

import torch

from shoal.tasks.kge.compilation import CompiledKernels

_TINY = 1e-30  # a distance of 0 has no direction: its gradient is taken as 0
#: elements of one (queries x candidates x k) tile: three such float buffers (12 MiB) stay in
#: the last-level cache. Measured (benchmarks/kge_rotate_speed.py micro, 2 chunks of 256 x 256
#: at dim 400): 2^14 0.6x, 2^16 1.9x, 2^18 3.8x, 2^20 5.7x, 2^22 3.1x the cdist path's speed
TILE_ELEMENTS = 1 << 20


def rotate_distances(queries: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """-sum_i |q_i - c_i|: (..., n, 2k) x (..., m, 2k) -> (..., n, m), rows as [re, im].

    Leading dimensions broadcast as in torch.matmul; gradients flow to both inputs.
    """
    n, width = queries.shape[-2:]
    m = candidates.shape[-2]
    leading = torch.broadcast_shapes(queries.shape[:-2], candidates.shape[:-2])
    q = queries.expand(*leading, n, width).reshape(-1, n, width)
    c = candidates.expand(*leading, m, width).reshape(-1, m, width)
    function = _CompiledDistances if _compiled(q, c) else _TileDistances
    scores: torch.Tensor = function.apply(q, c)
    return scores.reshape(*leading, n, m)


# ---- compiled ----------------------------------------------------------------------------


def _negated_sums(q: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """(b, n, 2k) x (b, m, 2k) -> (b, n, m): -sum_i |q_i - c_i| (fused by torch.compile)."""
    k = q.shape[-1] // 2
    re = q[:, :, None, :k] - c[:, None, :, :k]
    im = q[:, :, None, k:] - c[:, None, :, k:]
    return -(re * re + im * im).sqrt().sum(-1)


def _pulls(x: torch.Tensor, y_t: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """sum_m g[n, m] (x_n - y_m) / |x_n - y_m| per complex dimension, (b, n, 2k), from x
    (b, n, 2k), y transposed (b, 2k, m) and g (b, n, m): the sum runs over the last axis."""
    k = x.shape[-1] // 2
    re = x[:, :, :k, None] - y_t[:, None, :k, :]
    im = x[:, :, k:, None] - y_t[:, None, k:, :]
    # the floor is the dtype's smallest normal number: _TINY squared underflows to 0 in
    # float32, and rsqrt(0) * 0 is NaN where a candidate meets its query in a dimension
    floor = torch.finfo(x.dtype).tiny
    weight = g[:, :, None, :] * (re * re + im * im).clamp_min(floor).rsqrt()
    return torch.cat([(re * weight).sum(-1), (im * weight).sum(-1)], dim=-1)


#: the compiled kernels (compilation.py), keyed by (queries' shape, candidates' shape, dtype).
#: Only training steps (gradients enabled) are compiled: they see a few shapes (each side's
#: chunks; the last batch of an epoch may be smaller), always under the budget, so a run
#: resumed from a checkpoint takes the same kernel for every shape as the run it continues
#: (bit-identical resume). Evaluation, whose blocks come in many shapes, takes the tiles.
KERNELS = CompiledKernels("RotatE", "using tiles")


def _compiled(q: torch.Tensor, c: torch.Tensor) -> bool:
    """Whether the compiled kernels serve these shapes (see the module doc)."""
    if not torch.is_grad_enabled() or q.device.type != "cpu" or not q.dtype.is_floating_point:
        return False
    return KERNELS.admit((tuple(q.shape), tuple(c.shape), q.dtype))


class _CompiledDistances(torch.autograd.Function):
    """The compiled kernels, falling back to the tiles if compilation fails."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(q, c)
        scores = KERNELS.run(_negated_sums, q.contiguous(), c.contiguous())
        return _TileDistances.forward(ctx, q, c) if scores is None else scores

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, c = ctx.saved_tensors
        grad = grad.contiguous()
        pull_q = KERNELS.run(_pulls, q, c.transpose(1, 2).contiguous(), grad)
        if pull_q is not None:
            grad_t = grad.transpose(1, 2).contiguous()
            pull_c = KERNELS.run(_pulls, c, q.transpose(1, 2).contiguous(), grad_t)
            if pull_c is not None:
                return pull_q.neg_(), pull_c.neg_()
        return _TileDistances.backward(ctx, grad)


# ---- tiles -------------------------------------------------------------------------------


def _tiles(b: int, n: int, m: int, k: int) -> tuple[int, int]:
    """(queries, candidates) per tile: about TILE_ELEMENTS elements of (b, n', m', k)."""
    per_query = max(1, TILE_ELEMENTS // (b * k))
    tile_m = min(m, max(8, per_query // 8))
    tile_n = min(n, max(1, per_query // tile_m))
    return tile_n, tile_m


def _spans(size: int, tile: int) -> list[tuple[int, int]]:
    return [(start, min(start + tile, size)) for start in range(0, size, tile)]


class _TileDistances(torch.autograd.Function):
    """(b, n, 2k) queries x (b, m, 2k) candidates -> (b, n, m) negated distance sums."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(q, c)
        b, n, width = q.shape
        m, k = c.shape[1], width // 2
        scores = q.new_empty(b, n, m)
        tile_n, tile_m = _tiles(b, n, m, k)
        buffers = _Buffers(q, tile_n, tile_m, k)
        for n0, n1 in _spans(n, tile_n):
            for m0, m1 in _spans(m, tile_m):
                distance = buffers.distances(q[:, n0:n1], c[:, m0:m1])
                torch.sum(distance, dim=-1, out=scores[:, n0:n1, m0:m1])
        return scores.neg_()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, c = ctx.saved_tensors
        b, n, width = q.shape
        m, k = c.shape[1], width // 2
        grad_q, grad_c = torch.zeros_like(q), torch.zeros_like(c)
        tile_n, tile_m = _tiles(b, n, m, k)
        buffers = _Buffers(q, tile_n, tile_m, k)
        for n0, n1 in _spans(n, tile_n):
            for m0, m1 in _spans(m, tile_m):
                distance = buffers.distances(q[:, n0:n1], c[:, m0:m1])
                # w = g / d per (pair, dimension); the unit vector (diff / d) times g, summed
                weight = distance.clamp_min_(_TINY).reciprocal_()
                weight.mul_(grad[:, n0:n1, m0:m1].unsqueeze(-1))
                for part, diff in ((slice(0, k), buffers.re), (slice(k, width), buffers.im)):
                    diff.mul_(weight)
                    grad_q[:, n0:n1, part] -= diff.sum(dim=2)
                    grad_c[:, m0:m1, part] += diff.sum(dim=1)
        return grad_q, grad_c


class _Buffers:
    """A tile's difference buffers, allocated once per call and written in place."""

    def __init__(self, q: torch.Tensor, tile_n: int, tile_m: int, k: int) -> None:
        self.k = k
        b = q.shape[0]
        self.full = [q.new_empty(b, tile_n, tile_m, k) for _ in range(3)]
        self.re, self.im = self.full[0], self.full[1]

    def distances(self, q: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """|q_i - c_i| for a (b, n', 2k) x (b, m', 2k) tile, as (b, n', m', k); leaves the
        real and imaginary differences in `re` and `im`."""
        n, m, k = q.shape[1], c.shape[1], self.k
        self.re, self.im, distance = (full[:, :n, :m] for full in self.full)
        torch.sub(q[:, :, None, :k], c[:, None, :, :k], out=self.re)
        torch.sub(q[:, :, None, k:], c[:, None, :, k:], out=self.im)
        torch.mul(self.re, self.re, out=distance)
        return distance.addcmul_(self.im, self.im).sqrt_()
