"""`pipeline`: the model's blocks cut into stages, one rank each, micro-batches through them.

The job is the step loop under the one driver (`training/steps.py`), with the
pipeline's collaborators: the learner is a :class:`StageLearner` (this rank's
stages under torch's schedule), the model of record the full model brought up
to date from the stages (:class:`PipelineRecord`), and results.json gets a
`pipeline` section (partition, measured shares, bubble, per-rank time and memory).

The partition is the config's, or the balanced one: every rank times each
block on the first `balance_batches` training batches (`profile.py`), the ranks
average their measurements (every rank then holds the same numbers) and the
exact linear partition of them is taken (`partition.py`), logged with each
stage's measured share.

With `rebalance = "checkpoint"` the partition follows the ranks' measured speed:
before each periodic checkpoint the ranks weigh it (`rebalance.py`) and, when
another one would make the slowest stage enough faster, the stages are rebuilt
at it, the parameters and optimizer state moved to their new owners exactly as a
checkpoint in `local`'s layout moves them (`StageLearner.repartition`); a
`partition` record in metrics.jsonl says what was measured and decided. The
partition is part of the checkpoint: a resume goes on at it.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from torch import nn

from shoal.config.base import FieldError
from shoal.errors import ShoalError
from shoal.protocols.capabilities import PIPELINE_STAGES, PipelineStages
from shoal.protocols.task import Task
from shoal.runtime.collectives import gather_bytes
from shoal.strategies.base import Strategy
from shoal.strategies.pipeline.config import (
    PipelineFields,
    PipelineStrategyConfig,
    check_partitions,
    split_partitions,
)
from shoal.strategies.pipeline.learner import PipelineRecord, PipelineSync, StageLearner
from shoal.strategies.pipeline.partition import (
    Partition,
    balanced_partition,
    describe_partition,
    stage_costs,
)
from shoal.strategies.pipeline.profile import BlockCosts, profile_blocks
from shoal.strategies.pipeline.rebalance import Decision, Rebalancer
from shoal.strategies.pipeline.rebalance import shares as stage_shares
from shoal.strategies.pipeline.stages import (
    PipelinePlace,
    build_schedule,
    build_stages,
)
from shoal.training.batching import EpochPlan
from shoal.training.contracts import GradientSync
from shoal.training.learner import Learner
from shoal.training.loop import ModelOfRecord, Run
from shoal.training.precision import Precision
from shoal.training.steps import StepLoop


class PipelineStrategy(Strategy[PipelineFields]):
    """Pipeline parallelism over every rank (one pipeline, world = stages)."""

    config_class: ClassVar[type[PipelineStrategyConfig]] = PipelineStrategyConfig

    #: this rank's learner (a hybrid mesh's stages save through DCP)
    learner_class: ClassVar[type[StageLearner]] = StageLearner

    task: Task
    stages: PipelineStages
    place: PipelinePlace
    sync: PipelineSync
    learner: StageLearner
    partition: Partition
    shares: list[float] | None = None
    costs: BlockCosts | None = None
    rebalancer: Rebalancer | None = None
    #: a checkpoint's partition, to go on at once it has loaded (rebalance only)
    saved_partition: Partition | None = None

    def run(self, task: Task) -> dict[str, Any]:
        self.task = task
        self.stages = PIPELINE_STAGES.of(task, "pipeline")
        return self.drive(task, lambda run: PipelineLoop(run, self))

    # ------------------------------------------------------------ building
    def attach(self, model: nn.Module) -> GradientSync:
        """Cut `model` (the full model, the same on every rank) into this rank's stages."""
        self._check_batches()
        names = self.stages.pipeline_block_names(model)
        self.partition = self._partition(model, len(names), names)
        self.place = self._place(model)
        self.sync = self._sync(model)
        return self.sync

    def _place(self, model: nn.Module) -> PipelinePlace:
        """This rank's stages: one pipeline over the world, sharing the full model's modules."""
        ctx = self.ctx
        return build_stages(
            self.cut(model), self.partition, None, ctx.rank, ctx.world_size, ctx.device
        )

    def cut(self, model: nn.Module) -> Any:
        """`(first, last) -> stage` of `model`, as the task cuts it."""
        return lambda first, last: self.stages.pipeline_stage(model, first, last)

    def _sync(self, model: nn.Module) -> PipelineSync:
        named = {id(p): n for n, p in model.named_parameters()}
        local = [(named[id(p)], p) for m in self.place.modules for p in m.parameters()]
        return PipelineSync(self.ctx, local, self.place)

    def make_learner(self, model: nn.Module, sync: GradientSync, total_steps: int) -> Learner:
        config = self.config

        def schedule(loss_fn: Any) -> Any:
            return build_schedule(config.schedule, self.place, config.microbatches, loss_fn)

        self.learner = self.learner_class(
            self.task,
            model,
            self.place,
            self.sync,
            self.ctx.config.train,
            total_steps,
            schedule,
            config.microbatches,
            norm_every=self.ctx.config.monitor.log_every_steps,
            **self._learner_options(),
        )
        return self.learner

    def _learner_options(self) -> dict[str, Any]:
        """More keyword arguments of `learner_class` (a mesh's data share and groups)."""
        return {}

    def _check_batches(self) -> None:
        """Every step's batch must cut into equal micro-batches (the stages' message shapes
        are fixed at the first step)."""
        train, size = self.ctx.config.train, self.task.train_size
        short = size % train.batch_size
        if short and not train.drop_last and size > train.batch_size:
            raise ShoalError(
                f"train.drop_last: the last batch of each epoch has {short} of the "
                f"{size} samples, not train.batch_size ({train.batch_size}), and a pipeline's "
                "micro-batches keep one shape; set train.drop_last = true"
            )
        if size < train.batch_size:
            raise ShoalError(
                f"train.batch_size ({train.batch_size}) exceeds the {size} training samples; "
                "a pipeline needs whole batches: lower it"
            )

    def _partition(self, model: nn.Module, blocks: int, names: list[str]) -> Partition:
        config, ctx = self.config, self.ctx
        total = config.total_stages
        if total > blocks:
            raise ShoalError(
                f"strategy.stages: {total} stages need at least as many blocks; the model has "
                f"{blocks}: use fewer stages"
            )
        rebalance = config.rebalance != "off"
        given = config.partitions
        if config.split_points is not None:
            try:
                given = split_partitions(config.split_points, names, total)
            except FieldError as error:
                raise ShoalError(f"strategy.split_points: {error}") from None
        if given is not None:
            try:
                check_partitions(given, total, blocks)
            except FieldError as error:
                raise ShoalError(f"strategy.partitions: {error}") from None
            partition = [(int(a), int(b)) for a, b in given]
            if ctx.is_main:
                ctx.log.info("pipeline partition (given): %s", describe_partition(partition))
            if rebalance:  # the blocks' costs, to weigh other partitions against it
                self.costs = self._measure(model, blocks)
                self._rebalancer(self.costs)
            return partition
        self.costs = self._measure(model, blocks)
        costs = self.costs.costs(config.balance)
        partition = balanced_partition(costs, total)
        whole = sum(costs) or 1.0
        self.shares = [c / whole for c in stage_costs(costs, partition)]
        if rebalance:
            self._rebalancer(self.costs)
        if ctx.is_main:
            ctx.log.info(
                "pipeline partition balanced by measured %s over %d batches: %s; per block: "
                "%s ms forward + backward, %s MiB",
                config.balance,
                config.balance_batches,
                describe_partition(partition, self.shares),
                ", ".join(f"{1e3 * s:.2f}" for s in self.costs.seconds),
                ", ".join(f"{m / 2**20:.2f}" for m in self.costs.memory_bytes),
            )
        return partition

    def _rebalancer(self, costs: BlockCosts) -> None:
        config = self.config
        ranks = config.pipeline_ranks
        self.rebalancer = Rebalancer(self.ctx, costs.seconds, ranks, config.rebalance_threshold)

    # ------------------------------------------------------------ re-balancing
    def rebalance(self, run: Run) -> None:
        """Collective: weigh the partition on the speeds measured since the last checkpoint;
        move to the best one if it gains more than the threshold; record the decision."""
        rebalancer = self.rebalancer
        if rebalancer is None:
            return
        compute_s, steps = self.sync.take_work()
        rebalancer.measure(self.partition, compute_s, steps)
        decision = rebalancer.decide(self.partition)
        if decision is None:
            return
        if decision.moves:
            self._repartition(decision.new)
            rebalancer.moves += 1
            self.shares = stage_shares(decision.new_times)
        self._record(run, decision)

    def _record(self, run: Run, decision: Decision) -> None:
        """A `partition` record in metrics.jsonl and a line in rank 0's log: the partition
        measured, each stage's share and seconds, the best one, the speeds behind them."""
        rebalancer = self.rebalancer
        assert rebalancer is not None
        step, speeds = run.progress.global_step, rebalancer.speeds
        record = {
            "event": "partition",
            "step": step,
            "moved": decision.moves,
            "partition": [list(p) for p in decision.old],
            "shares": stage_shares(decision.old_times),
            "stage_seconds": decision.old_times,
            "best": [list(p) for p in decision.new],
            "best_shares": stage_shares(decision.new_times),
            "best_stage_seconds": decision.new_times,
            "gain": decision.gain,
            "rank_speeds": speeds,
            "block_seconds": rebalancer.block_seconds(decision.old),
        }
        old = describe_partition(decision.old, stage_shares(decision.old_times))
        new = describe_partition(decision.new, stage_shares(decision.new_times))
        rates = ", ".join(f"{s:.2f}" for s in speeds or [])
        if decision.moves and self.ctx.is_main:
            self.ctx.log.info(
                "step %d: pipeline re-partitioned from %s to %s: the slowest stage's time "
                "%.0f%% lower (rank speeds, measured / profiled time: %s)",
                step,
                old,
                new,
                100 * decision.gain,
                rates,
            )
        elif self.ctx.is_main:
            self.ctx.log.info(
                "step %d: pipeline partition kept (%s; the best would gain %.0f%%, threshold "
                "%.0f%%; rank speeds %s)",
                step,
                old,
                100 * decision.gain,
                100 * rebalancer.threshold,
                rates,
            )
        run.metrics.write(record)

    def _repartition(self, partition: Partition) -> None:
        """Collective: rebuild this rank's stages at `partition`, moving parameters and
        optimizer state to their new owners."""
        model = self.learner.full
        self.partition = partition
        old = self.sync
        self.place = self._place(model)
        self.sync = self._sync(model)
        self.sync.take_over(old)
        self.learner.repartition(self.place, self.sync)

    def state_dict(self) -> dict[str, Any]:
        """The partition (and the re-balance's speeds): a resume goes on at it."""
        state: dict[str, Any] = {"pipeline_partition": [list(p) for p in self.partition]}
        if self.rebalancer is not None:
            state["rebalance"] = self.rebalancer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """With rebalance on, the checkpoint's partition (moved to after the parts have
        loaded); off, the config's partition stands, as it always did."""
        saved = state.get("pipeline_partition") if isinstance(state, dict) else None
        if self.rebalancer is None or saved is None:
            return
        self.rebalancer.load_state_dict(state.get("rebalance") or {})
        try:
            check_partitions(saved, len(self.partition), len(self.rebalancer.costs))
        except FieldError as error:
            self.ctx.log.info("the checkpoint's partition does not fit this job (%s): kept", error)
            return
        self.saved_partition = [(int(a), int(b)) for a, b in saved]

    def after_restore(self) -> None:
        saved, self.saved_partition = self.saved_partition, None
        if saved is None or saved == self.partition:
            return
        self._repartition(saved)
        if self.ctx.is_main:
            self.ctx.log.info(
                "pipeline partition of the checkpoint (re-balanced): %s",
                describe_partition(saved),
            )

    def _measure(self, model: nn.Module, blocks: int) -> BlockCosts:
        """Every rank times the blocks; the mean over ranks is what every rank uses."""
        ctx, task, train = self.ctx, self.task, self.ctx.config.train
        plan = EpochPlan(
            task.train_size, train.batch_size, 0, train.seed, train.shuffle, train.drop_last
        )
        task.set_epoch(0)
        count = min(self.config.balance_batches, plan.num_steps)
        stages = self.stages
        batches = [
            stages.pipeline_batch(task.train_batch(plan.global_batch(i))) for i in range(count)
        ]

        def loss(output: Any, targets: Any) -> Any:
            return stages.pipeline_loss(output, targets).loss_sum / train.batch_size

        precision = Precision(train.mixed_precision, ctx.device)
        mine = profile_blocks(
            model, self.cut(model), blocks, batches, loss, _state_factor(train), precision.autocast
        )
        ranks = [json.loads(b) for b in gather_bytes(ctx, json.dumps(mine.__dict__).encode())]
        return BlockCosts(
            [sum(r["seconds"][i] for r in ranks) / len(ranks) for i in range(blocks)],
            mine.state_bytes,
            [max(r["activation_bytes"][i] for r in ranks) for i in range(blocks)],
        )

    # ------------------------------------------------------------ results
    def section(self) -> dict[str, Any]:
        config = self.config
        section: dict[str, Any] = {
            "schedule": config.schedule,
            "microbatches": config.microbatches,
            "virtual_stages": config.local_stages,
            "partition": [list(p) for p in self.partition],
            "balanced_by": None if config.given() else config.balance,
        }
        if self.shares is not None and self.costs is not None:
            section["shares"] = self.shares
            section["block_seconds"] = self.costs.seconds
            section["block_memory_bytes"] = self.costs.memory_bytes
        if self.rebalancer is not None:
            section["rebalance"] = {
                "moves": self.rebalancer.moves,
                "rank_speeds": self.rebalancer.speeds,
                "threshold": self.rebalancer.threshold,
            }
        section.update(self.sync.summary())
        return {"pipeline": section}

    def describe(self) -> str:
        config = self.config
        local = f", {config.local_stages} stages a rank" if config.local_stages > 1 else ""
        return (
            f"pipeline x{self.ctx.world_size} ({config.schedule}, {config.microbatches} "
            f"micro-batches{local})"
        )


def _state_factor(train: Any) -> float:
    """Bytes of parameter + gradient + optimizer state per parameter byte."""
    kind = train.optimizer.kind
    slots = 2 if kind in ("adam", "adamw") else 1 if kind == "adagrad" else 0
    if kind == "sgd" and getattr(train.optimizer, "momentum", 0):
        slots = 1
    return 2.0 + slots


class PipelineLoop(StepLoop):
    """The step loop with a pipeline's learner (stages under a schedule), its full model as
    the model of record, its re-balance before checkpoints and its results section."""

    strategy: PipelineStrategy

    def make_learner(self, model: nn.Module, sync: GradientSync) -> Learner:
        return self.strategy.make_learner(model, sync, self.total_steps)

    def make_record(self) -> ModelOfRecord:
        return PipelineRecord(self.ctx, self.strategy.learner)

    def before_checkpoint(self) -> None:
        self.strategy.rebalance(self.run)

    def after_restore(self) -> None:
        self.strategy.after_restore()

    def section(self) -> dict[str, Any]:
        return {**super().section(), **self.strategy.section()}
