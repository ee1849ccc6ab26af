"""Laying the lm model out over a DeviceMesh with torch's own machinery.

Every rank builds the full model from the seed (`tasks/lm/model.py`), then:
the tensor dimension applies the Megatron plan (`tasks/lm/parallel.py`) with
`parallelize_module`; a sharded data dimension wraps each block, then the whole
model, with `fully_shard` (FSDP2), so each block's parameters are all-gathered
just before its forward and backward and its gradients reduce-scattered right
after (the per-block reduction of the seeds, done by FSDP). FSDP's default is
to average gradients over the data ranks; shoal's loss is already divided by
the global batch size, so the reduction is set to a plain sum (divide factor
1), which gloo runs as SUM and no rescale.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import parallelize_module

from shoal.tasks.lm.parallel import tensor_parallel_plan


def build_mesh(device: torch.device, dims: dict[str, int], order: tuple[int, ...]) -> DeviceMesh:
    """The mesh over the world, dimensions named, row-major (the last varies fastest),
    point i held by rank `order[i]` (`RankRoles.workers`: laid out by host)."""
    ranks = torch.tensor(order, dtype=torch.int).reshape(tuple(dims.values()))
    return DeviceMesh(device.type, ranks, mesh_dim_names=tuple(dims))


def lay_out(
    model: nn.Module,
    mesh: DeviceMesh,
    dims: dict[str, int],
    data_mode: str,
    sequence_parallel: bool,
    bf16: bool,
) -> bool:
    """Shard `model` in place; returns True when FSDP shards it over the data dimension."""
    if "tensor" in dims:
        parallelize_module(model, mesh["tensor"], tensor_parallel_plan(model, sequence_parallel))
    if data_mode != "sharded" or "data" not in dims:
        return False
    data = mesh["data"]
    # bf16: compute in bf16 (autocast does too), reduce gradients in float32
    policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32
    )
    blocks = model.get_submodule("blocks")
    for block in blocks.children():
        fully_shard(block, mesh=data, mp_policy=policy)
    fully_shard(model, mesh=data, mp_policy=policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return True
