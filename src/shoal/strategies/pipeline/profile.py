"""Measuring what each block costs, on this worker, with real batches, before training.

Each block runs as the one-block stage it would be (the task's `pipeline_stage`: the
first carries the embeddings, the last the final norm, the head and the loss),
forward then backward, on the activations the blocks before it produced for a
real training batch. Time is the median over the batches of the forward +
backward seconds; memory is what the block keeps while it trains: its
parameters, their gradients and the optimizer's state (`state_bytes_per_param`
bytes for each parameter byte), plus the activations its forward saves for
backward (counted through autograd's saved-tensor hooks, once per storage).

The random generators are put back afterwards (dropout draws here must not
shift training's), and the gradients are cleared. The blocks are measured one after
the other, each over every batch, so a model built on the meta device needs only
the block being measured to have values (a pipeline rank holds its stages only).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class BlockCosts:
    """Per block: measured seconds (forward + backward) and bytes (state + activations)."""

    seconds: list[float]
    state_bytes: list[int]
    activation_bytes: list[int]

    @property
    def memory_bytes(self) -> list[int]:
        return [s + a for s, a in zip(self.state_bytes, self.activation_bytes, strict=True)]

    def costs(self, balance: str) -> list[float]:
        """The cost the partition balances: time, memory, or the sum of both shares."""
        if balance == "time":
            return list(self.seconds)
        memory = [float(m) for m in self.memory_bytes]
        if balance == "memory":
            return memory
        total_t, total_m = sum(self.seconds) or 1.0, sum(memory) or 1.0
        return [t / total_t + m / total_m for t, m in zip(self.seconds, memory, strict=True)]


def profile_blocks(
    model: nn.Module,
    cut: Callable[[int, int], nn.Module],
    blocks: int,
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    state_bytes_per_param: float,
    autocast: Callable[[], AbstractContextManager[Any]],
    hold: Callable[[nn.Module], None] | None = None,
    drop: Callable[[nn.Module], None] | None = None,
) -> BlockCosts:
    """Time and size every block of `model`, each as the one-block stage `cut(i, i)`, on
    `batches` of (inputs, targets).

    One stage at a time, over every batch: `hold(stage)` gives its parameters values
    before (a model built on the meta device), `drop(stage)` takes them back after, so
    that no more than one block's parameters (and the inputs of the next) exist at once."""
    stages: list[nn.Module] = [cut(i, i) for i in range(blocks)]
    seconds: list[list[float]] = [[] for _ in range(blocks)]
    activations = [0] * blocks
    was_training = model.training
    model.train()
    inputs = [x for x, _ in batches]
    with torch.random.fork_rng(devices=[]):
        for index, stage in enumerate(stages):
            if hold is not None:
                hold(stage)
            weights = {p.untyped_storage().data_ptr() for p in stage.parameters()}
            for number, (_, targets) in enumerate(batches):
                x = inputs[number]
                x_in = x.detach().requires_grad_() if x.is_floating_point() else x
                saved: dict[int, int] = {}
                started = time.perf_counter()
                pack = _count_into(saved, weights)
                hooks = torch.autograd.graph.saved_tensors_hooks(pack, _unpack)
                with hooks, autocast():
                    out = stage(x_in)
                    if index == blocks - 1:
                        out = loss_fn(out, targets)
                if out.dim() == 0:
                    out.backward()
                else:
                    out.backward(torch.ones_like(out))
                seconds[index].append(time.perf_counter() - started)
                activations[index] = max(activations[index], sum(saved.values()))
                inputs[number] = out.detach()
            for param in stage.parameters():
                param.grad = None
            if drop is not None:
                drop(stage)
    model.train(was_training)
    state = [
        int(sum(p.numel() * p.element_size() for p in stage.parameters()) * state_bytes_per_param)
        for stage in stages
    ]
    # the first stage's embeddings and the last's head are counted with their blocks; a
    # parameter shared by two one-block stages is not (stage() refuses tied embeddings)
    return BlockCosts([statistics.median(s) for s in seconds], state, activations)


def _count_into(saved: dict[int, int], weights: set[int]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A pack hook that records each saved storage's size, parameters excepted."""

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    return pack


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor
