"""One client's local work in a round: start from the global model, train on its own shard.

A worker hosts many clients and runs them in turn on one model object: each
client loads the global weights, trains with a fresh :class:`Learner` (the local
optimizer starts anew every round, as in FedAvg), and returns its model update
Delta_i = x_i - x. Its randomness (shuffling, dropout) is seeded by
(train.seed, round, client), so a client computes the same update whichever
worker hosts it, and a resumed run repeats it exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from shoal.config.train import TrainConfig
from shoal.protocols.task import Task
from shoal.strategies.federated.aggregation import FedAvg
from shoal.strategies.federated.config import ClientFault, FederatedStrategyConfig
from shoal.strategies.federated.vector import ModelVector
from shoal.training.batching import EpochPlan, steps_per_epoch
from shoal.training.learner import Learner
from shoal.training.meter import RankPhases


class ClientDropped(RuntimeError):
    """A client did not finish its local work in time."""


class InjectedClientFault(RuntimeError):
    """Raised by `[[strategy.inject]] kind = "raise"`."""


@dataclass
class ClientReport:
    """What a client hands back: its update and counts; `status` ok | failed | timed_out."""

    client: int
    status: str
    samples: int = 0
    update: torch.Tensor | None = None
    loss_sum: float = 0.0
    trained: int = 0  # sample-visits over all local steps
    sums: dict[str, float] = field(default_factory=dict)
    error: str = ""


def client_seed(seed: int, rnd: int, client: int) -> int:
    """The seed of one client's randomness in one round."""
    return int(np.random.SeedSequence([seed, rnd, client]).generate_state(1)[0])


class ClientRunner:
    """Runs hosted clients' local training on this worker's model, one after another."""

    def __init__(
        self,
        task: Task,
        vector: ModelVector,
        model: torch.nn.Module,
        aggregation: FedAvg,
        train: TrainConfig,
        config: FederatedStrategyConfig,
    ) -> None:
        self.task = task
        self.vector = vector
        self.model = model
        self.aggregation = aggregation
        self.train = train
        self.config = config

    def local_steps(self, samples: int) -> int:
        if self.config.local_steps is not None:
            return self.config.local_steps
        per_epoch = steps_per_epoch(samples, self.train.batch_size, self.train.drop_last)
        return (self.config.local_epochs or 1) * per_epoch

    def run(
        self,
        client: int,
        shard: torch.Tensor,
        rnd: int,
        global_x: torch.Tensor,
        deadline: float | None,
        fault: ClientFault | None = None,
        phases: RankPhases | None = None,
    ) -> ClientReport:
        """Train `client` from `global_x`; raises on failure (the caller drops the client).
        Each local step's phases are added to `phases` (the worker's round)."""
        if deadline is not None and time.monotonic() >= deadline:
            raise ClientDropped("the round's deadline passed before the client could start")
        self.vector.write(global_x)
        seed = client_seed(self.train.seed, rnd, client)
        torch.manual_seed(seed)
        anchor = [p.detach().clone() for p in self.model.parameters()]
        sync = self.aggregation.client_sync(self.model, anchor)
        total = self.local_steps(len(shard))
        learner = Learner(self.task, self.model, sync, self.train, max(total, 1), share=(0, 1))
        report = ClientReport(client, "ok", samples=len(shard))
        self.model.train()
        done, epoch = 0, 0
        loss_sum = torch.zeros((), dtype=torch.float64)
        sums: dict[str, torch.Tensor | int] = {}
        while done < total:
            plan = EpochPlan(
                len(shard),
                self.train.batch_size,
                epoch,
                seed,
                self.train.shuffle,
                self.train.drop_last,
            )
            for step in range(plan.num_steps):
                if done >= total:
                    break
                self._maybe_fail(fault, deadline)
                if deadline is not None and time.monotonic() >= deadline:
                    raise ClientDropped(f"still training after {done} of {total} local steps")
                stats = learner.step(shard[plan.global_batch(step)])
                if phases is not None:
                    phases.add_step(stats)
                loss_sum += stats.loss_sum
                report.trained += stats.samples
                for name, value in stats.sums.items():
                    sums[name] = sums.get(name, 0) + value
                done += 1
            epoch += 1
        report.loss_sum = float(loss_sum)
        report.sums = {name: float(value) for name, value in sums.items()}
        report.update = self.vector.read() - global_x
        return report

    def _maybe_fail(self, fault: ClientFault | None, deadline: float | None) -> None:
        """Injected client faults: raise, or stall until the round's deadline has passed."""
        if fault is None:
            return
        if fault.kind == "raise":
            raise InjectedClientFault(f"injected fault in client {fault.client}")
        while deadline is not None and time.monotonic() < deadline:
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
