"""`[strategy]` of the SPMD strategies: tensor_parallel, fully_sharded, hybrid.

Each names the sizes of its mesh dimensions (`dims`): tensor_parallel
`{tensor = degree}`, fully_sharded `{data = degree}` (sharded), hybrid its
`mesh` (`data` sharded or replicated). The world size is their product.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Literal

from pydantic import Field

from shoal.config.base import FieldError, StrategySection
from shoal.strategies.pipeline.config import PipelineFields

#: mesh dimensions, outermost first (rank = row-major index over them)
DIMENSIONS = ("data", "pipeline", "tensor")


class SpmdSection(StrategySection):
    """What the three share: the lm model, the mesh's rules against it."""

    sequence_parallel: bool = Field(
        False,
        description="Shard the activations between blocks along the sequence over the tensor "
        "dimension (norms and residual dropout work on each rank's part; Korthikanti et al.).",
    )

    @abstractmethod
    def dims(self) -> dict[str, int]:
        """The mesh's dimensions and sizes, outermost first: each of the three configs
        says its own (tensor_parallel: tensor = degree; fully_sharded: data = degree;
        hybrid: its `mesh`)."""

    def data_mode(self) -> str:
        return "sharded"

    def dims_field(self, dim: str) -> tuple[str, ...]:
        """The field that sets dimension `dim` (for error messages)."""
        return ("strategy", "degree")

    def check(self, config: Any) -> None:
        super().check(config)
        task = config.task
        if task.type != "lm":
            raise FieldError(
                ("strategy", "type"),
                f"{self.type} splits the lm task's transformer (its blocks and projections); "  # type: ignore[attr-defined]
                f'task.type is "{task.type}": use type = "data_parallel" for it',
            )
        tensor = self.dims().get("tensor", 1)
        model = task.model
        if tensor > 1 and model.heads % tensor:
            raise FieldError(
                self.dims_field("tensor"),
                f"a tensor degree of {tensor} does not divide task.model.heads ({model.heads}): "
                "each rank computes whole heads; choose a divisor of the heads",
            )
        if tensor > 1 and model.tie_embeddings:
            raise FieldError(
                ("task", "model", "tie_embeddings"),
                "the embedding is split by vocabulary rows and the head by columns under tensor "
                "parallelism, so they cannot share one weight; set tie_embeddings = false",
            )
        if self.sequence_parallel and tensor == 1:
            raise FieldError(
                ("strategy", "sequence_parallel"), "needs a tensor dimension larger than 1"
            )


class TensorParallelStrategyConfig(SpmdSection):
    """Attention heads and MLP split column-/row-wise across `degree` ranks (Megatron-LM)."""

    type: Literal["tensor_parallel"] = "tensor_parallel"
    degree: int = Field(
        2, ge=1, description="Ranks that share each block's heads and hidden units (`--workers`)."
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
    )

    def dims(self) -> dict[str, int]:
        return {"data": self.degree}


class HybridStrategyConfig(SpmdSection, PipelineFields):
    """A mesh over the world, e.g. `mesh = { data = 2, tensor = 2 }` or
    `{ data = 2, pipeline = 2 }`. With a pipeline dimension the pipeline fields
    (`microbatches`, `schedule`, `partitions`, `balance`) apply as under the pipeline
    strategy: each pipeline of the mesh cuts the model into stages."""

    type: Literal["hybrid"] = "hybrid"
    mesh: dict[str, int] = Field(
        description="Sizes of the mesh dimensions (data, pipeline, tensor); their product is "
        "the number of worker processes. Ranks are laid out row-major, data outermost."
    )
    data: Literal["sharded", "replicated"] = Field(
        "sharded",
        description="The data dimension: sharded (FSDP: parameters, gradients and optimizer "
        "state sharded over it) or replicated (gradients all-reduced over it, block by block).",
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
        if self.schedule == "interleaved_1f1b":
            raise FieldError(
                ("strategy", "schedule"),
                'interleaved_1f1b is not built in a hybrid mesh; use "gpipe" or "1f1b"',
            )
        if self.sequence_parallel:
            raise FieldError(
                ("strategy", "sequence_parallel"),
                "sequence parallelism is not built with a pipeline dimension (the stages "
                "exchange whole sequences); set sequence_parallel = false",
            )
        self.check_pipeline(config, data=self.mesh.get("data", 1))
