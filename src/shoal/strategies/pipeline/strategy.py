"""`pipeline`: the model's blocks cut into stages, one rank each, micro-batches through them.

The job is the step loop under the one driver (`training/steps.py`), with the
pipeline's collaborators: the learner is a :class:`StageLearner` (this rank's
stages under torch's schedule), the model of record the stages run in turn
across the ranks (`record.py`: evaluation, the best model), and results.json gets
a `pipeline` section (partition, measured shares, bubble, per-rank time and memory).

A rank holds only its stages. A task that builds its model on the meta device
(`training/materialise.py`) has it built there, and this rank gives values to its
stages alone, the values `local` builds for the seed; any other model is built
whole, cut, and the other ranks' parts dropped to the meta device. The model's
names and structure stay whole on every rank (no storage where another rank holds
the values), so the stages, checkpoints (DCP, by name) and a re-partition all speak
of the full model's parameters.

The partition is the config's, or the balanced one: every rank times each
block on the first `balance_batches` training batches (`profile.py`), the ranks
average their measurements (every rank then holds the same numbers) and the
exact linear partition of them is taken (`partition.py`), logged with each
stage's measured share.

With `rebalance = "checkpoint"` the partition follows the ranks' measured speed:
before each periodic checkpoint the ranks weigh it (`rebalance.py`) and, when
another one would make the slowest stage enough faster, the stages are rebuilt
at it, the blocks that change owner handed over with their optimizer state (and
best copy), the others staying where they are (`_repartition`); a
`partition` record in metrics.jsonl says what was measured and decided. The
partition is part of the checkpoint: a resume goes on at it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar

import torch
from torch import nn

from shoal.config.base import FieldError
from shoal.errors import ShoalError
from shoal.protocols.capabilities import PIPELINE_STAGES, PipelineStages
from shoal.protocols.task import Task
from shoal.runtime.collectives import gather_bytes, share_tensors
from shoal.strategies.base import Strategy
from shoal.strategies.pipeline.config import (
    PipelineFields,
    PipelineStrategyConfig,
    check_partitions,
    split_partitions,
)
from shoal.strategies.pipeline.learner import OPTIMIZER_KEY, PipelineSync, StageLearner
from shoal.strategies.pipeline.partition import (
    Partition,
    balanced_partition,
    describe_partition,
    stage_costs,
)
from shoal.strategies.pipeline.profile import BlockCosts, profile_blocks
from shoal.strategies.pipeline.rebalance import Decision, Rebalancer
from shoal.strategies.pipeline.rebalance import shares as stage_shares
from shoal.strategies.pipeline.record import StagedModel, StagedRecord
from shoal.strategies.pipeline.stages import (
    PipelinePlace,
    build_schedule,
    build_stages,
    join_stages,
)
from shoal.training.batching import EpochPlan
from shoal.training.contracts import GradientSync
from shoal.training.learner import Learner
from shoal.training.loop import ModelOfRecord, Run
from shoal.training.materialise import (
    buffers_to,
    draw_base,
    hold_only,
    materialise,
    meta_builder,
)
from shoal.training.precision import Precision
from shoal.training.steps import StepLoop

BEST_KEY = "\tbest"  # after a tensor's name: its best copy, handed over in a re-partition


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
    #: the model `build_model` laid out (None: a hybrid mesh's, cut in `attach`)
    laid_out: nn.Module | None = None
    record: StagedRecord

    def run(self, task: Task) -> dict[str, Any]:
        self.task = task
        self.stages = PIPELINE_STAGES.of(task, "pipeline")
        return self.drive(self.evaluating(task), lambda run: PipelineLoop(run, self))

    def evaluating(self, task: Task) -> Task:
        """The task the loop evaluates with: a view over this rank alone, so that every rank
        runs every batch through the stages (`record.py`) and the figures need no sum.
        (Training takes whole global batches on every rank: the view changes nothing there.)"""
        solo = replace(self.ctx, rank=0, world_size=1, backend=None, heartbeat=None, group=None)
        return task.on(solo)

    # ------------------------------------------------------------ building
    def build_model(self, whole: Callable[[], nn.Module]) -> nn.Module:
        """The model with values in this rank's stages only; the rest stays on the meta
        device (names and shapes, no storage).

        A task that builds on meta (`training/materialise.py`) gives this rank's stages
        their values, each unit keyed by the seed and its path, so they equal what
        `local` builds; measuring the blocks for a balanced partition holds one block at
        a time. Otherwise (`whole`: the task builds the model whole) the model is built,
        cut, and what other ranks hold is dropped."""
        self._check_batches()
        builder = meta_builder(self.task)
        meta = builder.build_meta_model() if builder is not None else None
        if builder is None or meta is None:
            model = whole()
            self._lay_out(model)
            hold_only(model, {id(p) for p in self.place.model.parameters()})
            return model
        base = draw_base()  # where `local`'s build draws it: the same values
        shadow = copy.deepcopy(meta)  # whole, to initialise a unit at a time in
        weights = builder.weights_for(shadow)
        device = self.ctx.device

        def hold(module: nn.Module) -> None:
            materialise(module, builder, base, device, shadow, weights)

        self._lay_out(meta, hold, lambda module: hold_only(module, ()))
        buffers_to(meta, device)
        return meta

    def _lay_out(
        self,
        model: nn.Module,
        hold: Callable[[nn.Module], None] | None = None,
        drop: Callable[[nn.Module], None] | None = None,
    ) -> None:
        """The partition, this rank's stages (given values by `hold` when the model is on
        meta) and torch's stage objects around them."""
        names = self.stages.pipeline_block_names(model)
        self.partition = self._partition(model, len(names), names, hold, drop)
        stages = self._rank_stages(model, self.partition)
        _refuse_shared(model, stages)
        if hold is not None:
            mine = stages[self.pipeline_rank]
            hold(mine[0] if len(mine) == 1 else join_stages(mine))
        self.place = self._place(model)
        self.laid_out = model

    @property
    def pipeline_rank(self) -> int:
        """This rank's place along the pipeline (a hybrid mesh: its pipeline coordinate)."""
        return self.ctx.rank

    def _rank_stages(self, model: nn.Module, partition: Partition) -> list[list[nn.Module]]:
        """Each rank's stage modules at `partition` (loop placement)."""
        cut, ranks = self.cut(model), self.config.pipeline_ranks
        held: list[list[nn.Module]] = [[] for _ in range(ranks)]
        for index, blocks in enumerate(partition):
            held[index % ranks].append(cut(*blocks))
        return held

    def attach(self, model: nn.Module) -> GradientSync:
        """This rank's stages of `model` (laid out by `build_model`; a hybrid mesh's whole
        model is cut here) and their gradient sync."""
        if self.laid_out is not model:
            self._check_batches()
            names = self.stages.pipeline_block_names(model)
            self.partition = self._partition(model, len(names), names)
            self.place = self._place(model)
        self.sync = self._sync(model)
        return self.sync

    def _place(self, model: nn.Module) -> PipelinePlace:
        """This rank's stages: one pipeline over the world, sharing the model's modules."""
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

    def make_record(self) -> ModelOfRecord:
        """This rank's stages, evaluated through the pipeline (`record.py`)."""
        self.record = StagedRecord(self.ctx, self.place.model, self._staged_forward())
        return self.record

    def _staged_forward(self) -> StagedModel:
        """The forward through every rank's stages, this rank's cut afresh (full precision:
        the training stages' forwards run under the learner's autocast)."""
        whole = self.learner.full
        cut = self.cut(whole)
        mine = {i: cut(*self.partition[i]) for i in self.place.indices}
        return StagedModel(self.ctx, whole, mine, self.place.total, self._along_pipeline())

    def _along_pipeline(self) -> tuple[list[int], Any, int]:
        """(the global rank at each pipeline position, their process group, this rank's
        position): whom the staged forward hands activations along."""
        return list(range(self.config.pipeline_ranks)), self.ctx.group, self.ctx.rank

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
        are fixed at the first step): a short last batch is dropped (the step loop, through
        the section's `smallest_step_batch`), a batch larger than the data refused."""
        train, size = self.ctx.config.train, self.task.train_size
        if size < train.batch_size:
            raise ShoalError(
                f"train.batch_size ({train.batch_size}) exceeds the {size} training samples; "
                "a pipeline needs whole batches: lower it"
            )

    def _partition(
        self,
        model: nn.Module,
        blocks: int,
        names: list[str],
        hold: Callable[[nn.Module], None] | None = None,
        drop: Callable[[nn.Module], None] | None = None,
    ) -> Partition:
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
                self.costs = self._measure(model, blocks, hold, drop)
                self._rebalancer(self.costs)
            return partition
        self.costs = self._measure(model, blocks, hold, drop)
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
        """Collective: rebuild this rank's stages at `partition`. The blocks that change
        owner travel with their optimizer state and best copy: each rank hands over what
        it gives up, keeps of what the others hand over what it takes, and drops the rest
        (to the meta device); what stays put does not move."""
        learner, model = self.learner, self.learner.full
        record = self.record
        named = {id(p): n for n, p in model.named_parameters()}
        new = self._rank_stages(model, partition)[self.pipeline_rank]
        wanted = {named[id(p)] for m in new for p in m.parameters()}
        held = set(learner.local_names)
        giving = learner.moving_state(held - wanted)
        best_keys = set(join_stages(new).state_dict()) if len(new) > 1 else set(new[0].state_dict())
        for key, value in (record.best or {}).items():
            if key not in best_keys:
                giving[f"{key}{BEST_KEY}"] = value
        handed = share_tensors(self.ctx, giving, keep_all=True)
        moved: dict[str, dict[str, torch.Tensor]] = {}
        device = self.ctx.device
        for joined, value in handed.items():
            if joined.endswith(BEST_KEY):
                key = joined.removesuffix(BEST_KEY)
                if record.best is not None and key in best_keys:
                    record.best[key] = value
                continue
            name, key = joined.split(OPTIMIZER_KEY)
            if name not in wanted or name in held:
                continue
            if key:
                moved.setdefault(name, {})[key] = value
            else:
                _set_parameter(model, name, value.to(device))
        del handed, giving
        hold_only(model, {id(p) for m in new for p in m.parameters()})
        self.partition = partition
        old = self.sync
        self.place = self._place(model)
        self.sync = self._sync(model)
        self.sync.take_over(old)
        learner.repartition(self.place, self.sync, moved)
        record.seat(self.place.model, self._staged_forward())

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

    def _measure(
        self,
        model: nn.Module,
        blocks: int,
        hold: Callable[[nn.Module], None] | None = None,
        drop: Callable[[nn.Module], None] | None = None,
    ) -> BlockCosts:
        """Every rank times the blocks; the mean over ranks is what every rank uses."""
        ctx, task, train = self.ctx, self.task, self.ctx.config.train
        plan = EpochPlan(task.train_size, train.batch_size, 0, train.seed, train.shuffle, True)
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
            model,
            self.cut(model),
            blocks,
            batches,
            loss,
            _state_factor(train),
            precision.autocast,
            hold,
            drop,
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


def _refuse_shared(model: nn.Module, stages: list[list[nn.Module]]) -> None:
    """One line when two ranks would hold one parameter (tied weights: the embedding of
    the first stage and the head of the last), which each would train apart."""
    owner: dict[int, int] = {}
    for rank, modules in enumerate(stages):
        for param in (p for module in modules for p in module.parameters()):
            if owner.setdefault(id(param), rank) == rank:
                continue
            aliases = [n for n, p in model.named_parameters(remove_duplicate=False) if p is param]
            raise ShoalError(
                f"strategy pipeline: the model's parameter {' = '.join(aliases)} is tied "
                f"across stages (ranks {owner[id(param)]} and {rank} would train it apart); "
                "untie it (e.g. tie_word_embeddings = false) or train the model with "
                "fully_sharded"
            )


def _set_parameter(model: nn.Module, name: str, value: torch.Tensor) -> None:
    """`model`'s parameter `name` (on meta, not held here) given `value`."""
    path, _, leaf = name.rpartition(".")
    module = model.get_submodule(path) if path else model
    old = module._parameters[leaf]
    assert old is not None
    module._parameters[leaf] = nn.Parameter(value, requires_grad=old.requires_grad)


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

    def build_model(self) -> nn.Module:
        return self.strategy.build_model(super().build_model)

    def make_record(self) -> ModelOfRecord:
        return self.strategy.make_record()

    def before_checkpoint(self) -> None:
        self.strategy.rebalance(self.run)

    def after_restore(self) -> None:
        self.strategy.after_restore()

    def section(self) -> dict[str, Any]:
        return {**super().section(), **self.strategy.section()}
