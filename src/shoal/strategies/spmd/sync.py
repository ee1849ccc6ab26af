"""The gradient sync of the SPMD strategies.

Within the tensor dimension nothing is left to do after backward: the
column/row-wise projections' collectives already gave each rank the gradient
of its own shard, except for parameters replicated over a sequence-parallel
tensor dimension (the norms), whose gradients are pending sums (`Partial`):
they are summed here. Every gradient is then laid out as its parameter (the
vocabulary-sharded embedding's, which torch leaves whole on every rank, cut to
this rank's shard), so a rank's share of the norm counts exactly its pieces.
A sharded data dimension is FSDP's (reduce-scatter per block, during backward;
only the last micro-batch reduces). A replicated data dimension is reduced
here, block by block: the local gradients of each block (the embeddings, each
transformer block, the final norm and head) are flattened into one bucket and
all-reduced over the data group, all buckets in flight at once (seed 004's
per-block all-reduce). A pipeline stage of a hybrid mesh is synced by this same
class over its own blocks (`pipeline_mesh.py`).

Non-finite gradients are found on each rank's local pieces, before the
replicated reduction (so the rank at fault is named), after FSDP's (the rank
whose shard holds them), and named with the rank's mesh coordinates. Their
agreement's all-reduce also sums each rank's share of the squared gradient
norm, so clipping by the global norm adds no collective.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate

from shoal.training.clipping import counted_pieces, norm_share
from shoal.training.contracts import AgreeingSync
from shoal.training.nonfinite import nonfinite_names


def _laid_out_as(param: nn.Parameter, grad: DTensor) -> list[Placement]:
    """Where `param`'s gradient belongs: the parameter's own placements (a pending sum is
    summed into them; a vocabulary-sharded embedding's gradient, which torch leaves whole
    on every rank, is cut to this rank's shard), so each rank holds, checks and counts the
    gradient of exactly what it holds of the parameter; for a parameter that is not a
    DTensor, its gradient's pending sums summed and replicated."""
    if isinstance(param, DTensor):
        return list(param.placements)
    return [Replicate() if isinstance(p, Partial) else p for p in grad.placements]


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class SpmdGradientSync(AgreeingSync):
    def __init__(
        self,
        model: nn.Module,
        mesh: DeviceMesh,
        dims: dict[str, int],
        replicated_data: bool,
        where: str,
    ) -> None:
        self.model = model
        self.named = list(model.named_parameters())
        self.where = where  # "data 0, tensor 1": this rank's coordinates
        self.fsdp = model if isinstance(model, FSDPModule) else None
        self.data_group = mesh["data"].get_group() if replicated_data and "data" in dims else None
        # this rank's coordinate along each dimension the model is laid out over: which
        # gradient pieces its share of the squared norm counts (`clipping.counted_pieces`)
        names = mesh.mesh_dim_names or ()
        coordinate = list(mesh.get_coordinate() or ())
        coords = {name: coordinate[names.index(name)] for name in dims if name in names}
        self.counted = counted_pieces((param for _, param in self.named), coords)
        self.buckets = _blocks(model) if self.data_group is not None else []
        self.found: list[str] = []  # the last `finish`'s non-finite gradients, with coordinates
        self._comm_s = 0.0

    def zero_grad(self) -> None:
        for _, param in self.named:
            param.grad = None

    @contextmanager
    def accumulate(self, last: bool) -> Iterator[None]:
        if self.fsdp is not None:  # only the step's last micro-batch reduces
            self.fsdp.set_requires_gradient_sync(last)
        yield

    def finish(self) -> float:
        started = time.perf_counter()
        for _, param in self.named:
            grad = param.grad
            if grad is None:  # a rank without samples this step still takes part
                param.grad = torch.zeros_like(param)
            elif isinstance(grad, DTensor):
                placements = _laid_out_as(param, grad)
                if placements != list(grad.placements):
                    param.grad = grad.redistribute(placements=placements)
        named = [(name, local(param.grad)) for name, param in self.named if param.grad is not None]
        bad = nonfinite_names(named)
        self.found = [f"{name} [{self.where}]" for name in bad]
        if self.loss_scale != 1.0:
            for _, grad in named:
                grad.div_(self.loss_scale)
        if self.data_group is not None:
            all_reduce_blocks(self.buckets, self.data_group)
        self._comm_s = time.perf_counter() - started
        return self._comm_s

    def norm_share(self) -> torch.Tensor:
        """The squares of the local pieces no other rank counts (`clipping.norm_share`)."""
        return norm_share(self.counted)

    @property
    def agree_device(self) -> torch.device:
        return next(self.model.parameters()).device

    def bytes_per_step(self) -> int:
        """Bytes of this rank's local gradients (what the data dimension reduces)."""
        return sum(local(p).numel() * local(p).element_size() for _, p in self.named)


def _blocks(model: nn.Module) -> list[list[nn.Parameter]]:
    """One bucket per block, the last first (the order backward finishes them): the head
    and final norm, blocks N-1..0, the embeddings."""
    children = dict(model.named_children())
    groups: list[list[nn.Module]] = [[children[n] for n in ("norm", "head") if n in children]]
    if "blocks" in children:
        groups += [[block] for block in reversed(list(children["blocks"].children()))]
    groups.append([children["embed"]] if "embed" in children else [])
    groups.append([model])  # whatever the others left (none in the lm)
    buckets: list[list[nn.Parameter]] = []
    seen: set[int] = set()  # tied weights (embedding = head) are reduced once
    for modules in groups:
        bucket = []
        for module in modules:
            for param in module.parameters():
                if id(param) not in seen:
                    seen.add(id(param))
                    bucket.append(param)
        if bucket:
            buckets.append(bucket)
    return buckets


def all_reduce_blocks(buckets: list[list[nn.Parameter]], group: dist.ProcessGroup) -> None:
    """Sum each bucket's local gradients over `group`: one flat all-reduce per bucket, all
    in flight at once, copied back as each completes (in bucket order)."""
    flights = []
    for params in buckets:
        grads = [local(p.grad) for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        work = dist.all_reduce(flat, group=group, async_op=True)
        flights.append((work, flat, grads))
    for work, flat, grads in flights:
        work.wait()
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()
