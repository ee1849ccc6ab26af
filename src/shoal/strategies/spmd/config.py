"""`[strategy]` of the SPMD strategies: tensor_parallel, fully_sharded, hybrid.

Each names the sizes of its mesh dimensions (`dims`): tensor_parallel
`{tensor = degree}`, fully_sharded `{data = degree}` (sharded), hybrid its
`mesh` (`data` sharded or replicated). The world size is their product.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any, ClassVar, Literal

from pydantic import Field

from shoal.config.base import LEARNERS, RESUME_SAFE, FieldError, StrategySection
from shoal.protocols.capabilities import SHARD_UNITS, TENSOR_PLAN
from shoal.protocols.layouts import Style, block_classes, meta_model, nearest, pattern_names
from shoal.shape.hosts import Hosts
from shoal.shape.job import mesh_labels
from shoal.shape.roles import RankRoles
from shoal.strategies.pipeline.config import PipelineFields

#: mesh dimensions, outermost first (rank = row-major index over them)
DIMENSIONS = ("data", "pipeline", "tensor")


class SpmdSection(StrategySection):
    """What the three share: a mesh, and the task's capabilities and rules on it."""

    workers_field: ClassVar[str | None] = "degree"
    # the mesh may change on resume: the checkpoint's pieces reshard by name (DCP)
    resumes_from: ClassVar[tuple[str, ...]] = LEARNERS

    sequence_parallel: bool = Field(
        False,
        description="Shard the activations between blocks along the sequence over the tensor "
        "dimension (norms and residual dropout work on each rank's part; Korthikanti et al.).",
        json_schema_extra=RESUME_SAFE,
    )

    place_by_host: bool = Field(
        True,
        description="Lay the mesh out by host: tensor (then pipeline) groups inside a host "
        "where they fit, data across hosts, whatever the launcher's rank numbers; false: "
        "ranks in row-major rank order.",
        json_schema_extra=RESUME_SAFE,
    )
    plan: dict[str, Style] | None = Field(
        None,
        description="A tensor dimension's plan by module path pattern (`*` matches one part), "
        'e.g. { "model.layers.*.self_attn.q_proj" = "colwise", "model.layers.*.self_attn.'
        'o_proj" = "rowwise" }: colwise | rowwise | colwise_gather (a head, its output '
        "gathered) | rowwise_embedding (an embedding by vocabulary rows) | sequence_parallel. "
        "Unset: the task's plan (shoal's lm, a Hugging Face model's family).",
    )
    wrap: list[str] | None = Field(
        None,
        description="A sharded data dimension's units by class name, each gathered on its own "
        'before the whole model, e.g. ["LlamaDecoderLayer"]. Unset: the task\'s blocks (the '
        "largest list of same-class children).",
    )

    @abstractmethod
    def dims(self) -> dict[str, int]:
        """The mesh's dimensions and sizes, outermost first: each of the three configs
        says its own (tensor_parallel: tensor = degree; fully_sharded: data = degree;
        hybrid: its `mesh`)."""

    def data_mode(self) -> str:
        return "sharded"

    def worker_count(self) -> int:
        return math.prod(self.dims().values())

    def roles(self, hosts: Hosts | None) -> RankRoles:
        dims = self.dims()
        return RankRoles.mesh(math.prod(dims.values()), dims, hosts if self.place_by_host else None)

    def rank_labels(self, roles: RankRoles) -> tuple[str, ...]:
        """'rank 3 (data 1, tensor 1)': the launcher names a dead or hung rank so."""
        return mesh_labels(roles)

    def dims_field(self, dim: str) -> tuple[str, ...]:
        """The field that sets dimension `dim` (for error messages)."""
        return ("strategy", "degree")

    def check(self, config: Any) -> None:
        super().check(config)
        dims = self.dims()
        if "tensor" in dims and self.plan is None:
            self.require(TENSOR_PLAN, config)
        if self.data_mode() == "sharded" and "data" in dims and self.wrap is None:
            self.require(SHARD_UNITS, config)
        self._check_names(config)
        self.check_task_layout(config, dims, {dim: self.dims_field(dim) for dim in dims})
        tensor = dims.get("tensor", 1)
        if self.sequence_parallel and tensor == 1:
            raise FieldError(
                ("strategy", "sequence_parallel"), "needs a tensor dimension larger than 1"
            )

    def _check_names(self, config: Any) -> None:
        """A plan's patterns and the wrapped classes name parts of the task's model (built on
        the meta device, when the task can say: `TaskSection.meta_model`)."""
        if self.plan is None and self.wrap is None:
            return
        model = meta_model(config)
        if model is None:
            return
        for pattern in self.plan or {}:
            if not pattern_names(model, pattern):
                near = ", ".join(nearest(model, pattern)) or "none"
                raise FieldError(
                    ("strategy", "plan", pattern),
                    f"names no module of {type(model).__name__}; nearest: {near}",
                )
        missing = sorted(set(self.wrap or ()) - {type(m).__name__ for m in model.modules()})
        if missing:
            raise FieldError(
                ("strategy", "wrap"),
                f"{type(model).__name__} has no module of class {', '.join(missing)}; its "
                f"repeated blocks are {', '.join(block_classes(model)) or 'none'}",
            )


class TensorParallelStrategyConfig(SpmdSection):
    """Attention heads and MLP split column-/row-wise across `degree` ranks (Megatron-LM)."""

    type: Literal["tensor_parallel"] = "tensor_parallel"
    degree: int = Field(
        2,
        ge=1,
        description="Ranks that share each block's heads and hidden units (`--workers`).",
        json_schema_extra=RESUME_SAFE,
    )

    def dims(self) -> dict[str, int]:
        return {"tensor": self.degree}


class FullyShardedStrategyConfig(SpmdSection):
    """Parameters, gradients and optimizer state sharded over `degree` ranks (ZeRO-3, FSDP2)."""

    type: Literal["fully_sharded"] = "fully_sharded"
    degree: int = Field(
        2,
        ge=1,
        description="Ranks the parameters are sharded over; each trains on its slice of every "
        "global batch (`--workers`).",
        json_schema_extra=RESUME_SAFE,
    )

    def dims(self) -> dict[str, int]:
        return {"data": self.degree}


class HybridStrategyConfig(SpmdSection, PipelineFields):
    """A mesh over the world, e.g. `mesh = { data = 2, tensor = 2 }` or
    `{ data = 2, pipeline = 2 }`. With a pipeline dimension the pipeline fields
    (`microbatches`, `schedule`, `partitions`, `balance`) apply as under the pipeline
    strategy: each pipeline of the mesh cuts the model into stages."""

    type: Literal["hybrid"] = "hybrid"
    workers_field: ClassVar[str | None] = None  # its mesh names every dimension's size
    mesh: dict[str, int] = Field(
        description="Sizes of the mesh dimensions (data, pipeline, tensor); their product is "
        "the number of worker processes. Data outermost; across hosts tensor (then pipeline) "
        "groups lie inside a host (see place_by_host).",
        json_schema_extra=RESUME_SAFE,
    )
    data: Literal["sharded", "replicated"] = Field(
        "sharded",
        description="The data dimension: sharded (FSDP: parameters, gradients and optimizer "
        "state sharded over it) or replicated (gradients all-reduced over it, block by block).",
        json_schema_extra=RESUME_SAFE,
    )

    def dims(self) -> dict[str, int]:
        return {name: self.mesh[name] for name in DIMENSIONS if name in self.mesh}

    def data_mode(self) -> str:
        return self.data

    def dims_field(self, dim: str) -> tuple[str, ...]:
        return ("strategy", "mesh", dim)

    @property
    def pipeline_ranks(self) -> int:
        return self.mesh.get("pipeline", 1)

    @property
    def stages_field(self) -> tuple[str, ...]:
        return ("strategy", "mesh", "pipeline")

    def check(self, config: Any) -> None:
        for name, size in self.mesh.items():
            if name not in DIMENSIONS:
                raise FieldError(
                    ("strategy", "mesh", name),
                    f"unknown mesh dimension; choose from {', '.join(DIMENSIONS)}",
                )
            if size < 1:
                raise FieldError(("strategy", "mesh", name), f"must be at least 1, got {size}")
        if not self.mesh:
            raise FieldError(("strategy", "mesh"), "name at least one dimension, e.g. data = 2")
        super().check(config)
        if self.rebalance != "off":
            raise FieldError(
                ("strategy", "rebalance"),
                "re-partitioning at checkpoints is built for strategy pipeline, not for a "
                'hybrid mesh\'s pipeline dimension; set rebalance = "off"',
            )
        if "pipeline" in self.mesh:
            self._check_pipeline_dimension(config)

    def _check_pipeline_dimension(self, config: Any) -> None:
        if self.mesh["pipeline"] < 2:
            raise FieldError(
                ("strategy", "mesh", "pipeline"),
                "a pipeline dimension has at least 2 stages; leave it out for none",
            )
        if self.sequence_parallel:
            raise FieldError(
                ("strategy", "sequence_parallel"),
                "sequence parallelism is not built with a pipeline dimension (the stages "
                "exchange whole sequences); set sequence_parallel = false",
            )
        self.check_pipeline(config, data=self.mesh.get("data", 1))
