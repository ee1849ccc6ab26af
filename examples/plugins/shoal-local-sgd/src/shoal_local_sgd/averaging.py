"""The gradient sync of local SGD: gradients stay local; every k steps the models are averaged.

Local SGD (Stich, "Local SGD converges fast and communicates little", ICLR 2019;
Lin et al., "Don't use large mini-batches, use local SGD", ICLR 2020):

    x_i <- x_i - lr * g_i(x_i)            every step, on rank i's shard
    x_i <- (1/n) sum_j x_j                 before every step t with t % k == 0

shoal's trainer divides every rank's loss sum by the *global* batch size, so
g_i is this rank's share of the global mean gradient; n * g_i is the mean
gradient over the rank's own shard, the gradient local SGD steps with. With
k = 1 and plain SGD the average of the n updates is x - lr * sum_j g_j: the
data_parallel update, step for step (the equivalence the tests check).

The averaging runs at the start of a step, before the forward pass, so the
gradient of an averaging step is taken at the averaged model. The spread of
the replicas (largest |x_i - mean x| over all entries and ranks) is measured
just before and just after each averaging and reported at each logging
interval: `replica_spread_after` is 0 when the replicas agree.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shoal.extend import GradientSync, agree_on_nonfinite, nonfinite_names


class ModelAveragingSync(GradientSync):
    """Local gradients scaled to the shard's mean; parameters all-reduced every k steps."""

    def __init__(self, model: nn.Module, every: int, buffers: bool, group: Any = None) -> None:
        self.every = every
        self.group = group
        self.world_size = dist.get_world_size(group) if dist.is_initialized() else 1
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.tensors: list[torch.Tensor] = [p for _, p in self.named]
        if buffers:
            self.tensors += [b for b in model.buffers() if b.is_floating_point() and b.numel()]
        self.steps = 0  # steps begun, across resumes (checkpointed)
        self._nonfinite: list[str] = []
        self._sent = 0
        self._spread = {"before": 0.0, "after": 0.0}
        self.averagings = 0

    def zero_grad(self) -> None:
        for _, param in self.named:
            param.grad = None

    def _flat(self) -> torch.Tensor:
        return torch.cat([t.detach().reshape(-1).double() for t in self.tensors])

    def _spread_now(self, flat: torch.Tensor, mean: torch.Tensor) -> float:
        spread = (flat - mean).abs().max() if flat.numel() else flat.new_zeros(())
        dist.all_reduce(spread, op=dist.ReduceOp.MAX, group=self.group)
        return float(spread)

    def average(self) -> None:
        """x_i <- mean_j x_j over the group, in place; records the spread before and after."""
        if self.world_size == 1:
            return
        with torch.no_grad():
            before = self._flat()
            for tensor in self.tensors:
                dist.all_reduce(tensor.data, group=self.group)
                tensor.data.div_(self.world_size)
                self._sent += tensor.numel() * tensor.element_size()
            after = self._flat()
            mean = after.clone()
            dist.all_reduce(mean, group=self.group)
            mean.div_(self.world_size)
            self._spread = {
                "before": self._spread_now(before, mean),
                "after": self._spread_now(after, mean),
            }
        self.averagings += 1

    def begin_step(self) -> None:
        if self.steps > 0 and self.steps % self.every == 0:
            self.average()
        self.steps += 1

    def finish(self) -> float:
        grads = [(name, param.grad) for name, param in self.named]
        self._nonfinite = nonfinite_names(grads)
        factor = self.world_size / self.loss_scale
        with torch.no_grad():
            for _, param in self.named:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                elif factor != 1.0:
                    param.grad.mul_(factor)
        return 0.0

    def nonfinite(self) -> dict[int, list[str]]:
        device = self.named[0][1].device if self.named else torch.device("cpu")
        return agree_on_nonfinite(self._nonfinite, device)

    def take_sent_bytes(self) -> int:
        sent, self._sent = self._sent, 0
        return sent

    def interval_metrics(self) -> dict[str, float]:
        return {
            "replica_spread_before": self._spread["before"],
            "replica_spread_after": self._spread["after"],
            "averagings": float(self.averagings),
        }

    def rank_state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's replica (it differs from rank 0's between averagings) and the step."""
        return {
            "replica": torch.cat([t.detach().reshape(-1) for t in self.tensors]).clone(),
            "steps": torch.tensor([self.steps, self.averagings], dtype=torch.int64),
        }

    def load_rank_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        flat, offset = state["replica"], 0
        with torch.no_grad():
            for tensor in self.tensors:
                tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
                offset += tensor.numel()
        self.steps, self.averagings = (int(v) for v in state["steps"].tolist())
