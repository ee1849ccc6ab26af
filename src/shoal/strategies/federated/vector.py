"""A model's trainable state as one flat vector: what clients send and the server updates.

Parameters and floating-point buffers (e.g. batch-norm statistics) are averaged
like in FedAvg's original form; integer buffers (batch counters) stay local.
"""

from __future__ import annotations

import torch
from torch import nn


class ModelVector:
    """Views a model's parameters and float buffers as one flat float tensor, in a fixed order."""

    def __init__(self, model: nn.Module) -> None:
        self.tensors = [p.data for p in model.parameters()] + [
            b for b in model.buffers() if b.is_floating_point()
        ]
        self.size = sum(t.numel() for t in self.tensors)
        self.num_params = sum(p.numel() for p in model.parameters())

    def read(self) -> torch.Tensor:
        """A copy of the current state as a float32 vector."""
        return torch.cat([t.detach().reshape(-1).float().cpu() for t in self.tensors])

    @torch.no_grad()
    def write(self, vector: torch.Tensor) -> None:
        """Copy `vector` into the model's tensors."""
        offset = 0
        for tensor in self.tensors:
            count = tensor.numel()
            tensor.copy_(vector[offset : offset + count].view_as(tensor))
            offset += count
