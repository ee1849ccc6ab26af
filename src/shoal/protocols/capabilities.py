"""What a task can offer beyond the base contract, asked for by the strategies that need it.

After torchtitan's `ModelSpec` (a model brings its `parallelize_fn`, its
`pipelining_fn`): a strategy never tests a task's name, it asks for a
*capability*. Each has two faces:

- **at config time** a task's config section says whether it offers it
  (`TaskSection.offers`, or `lacks` with the reason where the answer depends on
  its settings), so `shoal config validate` refuses, in one line, a strategy
  that needs what the task cannot give (:meth:`Capability.require`);
- **at run time** the task object implements a small Protocol, handed to the
  strategy by :meth:`Capability.of` (typed, so the strategy needs no cast).

This module imports no torch: config sections import it to declare what they
offer, and validating a config must stay light.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast, runtime_checkable

from shoal.errors import ShoalError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from shoal.protocols.task import LossOutput

P = TypeVar("P")


@dataclass(frozen=True)
class Capability(Generic[P]):
    """One thing a task may offer: its name in messages and the protocol it implements."""

    #: as messages say it: "pipeline stages"
    name: str
    #: what a task offering it can do, completing "a task that can ...": "cut its model into
    #: pipeline stages"
    can: str
    #: the Protocol class (runtime-checkable) a task offering it implements
    protocol: Any
    #: what to do with a task that does not offer it at all: "use data_parallel"
    otherwise: str = "use data_parallel, which trains any task"

    def lacked_by(self, task_section: Any) -> str | None:
        """Why the task a `[task]` section configures cannot offer this (None: it can). A
        section names what it offers in `offers`, and may explain a refusal in `lacks`."""
        if getattr(task_section, "type", None) == "custom":  # a class named by dotted path
            task_section = task_section.config  # keeps its own settings one table down
        lacks = getattr(task_section, "lacks", None)
        if callable(lacks):
            reason: str | None = lacks(self)
            return reason
        if self in getattr(task_section, "offers", ()):
            return None
        return self.not_offered(task_section)

    def not_offered(self, task_section: Any) -> str:
        """The reason for a task that does not offer this at all, and what to do instead."""
        kind = getattr(task_section, "type", "?")
        return f"task type '{kind}' has no {self.name}; {self.otherwise}"

    def require(self, task_section: Any, strategy: str) -> str | None:
        """The one-line refusal of `strategy` for a task without this capability (None: the
        task has it). Config checks raise it at the field `task.type`."""
        reason = self.lacked_by(task_section)
        if reason is None:
            return None
        return f"strategy {strategy} needs a task that can {self.can}: {reason}"

    def of(self, task: Any, strategy: str) -> P:
        """The task as this capability's protocol; a task that does not implement it (a
        plugin whose config claims more than its class does) is refused in one line."""
        if isinstance(task, self.protocol):
            return cast(P, task)
        missing = [
            name
            for name in getattr(self.protocol, "__protocol_attrs__", ())
            if not hasattr(task, name)
        ]
        raise ShoalError(
            f"strategy {strategy} needs a task that can {self.can}; task "
            f"{type(task).__name__} lacks {', '.join(sorted(missing)) or 'its methods'}"
        )


@runtime_checkable
class PipelineStages(Protocol):
    """A model cut into contiguous stages of blocks, each a module with the full model's
    parameter names; a batch split into stage inputs and the last stage's targets."""

    def pipeline_block_names(self, model: nn.Module) -> list[str]:
        """The paths of `model`'s blocks, in order (the units a partition assigns to
        stages; a split point names one)."""
        ...

    def pipeline_stage(self, model: nn.Module, first: int, last: int) -> nn.Module:
        """The stage of blocks first..last (the first stage adds what comes before the
        blocks, the last what comes after), sharing `model`'s modules."""
        ...

    def pipeline_batch(self, batch: Any) -> tuple[torch.Tensor, Any]:
        """(first stage's input, last stage's target) of a training batch."""
        ...

    def pipeline_loss(self, output: torch.Tensor, target: Any) -> LossOutput:
        """The summed loss of the last stage's output."""
        ...


@runtime_checkable
class TensorPlan(Protocol):
    """A plan that splits the model's projections over a tensor dimension."""

    def tensor_plan(self, model: nn.Module, sequence_parallel: bool) -> dict[str, Any]:
        """{module name: torch ParallelStyle} for `parallelize_module` (the full model or a
        pipeline stage of it: entries whose module the model lacks are left out)."""
        ...


@runtime_checkable
class ShardUnits(Protocol):
    """The blocks fully sharded data parallelism gathers one at a time."""

    def shard_units(self, model: nn.Module) -> list[nn.Module]:
        """The submodules FSDP wraps one by one before it wraps the root."""
        ...


@dataclass(frozen=True)
class ServedTable:
    """One embedding table a parameter server serves: its rows' labels (what a sharding by
    label or by file reads) and whether it is small enough to shard by position."""

    labels: Sequence[str]
    #: a small table (relations): its rows are dealt by position, never by a file
    small: bool = False

    @property
    def rows(self) -> int:
        return len(self.labels)


@runtime_checkable
class ServedTables(Protocol):
    """A model that reads rows of two embedding tables ("entity", "relation") a batch at
    a time, so servers can hold the tables and workers pull only the rows a batch touches."""

    def served_tables(self) -> dict[str, ServedTable]:
        """The tables by name, "entity" then "relation"."""
        ...

    def table_weights(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """`model`'s tables by name: the initial rows servers shard, or (a model on the meta
        device) their shapes."""
        ...

    def initial_rows(self, model: nn.Module, table: str, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of `table` as `model` (built after the run's seed was set; on the meta
        device) starts: the rows a server builds, alone, for the ids it owns, equal to
        those of the same model built with its tables."""
        ...

    def serve(self, model: nn.Module, source: Any) -> None:
        """Make `model` read its rows from `source` (`rows(table, ids)`, `entity_blocks()`)
        instead of its own tables, which it drops."""
        ...

    def rows_touched(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The sorted unique entity and relation rows a training batch reads."""
        ...

    def rows_held(self, samples: int) -> tuple[int, int]:
        """At most how many entity and relation rows a share of `samples` training samples
        reads (a worker's memory bound)."""
        ...

    def eval_batch_size(self) -> int:
        """Queries scored at once against every entity in evaluation."""
        ...


@runtime_checkable
class ClassLabels(Protocol):
    """A class label per training sample (federated clients with label skew)."""

    def sample_labels(self) -> torch.Tensor:
        """The label of each training sample, by index."""
        ...


@runtime_checkable
class ClientFiles(Protocol):
    """Training samples read from per-client files (federated clients holding their own)."""

    def load_train_files(self, paths: list[str]) -> list[int]:
        """Replace the training samples by the concatenation of `paths`; their counts."""
        ...


PIPELINE_STAGES = Capability[PipelineStages](
    "pipeline stages", "cut its model into pipeline stages", PipelineStages
)
TENSOR_PLAN = Capability[TensorPlan](
    "tensor-parallel plan", "split its model's projections over ranks", TensorPlan
)
SHARD_UNITS = Capability[ShardUnits](
    "blocks to shard", "name the blocks fully sharded training gathers one by one", ShardUnits
)
SERVED_TABLES = Capability[ServedTables](
    "embedding tables",
    "have its embedding rows held by parameter servers",
    ServedTables,
    "use data_parallel for a dense model",
)
CLASS_LABELS = Capability[ClassLabels](
    "class labels",
    "give each training sample a class label",
    ClassLabels,
    'use partition kind = "iid"',
)
CLIENT_FILES = Capability[ClientFiles](
    "per-client training files",
    "read each client's samples from its own file",
    ClientFiles,
    'use partition kind = "iid"',
)

CAPABILITIES: tuple[Capability[Any], ...] = (
    PIPELINE_STAGES,
    TENSOR_PLAN,
    SHARD_UNITS,
    SERVED_TABLES,
    CLASS_LABELS,
    CLIENT_FILES,
)
"""Every capability, in the order `shoal plugins` and the docs list them."""
