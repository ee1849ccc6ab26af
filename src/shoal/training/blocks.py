"""Per-block activation checkpointing and `torch.compile` (`[train]` options), applied to a
model's repeated blocks in place: parameter names do not change, so checkpoints load across
runs with and without them.

Activation checkpointing is torch's composable `checkpoint` (each block keeps its input in
the forward pass and runs again in the backward pass); compile is `nn.Module.compile` of
each block, as torchtitan compiles per block (a block's graph is compiled once and reused
by every block of its class). Under fully_sharded both come before FSDP wraps the blocks,
and after a tensor plan splits them (`strategies/spmd/layout.py`).
"""

from __future__ import annotations

from typing import Any

from torch import nn


def prepare_blocks(blocks: list[nn.Module], train: Any) -> None:
    """Apply `train`'s per-block options to `blocks`."""
    if train.activation_checkpointing:
        from torch.distributed._composable import checkpoint

        for block in blocks:
            checkpoint(block)
    if train.compile:
        for block in blocks:
            block.compile()


def wants_blocks(train: Any) -> bool:
    return bool(train.activation_checkpointing or train.compile)
