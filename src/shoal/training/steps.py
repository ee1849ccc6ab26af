"""The step loop: the unit of local, data_parallel and parameter_server training is one step.

The loop picks each step's global batch (a function of seed and epoch) and
hands it to its :class:`~shoal.training.learner.Learner` (this rank's slice,
micro-batches, gradient sync, global-norm clipping, optimizer and schedule);
every `monitor.log_every_steps` steps it logs the interval's figures. Its
checkpoint parts are the learner's (model, optimizer, schedule), the
strategy's (aggregation residuals, gathered from every rank) and, through the
driver, the data position and every rank's RNG state, so a resumed run on CPU
ends bit-identical to one that never stopped.

A strategy that trains otherwise subclasses it and overrides what differs:
the model it builds, the learner around it, its model of record, its files and
results (the parameter server's workers, whose model lives on the servers; a
pipeline, whose learner runs a schedule over stages; an SPMD mesh).
"""

from __future__ import annotations

import copy
import resource
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from shoal.checkpoint.integrity import load_checkpoint
from shoal.checkpoint.parts import Custom, FilePart, StatePart
from shoal.checkpoint.sharded import load_model
from shoal.config.custom import own_config
from shoal.errors import ShoalError
from shoal.protocols.capabilities import SHARD_UNITS
from shoal.runtime.context import WorkerContext
from shoal.runtime.rng import seed_everything, worker_seed
from shoal.runtime.stop import STOP
from shoal.training.balance import BatchShares, split_counts
from shoal.training.batching import EpochPlan, steps_per_epoch
from shoal.training.blocks import prepare_blocks, wants_blocks
from shoal.training.contracts import GradientSync, TrainingStrategy
from shoal.training.faults import maybe_inject_fault
from shoal.training.learner import Learner
from shoal.training.loop import ModelOfRecord, Plan, Run, UnitLoop
from shoal.training.materialise import draw_base, materialise, meta_builder
from shoal.training.meter import IntervalMeter, StepStats


class StepLearner(Protocol):
    """What the step loop drives: a :class:`Learner`, or a parameter-server worker's."""

    @property
    def model(self) -> nn.Module: ...

    @property
    def sync(self) -> GradientSync: ...

    @property
    def lr(self) -> float: ...

    def step(self, global_batch: torch.Tensor, global_step: int | None = None) -> StepStats: ...

    def parts(self) -> dict[str, StatePart]: ...

    def observe_metric(self, value: float, direction: str) -> None: ...


class LocalModel:
    """The model of record of a learner that holds its model: the best is a copy in memory.

    What the copy is of is `kept`, the model itself; a record whose model is more than
    this rank holds (a pipeline's forward through every rank's stages) keeps its own part
    instead and reads a saved best into it by `load_saved`."""

    def __init__(self, ctx: WorkerContext, model: nn.Module) -> None:
        self.ctx, self._model = ctx, model
        self.best: dict[str, torch.Tensor] | None = None

    @property
    def model(self) -> nn.Module:
        return self._model

    @property
    def kept(self) -> nn.Module:
        """The module whose state the best copy is."""
        return self._model

    def load_saved(self, state: Any, folder: Path) -> None:
        """`kept` from a checkpoint's `model` (`folder`: the checkpoint)."""
        load_model(self.kept, state, folder)  # either kind, sharded or plain

    def validated(self, best: bool) -> None:
        if best:
            state = self.kept.state_dict()
            self.best = {k: t.detach().to("cpu", copy=True) for k, t in state.items()}

    def restore_best(self, saved: Path | None) -> bool:
        if self.best is None and saved is not None:
            state, _ = load_checkpoint(saved)
            self.load_saved(state["model"], saved)
            return True
        if self.best is None:
            self.ctx.log.warning("no best/ checkpoint to restore: testing the final model")
            return False
        self.kept.load_state_dict(self.best)
        return True


def drops_last_batch(ctx: WorkerContext, train_size: int) -> bool:
    """Whether each epoch's last, shorter batch is dropped: asked (`train.drop_last`), or
    too small for the strategy to train (a pipeline's fixed micro-batch shapes, FSDP ranks
    that each need a sample), said once on the terminal. A batch larger than the whole
    data is refused: every step would train on fewer samples than it says."""
    train = ctx.config.train
    if train.batch_size > train_size:
        raise ShoalError(
            f"train.batch_size ({train.batch_size}) exceeds the {train_size} training samples: "
            f"no step could train on a whole batch; set it to at most {train_size}"
        )
    short = train_size % train.batch_size
    if train.drop_last or not short:
        return train.drop_last
    section = own_config(ctx.config.strategy)
    smallest = getattr(section, "smallest_step_batch", None)
    need, why = smallest(train) if smallest is not None else (1, "")
    if short >= need:
        return False
    if ctx.is_main:
        ctx.log.warning(
            "the last batch of each epoch (%d of the %d samples) is dropped: %s needs at least "
            "%d samples a step (%s); set train.drop_last = true to say so, or choose a "
            "batch_size that divides %d",
            short, train_size, ctx.config.strategy.type, need, why, train_size,
        )  # fmt: skip
    return True


class StepLoop(UnitLoop):
    """Steps over epochs of the training data, one global batch per unit.

    `shares`: each rank's slice of a global batch, re-planned from measured speeds
    (data_parallel's dynamic balance; None: even slices)."""

    def __init__(
        self, run: Run, strategy: TrainingStrategy, shares: BatchShares | None = None
    ) -> None:
        super().__init__(run)
        ctx, task = self.ctx, self.task
        self.strategy, self.shares = strategy, shares
        self.train = train = ctx.config.train
        self._epoch_plan: EpochPlan | None = None  # the epoch's batches, made at its first step
        self._plan_epoch = -1
        seed_everything(train.seed)  # identical initial parameters on every rank
        model = self.build_model()
        sync = strategy.attach(model)
        ctx.log.info(
            "model ready: %.3f MiB of parameters on this rank, peak resident memory so far "
            "%.0f MiB",
            sum(_local_bytes(p) for p in model.parameters()) / 2**20,
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        )
        self.drop_last = drops_last_batch(ctx, task.train_size)
        self.steps_per_epoch = steps_per_epoch(task.train_size, train.batch_size, self.drop_last)
        limits = []
        if train.epochs is not None:
            limits.append(train.epochs * self.steps_per_epoch)
        if train.max_steps is not None:
            limits.append(train.max_steps)
        self.total_steps = min(limits)
        self.learner = self.make_learner(model, sync)
        self.record = self.make_record()
        self.meter = IntervalMeter()
        seed_everything(worker_seed(train.seed, ctx.rank))  # a resume puts the saved ones back
        self.plan = Plan(
            unit="step",
            total=self.total_steps,
            epochs=train.epochs,
            line=(
                f"training {ctx.config.task.type} with {strategy.describe()}: "
                f"{task.train_size} samples, {self.steps_per_epoch} steps/epoch, "
                f"{self.total_steps} steps in all"
            ),
            optional_parts=("optimizer_kind", "precision", "strategy"),
        )

    # ---------------------------------------------------------------- what a strategy may change
    def build_model(self) -> nn.Module:
        """The model as the learner sees it: the task's, on the worker's device. A strategy
        that lays models out gets it built on the meta device where the task can, and
        this rank materialises only its pieces (`training/materialise.py`)."""
        builder = meta_builder(self.task) if self.strategy.lays_out else None
        meta = builder.build_meta_model() if builder is not None else None
        if builder is None or meta is None:
            model = self.task.build_model().to(self.ctx.device)
            if wants_blocks(self.train) and not self.strategy.lays_out:
                prepare_blocks(SHARD_UNITS.of(self.task, "train").shard_units(model), self.train)
            return model
        base = draw_base()  # where the task's own build_model draws it: local == laid out
        shadow = copy.deepcopy(meta)  # unsharded, to initialise a unit at a time in
        self.strategy.lay_out(meta)
        materialise(meta, builder, base, self.ctx.device, shadow, builder.weights_for(shadow))
        return meta

    def make_learner(self, model: nn.Module, sync: GradientSync) -> StepLearner:
        """The learner around the model and its gradient sync."""
        share = (self.ctx.rank, self.ctx.world_size)
        every = self.ctx.config.monitor.log_every_steps  # the norm of every logged step
        return Learner(
            self.task, model, sync, self.train, self.total_steps, share, every, shares=self.shares
        )

    def make_record(self) -> ModelOfRecord:
        """The model of record: the learner's model, its best copy kept in memory."""
        return LocalModel(self.ctx, self.learner.model)

    def state_parts(self) -> dict[str, StatePart]:
        return {
            **self.learner.parts(),
            "strategy": Custom(self.strategy.state_dict, self.strategy.load_state_dict),
        }

    def file_parts(self) -> list[FilePart]:
        return self.learner.file_parts() if isinstance(self.learner, Learner) else []

    def model_of_record(self) -> ModelOfRecord:
        return self.record

    def observe_metric(self, value: float, direction: str) -> None:
        self.learner.observe_metric(value, direction)

    # ---------------------------------------------------------------- the units
    def start(self) -> None:
        self.meter = IntervalMeter()
        self.learner.model.train()

    def done(self) -> bool:
        p, epochs = self.progress, self.train.epochs
        return p.global_step >= self.total_steps or (epochs is not None and p.epoch >= epochs)

    def run_unit(self) -> bool:
        p, train = self.progress, self.train
        plan = self._epoch_plan
        if plan is None or self._plan_epoch != p.epoch:
            self.task.set_epoch(p.epoch)
            self._plan_epoch = p.epoch
            plan = self._epoch_plan = EpochPlan(
                self.task.train_size,
                train.batch_size,
                p.epoch,
                train.seed,
                train.shuffle,
                self.drop_last,
            )
        if p.step_in_epoch < plan.num_steps:
            self._step(plan)
        return p.step_in_epoch >= plan.num_steps

    def _step(self, plan: EpochPlan) -> None:
        p = self.progress
        undo_fault = maybe_inject_fault(self.ctx, p.global_step, self.learner.model)
        batch = plan.global_batch(p.step_in_epoch)
        try:
            stats = self.learner.step(batch, global_step=p.global_step)
        finally:
            undo_fault()
        p.step_in_epoch += 1
        p.global_step += 1
        p.samples_seen += len(batch)
        p.compute_time_s += stats.compute_s
        p.comm_time_s += stats.comm_s
        p.sent_bytes += stats.sent_bytes
        p.skipped_steps += int(stats.skipped)
        self.meter.add(stats)
        shares = self.shares
        if shares is not None and shares.observe(stats.samples, stats.work_s):
            self._log_shares(shares)
        if p.global_step % self.ctx.config.monitor.log_every_steps == 0:
            self.flush()
        else:
            self.run.reporter.update(p.global_step, p.epoch)

    def _log_shares(self, shares: BatchShares) -> None:
        """A new split of the global batch: one line in the log, one record in metrics.jsonl."""
        batch, step = self.train.batch_size, self.progress.global_step
        counts = split_counts(batch, shares.fractions)
        self.ctx.log.info("step %d: %s", step, shares.describe(batch))
        record = {"event": "balance", "step": step, "shares": counts, "speeds": shares.speeds}
        self.run.metrics.write(record)

    def next_epoch(self) -> None:
        self.progress.epoch += 1
        self.progress.step_in_epoch = 0

    def agree_stop(self) -> int:
        """The stop signal every rank agreed on (0: go on). The gradient sync's per-step
        all-reduce carries the agreement; a sync without one (the parameter server's
        workers train asynchronously) is asked every `log_every_steps`, alike on every rank."""
        agreed = STOP.take_agreed()
        if agreed is not None:
            return agreed
        if not self.ctx.distributed or self.ctx.world_size == 1:
            return STOP.signum
        every = self.ctx.config.monitor.log_every_steps
        return STOP.agree(self.ctx) if self.progress.global_step % every == 0 else 0

    def flush(self) -> None:
        """Log the interval's figures (collective), if any step was taken since the last."""
        if not self.meter.steps:
            return
        metrics = self.meter.reduce(self.ctx)
        self.meter = IntervalMeter()
        metrics.update(self.learner.sync.interval_metrics())
        p = self.progress
        metrics["lr"] = self.learner.lr
        figures = {
            k.removeprefix("train_"): v
            for k, v in metrics.items()
            if k == "loss" or k.startswith("train_")
        }
        self.run.logged_train(figures, p.global_step)
        epoch = p.last_step_epoch  # the interval's epoch, also after the last one has ended
        self.run.metrics.write({"event": "train", "step": p.global_step, "epoch": epoch, **metrics})
        self.run.reporter.update(p.global_step, epoch, metrics)

    # ---------------------------------------------------------------- results
    def section(self) -> dict[str, Any]:
        p = self.progress
        section = {
            "epochs": p.epoch,
            "samples": p.samples_seen,
            "samples_per_s": p.samples_seen / p.train_time_s if p.train_time_s else 0.0,
            "time_s": {"compute": p.compute_time_s, "communication": p.comm_time_s},
            "gradient_bytes_per_step": self.learner.sync.bytes_per_step(),
            "sent_bytes_per_step": p.sent_bytes / p.global_step if p.global_step else 0.0,
            "skipped_steps": p.skipped_steps,
        }
        return section


def _local_bytes(param: torch.Tensor) -> int:
    """Bytes of `param` this rank holds (a DTensor: its local shard; on meta: none)."""
    local = param.to_local() if hasattr(param, "to_local") else param
    return 0 if local.is_meta else local.numel() * local.element_size()
