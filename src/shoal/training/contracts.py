"""What the shared training loop needs from a strategy, and what it does with gradients.

The trainer is written against these two contracts only, so any strategy (and
any gradient communication scheme) that fulfils them runs under the same loop.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from shoal.training.nonfinite import Agreement, GradientCheck, agree_on_step


class GradientSync(ABC):
    """What happens to gradients in a step: accumulate, then combine across workers.

    `loss_scale` is the factor the learner multiplied the loss by before backward
    (mixed precision's dynamic loss scale; 1 otherwise): a sync divides the local
    gradients by it before it combines them, so communication and compression
    see true gradients and `finish()` leaves them unscaled.
    """

    loss_scale: float = 1.0

    @abstractmethod
    def zero_grad(self) -> None:
        """Clear gradients before a step's first micro-batch."""

    def begin_step(self) -> None:  # noqa: B027 - optional hook
        """Called before a step's first forward pass."""

    @contextmanager
    def accumulate(self, last: bool) -> Iterator[None]:
        """Around one micro-batch's forward and backward; `last` marks the step's final one."""
        yield

    @abstractmethod
    def finish(self) -> float:
        """Complete the step's gradient combination; returns seconds spent blocked on it."""

    def bytes_per_step(self) -> int:
        """Gradient bytes this worker hands to communication per step."""
        return 0

    def nonfinite(self) -> dict[int, list[str]]:
        """After `finish()`: {rank: parameter names} of ranks whose *local* gradients held NaN
        or Inf this step, the same answer on every rank (collective where the sync is).
        A sync that cannot tell returns {}."""
        return {}

    def norm_share(self) -> torch.Tensor | None:
        """After `finish()`: this rank's share of the squared global gradient norm, the
        shares of all ranks adding up to it (`training/clipping.py norm_share`), for a
        sync whose `agree` carries it; None (the default): the learner takes the norm."""
        return None

    def agree(self, share: torch.Tensor | None) -> Agreement:
        """After `finish()`: `nonfinite()` and, given this rank's `norm_share`, the global
        gradient norm, in as few collectives as the sync can (one where it is overridden:
        `nonfinite.agree_on_step`). Only `norm_share`'s syncs are given a share."""
        return Agreement(self.nonfinite())

    def take_sent_bytes(self) -> int:
        """Bytes this rank sent since the last call (counted where shoal sends them)."""
        return 0

    def interval_metrics(self) -> dict[str, float]:
        """Collective, at each logging interval: metrics of the communication scheme."""
        return {}

    def rank_state_dict(self) -> dict[str, torch.Tensor]:
        """State this rank holds alone (e.g. compression residuals): the same names and
        shapes on every rank; the strategy gathers every rank's into the checkpoint."""
        return {}

    def load_rank_state_dict(self, state: dict[str, torch.Tensor]) -> None:  # noqa: B027
        """Restore this rank's part of what `rank_state_dict` returned."""


class AgreeingSync(GradientSync):
    """A sync whose ranks agree after `finish()` in one all-reduce over the world
    (`nonfinite.agree_on_step`): the non-finite flags, the stop signals and, given each
    rank's `norm_share`, the global gradient norm. `finish()` leaves this rank's non-finite
    gradient names in `found`; `agree_device` is where the agreement's tensor is made."""

    found: list[str]

    @property
    @abstractmethod
    def agree_device(self) -> torch.device:
        """The device of this rank's gradients."""

    def nonfinite(self) -> dict[int, list[str]]:
        """Collective (it also carries the stop agreement)."""
        return self.agree(None).nonfinite

    def agree(self, share: torch.Tensor | None) -> Agreement:
        """Collective: one all-reduce for the non-finite and stop agreement and the global
        norm (the ranks' shares summed: clipping then needs no collective of its own)."""
        return agree_on_step(self.found, self.agree_device, share)


def unscaled_grads(
    named: list[tuple[str, nn.Parameter]], loss_scale: float
) -> list[tuple[str, torch.Tensor]]:
    """The named gradients no one else combines, divided by the loss scale (an Inf or a
    NaN stays one), for a `GradientCheck`."""
    grads = [(n, p.grad) for n, p in named if p.grad is not None]
    if loss_scale != 1.0:
        for _, grad in grads:
            grad.div_(loss_scale)
    return grads


class LocalGradientSync(GradientSync):
    """One process: gradients stay as backward left them (unscaled, if the loss was).

    Its step costs the host one look at the GPU: `finish()` starts the check of the
    gradients for NaN and Inf (`GradientCheck`), whose norms also give the clipping norm,
    and `agree` reads both at once."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.named = list(model.named_parameters())
        self.params = [param for _, param in self.named]
        self._check = GradientCheck([])

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None

    def finish(self) -> float:
        self._check = GradientCheck(unscaled_grads(self.named, self.loss_scale))
        return 0.0

    def norm_share(self) -> torch.Tensor:
        """The whole squared norm: this process holds every gradient."""
        return self._check.square()

    def agree(self, share: torch.Tensor | None) -> Agreement:
        """This process alone: no collective (a local learner may step on its own schedule)."""
        names, square = self._check.read(with_square=share is not None)
        rank = dist.get_rank() if dist.is_initialized() else 0
        norm = None if square is None else math.sqrt(max(square, 0.0))
        return Agreement({rank: names} if names else {}, norm)

    def nonfinite(self) -> dict[int, list[str]]:
        return self.agree(None).nonfinite


class TrainingStrategy(Protocol):
    """The part of a strategy the trainer calls."""

    def attach(self, model: nn.Module) -> GradientSync:
        """Prepare `model` and return how its gradients are combined each step."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def describe(self) -> str: ...
