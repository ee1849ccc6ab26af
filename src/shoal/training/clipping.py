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

A strategy whose ranks already meet in an all-reduce after every step (the
non-finite agreement, `training/nonfinite.py`) folds the norm into it instead:
`norm_share` is this rank's part of the squared norm, counting each piece of the
model once in the world (a replicated piece only at coordinate 0 of the
dimensions it is replicated over), so the shares summed over all ranks are the
whole model's squared norm; `clip_to_norm` then scales by it, no collective.
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
    clip_to_norm(grads, max_norm, total)
    return total


def clip_to_norm(grads: Iterable[torch.Tensor], max_norm: float, norm: float) -> None:
    """Scale `grads` (each rank its local pieces) by torch's clip factor for a global `norm`
    already known: max_norm / (norm + 1e-6), capped at 1, as a float32 tensor."""
    pieces = [grad.to_local() if is_dtensor(grad) else grad for grad in grads]
    if not pieces:
        return
    # torch's factor, in float32 on the host: a number, not a tensor to copy to the GPU
    # (a copy from the host waits for the GPU's queue to drain)
    coef = torch.clamp(max_norm / (torch.tensor(norm, dtype=torch.float32) + 1e-6), max=1.0)
    by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for piece in pieces:
        by_kind.setdefault((piece.device, piece.dtype), []).append(piece)
    factor = coef.item()
    if factor == 1.0:  # x * 1 is x: a pass over every gradient for nothing
        return
    with torch.no_grad():
        for group in by_kind.values():
            torch._foreach_mul_(group, factor)


def counted_pieces(
    params: Iterable[torch.nn.Parameter], coords: dict[str, int]
) -> list[torch.nn.Parameter]:
    """The parameters whose local gradient pieces this rank counts in its share of the
    global squared norm (`norm_share`), decided once per layout from their placements (a
    gradient is laid out as its parameter once the sync has reduced what was Partial).
    `coords` is this rank's coordinate along each mesh dimension its model is laid out over
    (sharded or replicated; a pipeline's own dimension excluded: each stage's parameters
    are its own). A piece counts unless this rank is past coordinate 0 of a dimension the
    piece is replicated over: every dimension for a plain tensor, those a DTensor's
    placements replicate or its mesh lacks for a DTensor. Mesh dimensions must be named
    (shoal's meshes are)."""
    replica = {dim for dim, coord in coords.items() if coord != 0}
    return [param for param in params if _counted_here(param, replica)]


def _counted_here(param: torch.Tensor, replica: set[str]) -> bool:
    """Whether this rank counts `param`'s local piece: it is past coordinate 0 (`replica`)
    only of dimensions the piece is sharded over."""
    if not is_dtensor(param):
        return not replica
    names = param.device_mesh.mesh_dim_names
    if names is None:
        raise ValueError("counted_pieces: a parameter's device mesh has unnamed dimensions")
    return replica <= {names[d] for d, p in enumerate(param.placements) if not p.is_replicate()}


def norm_share(counted: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    """This rank's share of the global squared norm (float64): the squares of the local
    gradient pieces of `counted` (`counted_pieces`), so that the shares of all ranks add up
    to the whole model's squared norm."""
    pieces = [
        (grad.to_local() if is_dtensor(grad) else grad).detach()
        for grad in (param.grad for param in counted)
        if grad is not None
    ]
    if not pieces:
        return torch.zeros((), dtype=torch.float64)
    return torch.stack(torch._foreach_norm(pieces)).double().pow(2).sum()


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
