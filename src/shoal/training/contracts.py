"""What the shared training loop needs from a strategy, and what it does with gradients.

The trainer is written against these two contracts only, so any strategy (and
any gradient communication scheme) that fulfils them runs under the same loop.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from torch import nn


class GradientSync(ABC):
    """What happens to gradients in a step: accumulate, then combine across workers."""

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


class LocalGradientSync(GradientSync):
    """One process: gradients stay as backward left them."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.params = list(model.parameters())

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None

    def finish(self) -> float:
        return 0.0


class TrainingStrategy(Protocol):
    """The part of a strategy the trainer calls."""

    def attach(self, model: nn.Module) -> GradientSync:
        """Prepare `model` and return how its gradients are combined each step."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def describe(self) -> str: ...
