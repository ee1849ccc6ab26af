"""Clipping by the global gradient norm, also when gradients are sharded (DTensor).

`torch.nn.utils.clip_grad_norm_` refuses a mix of plain tensors and DTensors (a
tensor-parallel model keeps its norms replicated and plain) and, over DTensors,
reduces one norm per parameter. Here each rank sums the squares of its local
pieces, grouped by the mesh dimensions over which those pieces are sharded; each
group's sum is all-reduced over exactly those dimensions (a replicated piece is
counted once, not once per replica), and the square root of the total is the
norm of the whole model's gradient, the same on every rank. The clip factor is
torch's, max_norm / (norm + 1e-6) capped at 1, so an unsharded model clips as
`clip_grad_norm_` does (it is then called as is).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

from shoal.runtime.dtensors import is_dtensor


def clip_by_global_norm(params: Iterable[torch.nn.Parameter], max_norm: float) -> float:
    """Scale the gradients of `params` so that their global 2-norm is at most `max_norm`;
    returns the norm before clipping."""
    params = [p for p in params if p.grad is not None]
    grads = [p.grad for p in params if p.grad is not None]
    if not any(is_dtensor(g) for g in grads):
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    total = global_norm(grads)
    coef = min(max_norm / (total + 1e-6), 1.0)
    with torch.no_grad():
        for grad in grads:
            local = grad.to_local() if is_dtensor(grad) else grad
            local.mul_(coef)
    return total


def global_norm(grads: list[torch.Tensor]) -> float:
    """The 2-norm of all of `grads` together (collective when some are sharded). A gradient
    still Partial (pending a sum) is refused: the gradient sync reduces those first."""
    sums: dict[tuple[int, ...], torch.Tensor] = {}
    groups: dict[tuple[int, ...], list[dist.ProcessGroup]] = {}
    for grad in grads:
        key: tuple[int, ...] = ()
        local = grad
        if is_dtensor(grad):
            local = grad.to_local()
            mesh = grad.device_mesh
            if any(placement.is_partial() for placement in grad.placements):
                raise ValueError("global_norm: a gradient is Partial; reduce it first")
            # sharded in any way (Shard, or FSDP-over-TP's strided shard): not replicated
            dims = [d for d, p in enumerate(grad.placements) if not p.is_replicate()]
            key = tuple(id(mesh.get_group(d)) for d in dims)
            groups.setdefault(key, [mesh.get_group(d) for d in dims])
        square = local.detach().float().pow(2).sum()
        sums[key] = sums[key] + square if key in sums else square
    total = torch.zeros((), dtype=torch.float64)
    for key in sorted(sums):
        value = sums[key].to(torch.float64).cpu()
        for group in groups.get(key, []):
            dist.all_reduce(value, group=group)
        total += value
    return float(total.sqrt())
