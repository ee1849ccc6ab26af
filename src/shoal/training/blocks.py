"""Per-block activation checkpointing and `torch.compile` (`[train]` options), applied to a
model's repeated blocks in place: parameter names do not change, so checkpoints load across
runs with and without them.

Activation checkpointing runs each block's forward under `torch.utils.checkpoint`
(non-reentrant: the block keeps its input in the forward pass and runs again in the
backward pass); compile is `nn.Module.compile` of each block, as torchtitan compiles per
block (a block's graph is compiled once and reused by every block of its class), with the
checkpoint inside the compiled region when both are on. Under fully_sharded both come
before FSDP wraps the blocks, and after a tensor plan splits them
(`strategies/spmd/layout.py`).
"""

from __future__ import annotations

import types
from typing import Any

import torch.utils.checkpoint
from torch import nn


def prepare_blocks(blocks: list[nn.Module], train: Any) -> None:
    """Apply `train`'s per-block options to `blocks`."""
    for block in blocks:
        if train.activation_checkpointing:
            block.forward = types.MethodType(_checkpointed_forward, block)
        if train.compile:
            block.compile()


def _checkpointed_forward(block: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The block's own forward under a non-reentrant checkpoint.

    The forward is replaced on the instance rather than wrapped in a module (torch's
    `checkpoint_wrapper`), so parameter names stay as they are; and not hooked around the
    block (torch's composable `checkpoint`), whose recomputation a compiled block's
    backward refuses (its saved activations' strides differ from the compiled graph's).
    A bound method follows the block through `copy.deepcopy`.
    """
    forward = types.MethodType(type(block).forward, block)
    return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)


def wants_blocks(train: Any) -> bool:
    return bool(train.activation_checkpointing or train.compile)
