"""How the language model splits across ranks: the Megatron-style tensor-parallel plan.

Megatron-LM (Shoeybi et al., 2019): in each block, q, k, v and the MLP's `up` are
split column-wise (each rank computes whole heads and a slice of the hidden units)
and `out` and `down` row-wise (each rank's partial sums are reduced), so a block
costs one all-reduce in attention and one in the MLP, forward and backward. With
sequence parallelism (Korthikanti et al., 2022) the all-reduces become a
reduce-scatter along the sequence and an all-gather before the next projection,
and the norms and residual dropout work on each rank's part of the sequence.

The plan is keyed by the module names of :mod:`shoal.tasks.lm.model`, and applies
with `torch.distributed.tensor.parallel.parallelize_module` to the full model or to
a pipeline stage of it (entries whose module a stage lacks are left out).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)


def tensor_parallel_plan(
    model: nn.Module, sequence_parallel: bool = False
) -> dict[str, ParallelStyle]:
    """The plan for `model` (a TransformerLM or a stage of one).

    The embedding is split by vocabulary rows and the head by vocabulary columns,
    its logits gathered (Replicate), so the loss is computed as without parallelism.
    Without sequence parallelism the activations between blocks are replicated; with
    it they are sharded along the sequence (dimension 1).
    """
    between = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, ParallelStyle] = {}
    names = {name for name, _ in model.named_modules()}
    if "embed" in names:
        plan["embed.tok"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        if sequence_parallel:
            plan["embed"] = PrepareModuleOutput(
                output_layouts=Replicate(), desired_output_layouts=Shard(1)
            )
    for key in sorted(k for k in names if k.startswith("blocks.") and k.count(".") == 1):
        plan.update(_block_plan(key, between, sequence_parallel))
    if "norm" in names and sequence_parallel:
        plan["norm"] = SequenceParallel()
    if "head" in names:
        plan["head"] = ColwiseParallel(input_layouts=between, output_layouts=Replicate())
    return plan


def _block_plan(
    block: str, between: Shard | Replicate, sequence_parallel: bool
) -> dict[str, ParallelStyle]:
    plan: dict[str, ParallelStyle] = {
        f"{block}.attn.q": ColwiseParallel(),
        f"{block}.attn.k": ColwiseParallel(),
        f"{block}.attn.v": ColwiseParallel(),
        f"{block}.attn.out": RowwiseParallel(output_layouts=between),
        f"{block}.mlp.up": ColwiseParallel(),
        f"{block}.mlp.down": RowwiseParallel(output_layouts=between),
    }
    if sequence_parallel:
        plan.update(
            {
                f"{block}.norm1": SequenceParallel(),
                f"{block}.norm2": SequenceParallel(),
                f"{block}.attn": _gather_sequence(),
                f"{block}.mlp": _gather_sequence(),
            }
        )
    return plan


def _gather_sequence() -> PrepareModuleInput:
    """All-gather a sequence-sharded input before the column-wise projections."""
    return PrepareModuleInput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
    )
