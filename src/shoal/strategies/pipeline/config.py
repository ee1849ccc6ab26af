"""`[strategy] type = "pipeline"`: stages, the partition (given or balanced), the schedule.

The rules that span sections (the blocks the task's model has, the batch the
micro-batches divide) are the section's `check`, run once every section is
valid, so each error names the field to change.
"""

from __future__ import annotations

import difflib
from abc import abstractmethod
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from shoal.config.base import RESUME_SAFE, FieldError, StrategySection, task_section
from shoal.protocols.capabilities import PIPELINE_STAGES
from shoal.shape.hosts import Hosts
from shoal.shape.job import stage_label
from shoal.shape.roles import RankRoles

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


class PipelineFields(StrategySection):
    """What a pipeline dimension takes: the pipeline strategy's, and a hybrid mesh's with a
    `pipeline` dimension. Each says how many ranks the pipeline has (`pipeline_ranks`)
    and where that is set (`stages_field`)."""

    partitions: list[list[int]] | None = Field(
        None,
        description="The blocks of each stage, [first, last] inclusive, in stage order, e.g. "
        "[[0, 3], [4, 7]]: contiguous, covering every block once (stages x virtual_stages "
        "entries). Unset: shoal times each block's forward and backward on real batches and "
        "picks the contiguous split whose costliest stage is cheapest.",
        json_schema_extra=RESUME_SAFE,
    )
    split_points: list[str] | None = Field(
        None,
        description='Where stages begin, by the path of a block, e.g. ["model.layers.4"] '
        "(stages - 1 of them, in order; the first stage begins at the first block). Instead "
        "of partitions; unset with partitions unset: balanced by measurement.",
        json_schema_extra=RESUME_SAFE,
    )
    balance: Literal["time", "memory", "both"] = Field(
        "time",
        description="Without `partitions`: what the computed split balances. time = measured "
        "forward + backward seconds per block; memory = parameters, gradients, optimizer "
        "state and saved activations per block; both = the sum of each block's two shares.",
        json_schema_extra=RESUME_SAFE,
    )
    balance_batches: int = Field(
        3,
        ge=1,
        description="Batches timed per block to balance the partition (median).",
        json_schema_extra=RESUME_SAFE,
    )
    microbatches: int = Field(
        4,
        ge=1,
        description="Micro-batches each batch is cut into; they must divide train.batch_size.",
        json_schema_extra=RESUME_SAFE,
    )
    schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = Field(
        "1f1b",
        description="gpipe = all forwards, then all backwards; 1f1b = one forward, one "
        "backward in the steady state (fewer activations held); interleaved_1f1b = 1F1B over "
        "`virtual_stages` stages per rank (a smaller bubble, more messages).",
        json_schema_extra=RESUME_SAFE,
    )
    virtual_stages: int | None = Field(
        None,
        ge=1,
        description="Stages per rank for schedule = interleaved_1f1b (default 2; at least 2); "
        "rank r holds stages r, r + stages, ... Only 1 for the other schedules.",
        json_schema_extra=RESUME_SAFE,
    )

    rebalance: Literal["off", "checkpoint"] = Field(
        "off",
        description="checkpoint = at each periodic checkpoint, re-partition the blocks when "
        "the best partition for the per-block times measured in training (the profile's "
        "block costs times each rank's measured speed) would cut the slowest stage's time "
        "by more than rebalance_threshold; parameters and optimizer state move to their new "
        "stages, the partition is checkpointed. With `partitions` given, training starts "
        "from them (the blocks are still profiled, to compare them). off = the partition "
        "stays.",
        json_schema_extra=RESUME_SAFE,
    )
    rebalance_threshold: float = Field(
        0.1,
        gt=0,
        lt=1,
        description="rebalance = checkpoint: re-partition when the slowest stage's time would "
        "fall by more than this fraction of it.",
        json_schema_extra=RESUME_SAFE,
    )

    @model_validator(mode="after")
    def _rebalance(self) -> PipelineFields:
        if self.rebalance != "off" and self.balance != "time":
            raise FieldError(
                ("rebalance",),
                f"rebalance re-partitions by measured time, balance = {self.balance} by "
                'memory; set balance = "time", or rebalance = "off"',
            )
        return self

    @model_validator(mode="after")
    def _virtual(self) -> PipelineFields:
        if self.schedule == "interleaved_1f1b":
            if self.virtual_stages is None:
                self.virtual_stages = 2
            elif self.virtual_stages < 2:
                raise FieldError(
                    ("virtual_stages",),
                    "schedule interleaved_1f1b interleaves at least 2 stages per rank; set "
                    'virtual_stages >= 2, or schedule = "1f1b" for one stage per rank',
                )
        elif self.virtual_stages not in (None, 1):
            raise FieldError(
                ("virtual_stages",),
                f"schedule {self.schedule} runs one stage per rank; unset virtual_stages, or "
                'set schedule = "interleaved_1f1b"',
            )
        return self

    def given(self) -> bool:
        """Whether the partition is the config's (partitions or split points)."""
        return self.partitions is not None or self.split_points is not None

    @property
    def local_stages(self) -> int:
        """Stages each rank holds."""
        return self.virtual_stages or 1

    @property
    @abstractmethod
    def pipeline_ranks(self) -> int:
        """Ranks along the pipeline (its stages, without virtual ones): each config says."""

    @property
    @abstractmethod
    def stages_field(self) -> tuple[str, ...]:
        """The field that sets `pipeline_ranks` (for error messages): each config says."""

    @property
    def total_stages(self) -> int:
        return self.pipeline_ranks * self.local_stages

    def check_pipeline(self, config: Any, data: int = 1) -> None:
        """A task whose model cuts into stages; blocks enough for the stages; a partition
        that covers them; micro-batches that divide each of the `data` replicas' share of
        the batch; the task's own rules for a pipeline."""
        self.require(PIPELINE_STAGES, config)
        train = config.train
        names = block_names(config)
        blocks = None if names is None else len(names)
        total = self.total_stages
        counted = (
            f"{total} stages"
            if self.local_stages == 1
            else (
                f"{total} stages ({self.pipeline_ranks} ranks x {self.local_stages} virtual stages)"
            )
        )
        if blocks is not None and total > blocks:
            raise FieldError(
                self.stages_field,
                f"{counted} need at least as many blocks; the model has {blocks} "
                "(task.model.layers): use fewer stages or more layers",
            )
        if self.partitions is not None and self.split_points is not None:
            raise FieldError(
                ("strategy", "split_points"), "give split_points or partitions, not both"
            )
        if self.partitions is not None:
            check_partitions(self.partitions, total, blocks, counted)
        if self.split_points is not None and names is not None:
            split_partitions(self.split_points, names, total)
        if train.micro_batches != 1:
            raise FieldError(
                ("train", "micro_batches"),
                "strategy pipeline cuts each batch into strategy.microbatches itself; set "
                "train.micro_batches = 1",
            )
        if train.batch_size % (self.microbatches * data):
            share = "" if data == 1 else f" x {data} data replicas"
            raise FieldError(
                ("strategy", "microbatches"),
                f"{self.microbatches} micro-batches{share} do not divide train.batch_size "
                f"({train.batch_size}): choose a divisor of it",
            )
        if self.schedule == "interleaved_1f1b":
            ranks = self.pipeline_ranks
            rounds = max(1, self.microbatches // ranks)
            if self.microbatches % rounds:
                raise FieldError(
                    ("strategy", "microbatches"),
                    f"interleaved_1f1b runs micro-batches in rounds of {ranks} (the "
                    f"ranks): {self.microbatches} is not a multiple of {rounds} rounds; use a "
                    f"multiple of {ranks}",
                )
        checkpoint = config.checkpoint
        if self.rebalance != "off" and not (checkpoint.every_steps or checkpoint.every_epochs):
            raise FieldError(
                ("strategy", "rebalance"),
                "rebalance = checkpoint re-partitions at periodic checkpoints and none is "
                'written; set checkpoint.every_steps (or every_epochs), or rebalance = "off"',
            )


class PipelineStrategyConfig(PipelineFields):
    """The model's blocks cut into contiguous stages, one rank each; micro-batches flow
    through them under a GPipe, 1F1B or interleaved 1F1B schedule (torch.distributed.pipelining)."""

    type: Literal["pipeline"] = "pipeline"
    workers_field: ClassVar[str | None] = "stages"
    #: its checkpoints hold the whole model and one optimizer state, as these do
    resumes_from: ClassVar[tuple[str, ...]] = ("local", "data_parallel")

    stages: int = Field(
        2,
        ge=2,
        description="Pipeline ranks (worker processes `shoal train` starts; `--workers` sets "
        "it). With schedule = interleaved_1f1b each rank holds `virtual_stages` stages.",
        json_schema_extra=RESUME_SAFE,
    )

    @property
    def pipeline_ranks(self) -> int:
        return self.stages

    @property
    def stages_field(self) -> tuple[str, ...]:
        return ("strategy", "stages")

    def roles(self, hosts: Hosts | None) -> RankRoles:
        """One pipeline over the world, stage r on rank r (a 1-D mesh keeps rank order, see
        shape/placement.py); the log says which hosts it spans."""
        return RankRoles.mesh(self.stages, {"pipeline": self.stages}, hosts)

    def rank_labels(self, roles: RankRoles) -> tuple[str, ...]:
        return tuple(
            stage_label(rank, self.stages, self.local_stages) for rank in range(self.stages)
        )

    def check(self, config: Any) -> None:
        """The loop's length, then the pipeline's rules and the task's for a pipeline."""
        super().check(config)
        self.check_pipeline(config)
        fields = {"pipeline": self.stages_field}
        self.check_task_layout(config, {"pipeline": self.total_stages}, fields)


def block_names(config: Any) -> list[str] | None:
    """The paths of the task's model's blocks when its config says (an lm's `layers`, a
    user's model built on the meta device), else None (then the model is asked when it is
    built)."""
    names = getattr(task_section(config), "pipeline_block_names", None)
    found = names() if callable(names) else None
    return list(found) if found is not None else None


def split_partitions(points: list[str], names: list[str], total: int) -> list[list[int]]:
    """The partition whose stages begin at `points` (block paths). Raises FieldError at
    strategy.split_points."""

    def wrong(message: str) -> FieldError:
        return FieldError(("strategy", "split_points"), message)

    if len(points) != total - 1:
        raise wrong(f"{len(points)} split points for {total} stages: give {total - 1}")
    starts = [0]
    for point in points:
        if point not in names:
            near = difflib.get_close_matches(point, names, n=3, cutoff=0.3)
            raise wrong(
                f"{point!r} is not a block of the model; its blocks are {names[0]} .. "
                f"{names[-1]}" + (f" (nearest: {', '.join(near)})" if near else "")
            )
        index = names.index(point)
        if index <= starts[-1]:
            raise wrong(f"{point!r} does not come after the stage before it: list them in order")
        starts.append(index)
    ends = [start - 1 for start in starts[1:]] + [len(names) - 1]
    return [[start, end] for start, end in zip(starts, ends, strict=True)]


def check_partitions(
    partitions: list[list[int]], total: int, blocks: int | None, counted: str = ""
) -> None:
    """A given partition: `total` [first, last] pairs, contiguous from block 0, covering
    every block once. Raises FieldError at strategy.partitions."""

    def wrong(message: str) -> FieldError:
        return FieldError(("strategy", "partitions"), message)

    if len(partitions) != total:
        raise wrong(
            f"{len(partitions)} partitions for {counted or f'{total} stages'}: give one "
            "[first, last] block range per stage"
        )
    expected = 0
    for index, part in enumerate(partitions):
        if len(part) != 2 or part[0] > part[1]:
            raise wrong(f"stage {index}: {part} is not a block range [first, last], first <= last")
        if part[0] != expected:
            what = "overlaps the stage before" if part[0] < expected else "leaves a gap before it"
            raise wrong(
                f"stage {index} starts at block {part[0]} and {what} (expected block "
                f"{expected}): the stages must cover the blocks in order, each once"
            )
        expected = part[1] + 1
    if blocks is not None and expected != blocks:
        raise wrong(
            f"the stages cover blocks 0..{expected - 1}, the model has {blocks} "
            f"(0..{blocks - 1}): every block must belong to one stage"
        )
