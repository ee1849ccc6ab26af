"""Server-side aggregation: FedAvg, FedProx, and the adaptive server optimizers.

One family, after Flower's design: :class:`FedAvg` owns the two hooks a round
calls, `client_sync` (what a client's local steps do with gradients) and
`server_step` (how the averaged update moves the global model). FedProx changes
only the client's objective; FedAdagrad, FedAdam and FedYogi change only the
server step (Reddi et al., "Adaptive Federated Optimization", ICLR 2021).

Notation: x is the global model (a flat vector), Delta_i = x_i - x the model
update of client i after its local work, n_i its number of samples.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn

from shoal.plugins.registry import closed_choice
from shoal.training.contracts import GradientSync, LocalGradientSync


class FedAvg:
    """Federated Averaging (McMahan et al., AISTATS 2017).

        Delta = sum_i n_i * Delta_i / sum_i n_i        x <- x + Delta

    With one local step of full-batch SGD per client, Delta = -lr * (sum_i n_i g_i) / n
    = -lr * g, the full-batch gradient step: FedAvg then *is* centralized SGD.

    >>> [strategy.aggregation]
    >>> method = "fedavg"
    """

    def __init__(self, config: Any, size: int) -> None:
        self.config = config
        self.size = size

    def client_sync(self, model: nn.Module, global_params: list[torch.Tensor]) -> GradientSync:
        """What happens to a client's gradients between backward and its optimizer step."""
        return LocalGradientSync(model)

    def server_step(self, x: torch.Tensor, delta: torch.Tensor) -> None:
        """Move the global model `x` (in place) by the averaged update `delta`."""
        x.add_(delta)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the server state that `state_dict` returned."""


class ProximalGradientSync(LocalGradientSync):
    """Adds the gradient of (mu/2)||w - w_global||^2, that is mu * (w - w_global), to .grad."""

    def __init__(self, model: nn.Module, global_params: list[torch.Tensor], mu: float) -> None:
        super().__init__(model)
        self.global_params = global_params
        self.mu = mu

    def finish(self) -> float:
        if self.mu:
            with torch.no_grad():
                for param, anchor in zip(self.model.parameters(), self.global_params, strict=True):
                    if param.grad is not None:
                        param.grad.add_(param.detach() - anchor, alpha=self.mu)
        return 0.0


class FedProx(FedAvg):
    """FedProx (Li et al., MLSys 2020): FedAvg whose clients minimize

        F_i(w) + (mu/2) * ||w - x||^2

    The proximal term keeps heterogeneous clients from drifting away from the
    global model x. With mu = 0 it is exactly FedAvg.

    >>> [strategy.aggregation]
    >>> method = "fedprox"
    >>> mu = 0.01
    """

    def client_sync(self, model: nn.Module, global_params: list[torch.Tensor]) -> GradientSync:
        return ProximalGradientSync(model, global_params, self.config.mu)


class FedOpt(FedAvg, ABC):
    """A server optimizer on the FedAvg update (Reddi et al., ICLR 2021, Algorithm 2).

    Delta_t is FedAvg's averaged update (a negative pseudo-gradient). Then

        m_t = beta1 * m_{t-1} + (1 - beta1) * Delta_t
        v_t = second_moment(v_{t-1}, Delta_t^2)           (per variant)
        x_{t+1} = x_t + eta * m_t / (sqrt(v_t) + tau)

    with m_{-1} = 0 and v_{-1} = tau^2, as in the paper (no bias correction).
    """

    def __init__(self, config: Any, size: int) -> None:
        super().__init__(config, size)
        self.m = torch.zeros(size, dtype=torch.float32)
        self.v = torch.full((size,), config.tau**2, dtype=torch.float32)

    @abstractmethod
    def second_moment(self, v: torch.Tensor, delta_sq: torch.Tensor) -> torch.Tensor:
        """v_t from v_{t-1} and the squared pseudo-gradient: what tells the variants apart."""

    def server_step(self, x: torch.Tensor, delta: torch.Tensor) -> None:
        c = self.config
        self.m.mul_(c.beta1).add_(delta, alpha=1 - c.beta1)
        self.v = self.second_moment(self.v, delta * delta)
        x.add_(c.server_lr * self.m / (self.v.sqrt() + c.tau))

    def state_dict(self) -> dict[str, Any]:
        return {"m": self.m.clone(), "v": self.v.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.m = state["m"].clone()
        self.v = state["v"].clone()


class FedAdagrad(FedOpt):
    """FedAdagrad: v_t = v_{t-1} + Delta_t^2.

    >>> [strategy.aggregation]
    >>> method = "fedadagrad"
    >>> server_lr = 0.01
    """

    def second_moment(self, v: torch.Tensor, delta_sq: torch.Tensor) -> torch.Tensor:
        return v + delta_sq


class FedAdam(FedOpt):
    """FedAdam: v_t = beta2 * v_{t-1} + (1 - beta2) * Delta_t^2.

    >>> [strategy.aggregation]
    >>> method = "fedadam"
    >>> server_lr = 0.01
    """

    def second_moment(self, v: torch.Tensor, delta_sq: torch.Tensor) -> torch.Tensor:
        return self.config.beta2 * v + (1 - self.config.beta2) * delta_sq


class FedYogi(FedOpt):
    """FedYogi: v_t = v_{t-1} - (1 - beta2) * Delta_t^2 * sign(v_{t-1} - Delta_t^2).

    Yogi's additive, sign-controlled update lets v grow or shrink by at most
    (1 - beta2) * Delta^2 per round, so the effective step changes gradually.

    >>> [strategy.aggregation]
    >>> method = "fedyogi"
    >>> server_lr = 0.01
    >>> beta1 = 0.9
    >>> beta2 = 0.99
    >>> tau = 0.001
    """

    def second_moment(self, v: torch.Tensor, delta_sq: torch.Tensor) -> torch.Tensor:
        return v - (1 - self.config.beta2) * delta_sq * torch.sign(v - delta_sq)


AGGREGATIONS = closed_choice(
    "federated aggregation method",
    "method",
    "shoal.strategies.federated.aggregation",
    "shoal.strategies.federated.config",
    {
        "fedavg": ("FedAvg", "FedAvgConfig"),
        "fedprox": ("FedProx", "FedProxConfig"),
        "fedadagrad": ("FedAdagrad", "FedAdagradConfig"),
        "fedadam": ("FedAdam", "FedAdamConfig"),
        "fedyogi": ("FedYogi", "FedYogiConfig"),
    },
)
"""The federated aggregation methods, by their config's `method`."""
