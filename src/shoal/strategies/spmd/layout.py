"""Laying a task's model out over a DeviceMesh with torch's own machinery.

Every rank builds the full model from the seed, then: the tensor dimension
applies the task's plan (the `TENSOR_PLAN` capability; the lm's is Megatron's)
with `parallelize_module`; a sharded data dimension wraps each of the task's
blocks (`SHARD_UNITS`), then the whole model, with `fully_shard` (FSDP2), so
each block's parameters are all-gathered
just before its forward and backward and its gradients reduce-scattered right
after (the per-block reduction of the seeds, done by FSDP). FSDP's default is
to average gradients over the data ranks; shoal's loss is already divided by
the global batch size, so the reduction is set to a plain sum (divide factor
1), which gloo runs as SUM and no rescale.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import parallelize_module

from shoal.protocols.capabilities import SHARD_UNITS, TENSOR_PLAN
from shoal.protocols.layouts import modules_of_classes, plan_from_patterns


def build_mesh(device: torch.device, dims: dict[str, int], order: tuple[int, ...]) -> DeviceMesh:
    """The mesh over the world, dimensions named, row-major (the last varies fastest),
    point i held by rank `order[i]` (`RankRoles.workers`: laid out by host)."""
    ranks = torch.tensor(order, dtype=torch.int).reshape(tuple(dims.values()))
    return DeviceMesh(device.type, ranks, mesh_dim_names=tuple(dims))


def lay_out(
    task: Any,
    strategy: str,
    model: nn.Module,
    mesh: DeviceMesh,
    dims: dict[str, int],
    data_mode: str,
    sequence_parallel: bool,
    bf16: bool,
    patterns: Mapping[str, str] | None = None,
    wrap: list[str] | None = None,
) -> bool:
    """Shard `model` (the task's, or a pipeline stage of it) in place: by the plan's
    `patterns` and the `wrap` classes where the strategy's config gives them, else by what
    `task` offers (`strategy` names who asks, in a refusal). True when FSDP shards it over
    the data dimension."""
    if "tensor" in dims:
        if patterns is not None:
            plan = plan_from_patterns(model, patterns, sequence_parallel, missing_ok=True)
        else:
            plan = TENSOR_PLAN.of(task, strategy).tensor_plan(model, sequence_parallel)
        parallelize_module(model, mesh["tensor"], plan)
    if data_mode != "sharded" or "data" not in dims:
        return False
    if wrap is not None:
        units = modules_of_classes(model, wrap)
    else:
        units = SHARD_UNITS.of(task, strategy).shard_units(model)
    data = mesh["data"]
    # bf16: compute in bf16 (autocast does too), reduce gradients in float32
    policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32
    )
    for unit in units:
        fully_shard(unit, mesh=data, mp_policy=policy)
    fully_shard(model, mesh=data, mp_policy=policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return True
