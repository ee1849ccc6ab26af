"""One member of a population: a learner, its own data position and its own random streams.

A member owns everything that makes its training its own: its model, optimizer
and schedule (a :class:`~shoal.training.learner.Learner` with a local gradient
sync: one worker trains it on whole batches), its position in its own shuffle
of the data, and its generator states (dropout, sampling). The generators are
swapped in while it trains and out when it stops, so a member trains the same
whichever worker it lives on, however many members share that worker, and after
a resume.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from shoal.errors import ShoalError, TrainingHalted
from shoal.protocols.task import Task
from shoal.runtime.context import WorkerContext
from shoal.runtime.rng import capture_rng, restore_rng, seed_everything
from shoal.strategies.population.hyperparams import apply_hyperparameters
from shoal.strategies.population.space import Hyperparameters
from shoal.training.batching import EpochPlan
from shoal.training.contracts import LocalGradientSync
from shoal.training.learner import Learner
from shoal.training.meter import RankPhases
from shoal.training.state import TrainProgress


@dataclass
class GenerationStats:
    """What one member did in one generation."""

    loss: float = math.nan
    samples: int = 0
    steps: int = 0
    compute_s: float = 0.0
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    eval_s: float = 0.0


def describe(exc: BaseException) -> str:
    """`Type: first line of the message`, for logs and metrics."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


class Member:
    def __init__(
        self,
        ctx: WorkerContext,
        task: Task,
        index: int,
        seed: int,
        total_steps: int,
        taken: list[nn.Module],
    ) -> None:
        self.ctx = ctx
        self.task = task
        self.index = index
        self.seed = seed  # initialization, data order and training-time randomness
        seed_everything(seed)
        model = task.build_model()
        if any(model is other for other in taken):
            model = copy.deepcopy(model)  # a task that hands out one module (a user's factory)
        model = model.to(ctx.device)
        self.learner = Learner(
            task, model, LocalGradientSync(model), ctx.config.train, total_steps, share=(0, 1)
        )
        self.progress = TrainProgress()
        self.rng = capture_rng()
        self._plan: EpochPlan | None = None
        self._plan_epoch = -1

    @property
    def model(self) -> nn.Module:
        return self.learner.model

    def set_hyperparameters(self, hyper: Hyperparameters) -> None:
        apply_hyperparameters(hyper, self.learner, self.task, self.model)

    # ------------------------------------------------------------ training
    def _plan_for(self, epoch: int) -> EpochPlan:
        if self._plan is None or self._plan_epoch != epoch:
            train = self.ctx.config.train
            self._plan = EpochPlan(
                self.task.train_size,
                train.batch_size,
                epoch,
                self.seed,
                train.shuffle,
                train.drop_last,
            )
            self._plan_epoch = epoch
        return self._plan

    def next_batch(self) -> torch.Tensor:
        """The next batch of this member's data, and the position moved past it."""
        p = self.progress
        plan = self._plan_for(p.epoch)
        batch = plan.global_batch(p.step_in_epoch)
        p.step_in_epoch += 1
        p.global_step += 1
        p.samples_seen += len(batch)
        if p.step_in_epoch >= plan.num_steps:
            p.epoch += 1
            p.step_in_epoch = 0
        return batch

    def train(
        self, steps: int, before_step: Any, phases: RankPhases | None = None
    ) -> GenerationStats:
        """Train `steps` steps with this member's generators; a failure is caught and returned.
        Each step's phases are added to `phases` (the worker's generation).

        An exception in a step (other than a user error) or a non-finite loss marks
        the member failed; its data position still moves to the generation's end,
        so every member stays at the same step, and the population replaces it.
        """
        stats = GenerationStats()
        target = self.progress.global_step + steps
        loss_sum = torch.zeros((), dtype=torch.float64)
        outer_rng = capture_rng()
        restore_rng(self.rng)
        self.model.train()
        started = time.perf_counter()
        try:
            while self.progress.global_step < target:
                before_step(self.progress.global_step)
                step = self.learner.step(self.next_batch())
                if phases is not None:
                    phases.add_step(step)
                loss_sum += step.loss_sum.detach().double().cpu()
                stats.samples += step.samples
                stats.steps += 1
        except Exception as exc:  # the member fails (or diverges), the population goes on
            if isinstance(exc, ShoalError) and not isinstance(exc, TrainingHalted):
                raise  # a user error stops the job
            halted = isinstance(exc, TrainingHalted)
            stats.error = "diverged: non-finite gradients" if halted else describe(exc)
            while self.progress.global_step < target:
                self.next_batch()
        finally:
            stats.compute_s = time.perf_counter() - started
            self.rng = capture_rng()
            restore_rng(outer_rng)
        if stats.error is None:
            stats.loss = float(loss_sum) / max(stats.samples, 1)
            if not math.isfinite(stats.loss):
                stats.error = f"diverged: training loss is {stats.loss}"
        return stats

    # ------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue this member exactly (checkpoints)."""
        return {
            **self.learner.state_dict(),
            "progress": self.progress.state_dict(),
            "rng": torch.frombuffer(bytearray(self.rng), dtype=torch.uint8),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.learner.load_state_dict(state)
        self.progress.load_state_dict(state["progress"])
        self.rng = bytes(state["rng"].cpu().numpy().tobytes())
        self._plan = None

    def exploit_state(self) -> dict[str, Any]:
        """What a member that exploits this one copies: weights, optimizer state and schedule.

        Not the data position nor the generators: the copy goes on with its own.
        """
        return self.learner.state_dict()

    def load_exploit_state(self, state: dict[str, Any]) -> None:
        self.learner.load_state_dict(state)
