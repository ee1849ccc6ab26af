"""One model under optimization: the step that every strategy's training is made of.

A step takes this learner's share of a global batch, splits it into micro-batches,
runs forward and backward with the loss sum scaled by 1 / global batch size, lets
the gradient sync combine gradients across workers, halts (or skips the update)
if any worker's local gradients were not finite, clips by the (then global)
norm, and steps the optimizer and the schedule. The Trainer drives one learner
through epochs; strategies with their own outer loop (federated clients,
population members) drive learners directly.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shoal.checkpoint.parts import Custom, FilePart, ModelPart, StatePart, collect, load_parts
from shoal.checkpoint.sharded import MARKER, load_plain_optimizer, sharded_part
from shoal.config.train import TrainConfig
from shoal.errors import TrainingHalted
from shoal.protocols.task import LossOutput, Task
from shoal.training.balance import BatchShares
from shoal.training.batching import local_share, micro_batches
from shoal.training.clipping import clip_by_global_norm, clip_to_norm, global_norm
from shoal.training.contracts import GradientSync
from shoal.training.dropout import key_dropout
from shoal.training.faults import straggle
from shoal.training.meter import StepStats
from shoal.training.nonfinite import describe_nonfinite
from shoal.training.optim import WarmupDecay, build_factor, build_optimizer, build_scheduler
from shoal.training.precision import Precision

#: learner parts a checkpoint may lack: older ones kept no optimizer kind; fp16 only
LEARNER_OPTIONAL = ("optimizer_kind", "precision")


class Learner:
    """A model with its optimizer, schedule and gradient sync.

    `share` is (index, count) of this learner within the group that splits each
    global batch: (rank, world_size) for data-parallel replicas, (0, 1) for a
    learner that trains on whole batches alone. `shares`, when given, decides the
    slice instead (data_parallel's dynamic balance, `training/balance.py`).

    The global gradient norm before clipping comes with every step that clips (clipping
    computes it anyway) and, without clipping, with the steps the step loop logs
    (`norm_every`, its `monitor.log_every_steps`): one more pass over the gradients
    only at logged steps. Each step is timed in phases (data, forward and backward,
    communication wait, optimizer) for the report's per-rank time bars.
    """

    def __init__(
        self,
        task: Task,
        model: nn.Module,
        sync: GradientSync,
        train: TrainConfig,
        total_steps: int,
        share: tuple[int, int] = (0, 1),
        norm_every: int = 0,
        shares: BatchShares | None = None,
    ) -> None:
        self.task = task
        #: measure the gradient norm at steps whose number (1-based) this divides, when
        #: clipping does not measure it anyway (0: only when clipping)
        self.norm_every = norm_every
        self.model = model
        self.sync = sync
        self.train = train
        self.share = share
        self.shares = shares
        self.device = next(model.parameters()).device
        self.optimizer = build_optimizer(model.parameters(), train.optimizer)
        self.scheduler = build_scheduler(self.optimizer, train, total_steps)
        self.total_steps = total_steps
        self.precision = Precision(train.mixed_precision, self.device)
        #: False on a rank whose samples another rank of the step already counts (the ranks
        #: of a tensor dimension past coordinate 0 compute on their group's samples): its
        #: loss and sample counts then add nothing to the interval's sums over the ranks
        self.counted = True
        # a sharded model's parameters and optimizer state are saved by every rank (DCP)
        self.sharded = sharded_part(model, self.optimizer)
        self._loaded_kind: str | None = None  # while loading: the saved optimizer's kind
        self._fresh: list[dict[str, Any]] = []  # while loading: the config's param groups
        #: dropout masks keyed by sample and step (training/dropout.py), so that how a step's
        #: batch is split over ranks and micro-batches does not change them
        self.dropout_keys = key_dropout(model, train.seed)

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def step(self, global_batch: torch.Tensor, global_step: int | None = None) -> StepStats:
        """One optimizer step on this learner's share of `global_batch` (sample indices).

        `global_step` names the step in a halt message and says whether to measure the
        gradient norm (`norm_every`).
        """
        started = time.perf_counter()
        self._data_s = 0.0
        if self.dropout_keys is not None:
            self.dropout_keys.step = global_step  # None: torch's own dropout
        unit = self.task.batch_unit
        if self.shares is not None:
            local = self.shares.local(global_batch, unit)
        else:
            local = local_share(global_batch, *self.share, unit)
        scale = 1.0 / len(global_batch)
        loss_scale = self.precision.loss_scale
        self.sync.zero_grad()
        self.sync.loss_scale = loss_scale
        self.sync.begin_step()
        work_started = time.perf_counter()
        loss_sum, sums, samples = self.forward_backward(local, scale, loss_scale)
        if not self.counted:
            loss_sum, samples = torch.zeros_like(loss_sum), 0
            sums = {name: value * 0 for name, value in sums.items()}
        comm_started = time.perf_counter()
        work_s = comm_started - work_started
        comm_s = self.sync.finish()
        optimizer_started = time.perf_counter()
        clip = self.train.grad_clip_norm
        want_norm = clip is not None or self._norm_due(global_step)
        agreed = self.sync.agree(self.sync.norm_share() if want_norm else None)
        nonfinite = agreed.nonfinite
        if nonfinite and self.train.on_nonfinite == "halt":
            where = f" at step {global_step}" if global_step is not None else ""
            named = describe_nonfinite(nonfinite, self.task.ctx.describe_rank)
            raise TrainingHalted(
                f"training halted{where}: non-finite gradients (NaN/Inf) on "
                f"{named}; every worker stopped "
                "before the optimizer step, so the newest checkpoint is the last good state. "
                "Resume from it with a "
                "lower train.optimizer.lr or a train.grad_clip_norm, or set "
                'train.on_nonfinite = "skip_step" to skip such steps'
            )
        norm: float | None = None
        if not nonfinite:  # agreed on every rank: the norm's collectives run on all or none
            if clip is not None:
                norm = self.clip(clip, agreed.norm)
            elif want_norm:
                norm = agreed.norm if agreed.norm is not None else self.grad_norm()
            self.optimizer.step()
        self.precision.update(overflowed=bool(nonfinite))
        self.scheduler.step()
        ended = time.perf_counter()
        wall = ended - started
        return StepStats(
            loss_sum,
            samples,
            sums,
            wall - comm_s,
            comm_s,
            wall,
            sent_bytes=self.sync.take_sent_bytes(),
            skipped=bool(nonfinite),
            data_s=self._data_s,
            # the non-finite agreement, clipping, the optimizer and the schedule
            optimizer_s=ended - optimizer_started,
            grad_norm=norm,
            forward_backward_s=comm_started - started - self._data_s,
            work_s=work_s,
        )

    def _norm_due(self, global_step: int | None) -> bool:
        every = self.norm_every
        return bool(every) and global_step is not None and (global_step + 1) % every == 0

    def forward_backward(
        self, local: torch.Tensor, scale: float, loss_scale: float
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        """Forward and backward of this learner's share of a step, in micro-batches, with
        each micro-batch's loss sum scaled by `scale` (1 / global batch) and `loss_scale`.

        Returns the loss sum, the task's other sums and the samples they cover. A pipeline
        stage overrides it: its schedule runs the micro-batches over the stages."""
        loss_sum = torch.zeros((), device=self.device)
        sums: dict[str, torch.Tensor] = {}
        parts = micro_batches(local, self.train.micro_batches, self.task.batch_unit)
        for index, part in enumerate(parts):
            with self.sync.accumulate(last=index == len(parts) - 1):
                if len(part) == 0:
                    continue
                fetched = time.perf_counter()
                batch = self.task.train_batch(part)
                self._data_s += time.perf_counter() - fetched
                started = time.perf_counter()
                if self.dropout_keys is not None:
                    self.dropout_keys.rows = part
                with self.precision.autocast():
                    out: LossOutput = self.task.loss(self.model, batch)
                if self.dropout_keys is not None:
                    self.dropout_keys.rows = None
                if loss_scale == 1.0:
                    (out.loss_sum * scale).backward()
                else:
                    (out.loss_sum * (scale * loss_scale)).backward()
                straggle(started)  # `[faults.inject] kind = "slow"`: a slower machine
            loss_sum += out.loss_sum.detach()
            for name, value in out.sums.items():
                sums[name] = sums.get(name, 0) + value.detach()
        return loss_sum, sums, len(local)

    def clip(self, max_norm: float, norm: float | None = None) -> float:
        """Clip the gradients by their global norm; returns the norm before clipping. After
        the sync every replica holds the global gradient (or its shard of it: the norm is
        then summed over the shards, `training/clipping.py`). `norm`: the global norm,
        already agreed on with the step's other figures (a sync with a `norm_share`)."""
        if norm is None:
            return clip_by_global_norm(self.model.parameters(), max_norm)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        clip_to_norm(grads, max_norm, norm)
        return norm

    def grad_norm(self) -> float:
        """The global 2-norm of the gradients, unchanged (collective when they are sharded)."""
        return global_norm([p.grad for p in self.model.parameters() if p.grad is not None])

    def parts(self) -> dict[str, StatePart]:
        """The learner's checkpoint parts, in load order (`checkpoint/parts.py`)."""
        parts: dict[str, StatePart] = {
            "model": self.sharded or ModelPart(self.model),
            "optimizer_kind": Custom(lambda: self.train.optimizer.kind, self._saved_kind),
            "optimizer": _OptimizerPart(self),
            "scheduler": Custom(self.scheduler.state_dict, self._load_scheduler),
        }
        if self.precision.mode == "fp16":
            parts["precision"] = self.precision
        return parts

    def file_parts(self) -> list[FilePart]:
        """A sharded model's pieces, written by every rank into the checkpoint folder."""
        return [self.sharded.files()] if self.sharded else []

    def state_dict(self) -> dict[str, Any]:
        return collect(self.parts(), is_main=True)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a saved state under the current config.

        The config decides the optimizer's hyperparameters and the schedule (a resume
        may extend the run, or change the learning rate with --allow-changes): torch's
        `load_state_dict` would bring back the saved ones silently. A saved optimizer of
        another kind has state this one cannot use: the optimizer then starts afresh.
        """
        self._loaded_kind = None
        load_parts(state, self.parts(), Path("the checkpoint"), optional=LEARNER_OPTIONAL)

    def _saved_kind(self, kind: str) -> None:
        self._loaded_kind = kind

    def _load_optimizer(self, state: dict[str, Any], folder: Path | None = None) -> None:
        self._fresh = [
            {k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups
        ]
        if self._loaded_kind not in (None, self.train.optimizer.kind):
            return
        if self.sharded is not None:
            self.sharded.load_optimizer(state)
        elif folder is not None:
            load_plain_optimizer(self.optimizer, self.model, state, folder)
        else:
            self.optimizer.load_state_dict(state)

    def _load_scheduler(self, state: dict[str, Any]) -> None:
        """After the optimizer: the schedule of the current config (a resumed run may have
        been extended) at the saved step, continuing the plateau state the checkpoint saved."""
        fresh = self._fresh
        self.scheduler.load_state_dict(state)
        factor = build_factor(self.train, self.total_steps)
        saved = self.scheduler.lr_lambdas[0]
        assert isinstance(saved, WarmupDecay)
        factor.take_state(saved)
        self.scheduler.lr_lambdas[0] = factor
        self.scheduler.base_lrs = [g["initial_lr"] for g in fresh]
        step = self.scheduler.last_epoch
        for group, settings in zip(self.optimizer.param_groups, fresh, strict=True):
            group.update({k: v for k, v in settings.items() if k != "lr"})
            group["lr"] = group["initial_lr"] * factor(step)
        self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def observe_metric(self, value: float, direction: str) -> None:
        """An evaluation's value of the task's primary metric: lr_decay = "plateau" may lower
        the rate, from the next step on."""
        factor = self.scheduler.lr_lambdas[0]
        assert isinstance(factor, WarmupDecay)
        if factor.observe(value, direction):
            step = self.scheduler.last_epoch
            for group, base in zip(
                self.optimizer.param_groups, self.scheduler.base_lrs, strict=True
            ):
                group["lr"] = base * factor(step)


class _OptimizerPart:
    """`optimizer`: torch's state dict, or the marker of a sharded learner's (its state is in
    the DCP pieces); loads either kind into either kind of learner."""

    def __init__(self, learner: Learner) -> None:
        self.learner = learner

    def state_dict(self) -> Any:
        learner = self.learner
        return dict(MARKER) if learner.sharded else learner.optimizer.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.learner._load_optimizer(state)

    def load_from(self, state: Any, folder: Path) -> None:
        self.learner._load_optimizer(state, folder)
