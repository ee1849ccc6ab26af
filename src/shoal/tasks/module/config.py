"""`[task] type = "module"`: the user's own `nn.Module`, its data and its loss, from a factory.

    [task]
    type = "module"
    factory = "my_models:build"        # a function of `options`, imported from import_dir
    options = { layers = 4 }

The factory returns a mapping: `model` (an `nn.Module`, or a zero-argument callable
returning one), `train` (and optionally `valid`, `test`: map-style Datasets or
IterableDatasets), optionally `collate`, `loss` ("cross_entropy", "mse",
"causal_lm" or a callable) and `metrics`. The factory is imported and called while
the config is validated, so a factory that does not import or returns something
else is one line at `shoal config validate`; the model itself is built only where
it trains.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator

from shoal.config.base import RESUME_SAFE, FieldError, TaskSection
from shoal.protocols.capabilities import (
    PIPELINE_STAGES,
    SHARD_UNITS,
    TENSOR_PLAN,
    Capability,
)
from shoal.tasks.user_code import FACTORY_PATTERN, FactoryOptions


class ModuleTaskConfig(TaskSection, FactoryOptions):
    """Your own model: any `nn.Module`, its datasets and its loss, from a factory."""

    type: Literal["module"] = "module"
    factory: str = Field(
        ...,
        pattern=FACTORY_PATTERN,
        description="`package.module:function` returning {model, train, [valid, test, "
        "collate, loss, metrics]} (see docs: your own model).",
    )
    weights: str | None = Field(
        None,
        description="Pretrained weights: a Hugging Face folder of safetensors (as "
        "save_pretrained writes it) or one .safetensors file, relative to the config's "
        "folder; each rank reads only its pieces. Tensors it lacks are initialised.",
        json_schema_extra=RESUME_SAFE,
    )
    metric: str = Field(
        "loss",
        description="The validation figure that picks the best model and stops early: loss, "
        "or a name the factory's `metrics` reports (accuracy for cross_entropy).",
    )
    mode: Literal["min", "max"] | None = Field(
        None,
        description="Whether a lower (min) or higher (max) metric is better (default: "
        "min for loss, max otherwise).",
    )

    #: every capability a model-side strategy asks: the model is cut at its block list, a
    #: tensor plan comes from the config or its family, FSDP wraps its repeated blocks
    offers: ClassVar[frozenset[Capability[Any]]] = frozenset(
        {PIPELINE_STAGES, TENSOR_PLAN, SHARD_UNITS}
    )

    #: the factory's checked result, once `check` called it (`factory.Built`)
    _built: Any = PrivateAttr(None)
    _meta: Any = PrivateAttr(None)

    @field_validator("weights")
    @classmethod
    def _weights_exist(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        from pathlib import Path

        from shoal.tasks.module.weights import weight_files

        base = (info.context or {}).get("base_dir")
        path = Path(value).expanduser()
        if not path.is_absolute() and base is not None:
            path = Path(base) / path
        try:
            weight_files(path.resolve())
        except (ValueError, OSError, RuntimeError) as exc:
            raise ValueError(
                f"{exc}; give a folder save_pretrained wrote, or a .safetensors file"
            ) from None
        return str(path.resolve())

    @property
    def primary_metric(self) -> tuple[str, str]:  # type: ignore[override]
        """`metric` and its direction: a lower loss, a higher anything else by default."""
        return self.metric, self.mode or ("min" if self.metric == "loss" else "max")

    def check(self, config: Any) -> None:
        """The factory imports and returns what a task needs (called once per process, the
        job's seed set: `factory.py`)."""
        from shoal.tasks.module.factory import check_factory  # imports the user's code

        problem = check_factory(self, config.train.seed)
        if problem is not None:
            field, message = problem
            raise FieldError(("task", field), message)
        from shoal.tasks.module.factory import built

        self._built = built(self, config.train.seed)

    def meta_model(self) -> Any:
        """The model built on the meta device (no memory, no init), to check names against."""
        if self._built is None:
            return None
        if self._meta is None:
            from shoal.tasks.module.factory import on_meta

            self._meta = on_meta(self._built)
        return self._meta

    def pipeline_block_names(self) -> list[str] | None:
        from shoal.tasks.module.layout import known_cut

        model = self.meta_model()
        cut = known_cut(model) if model is not None else None
        return cut.names if cut is not None else None

    def lacks(self, capability: Capability[Any]) -> str | None:
        """A pipeline scores the last stage with a causal LM's loss; FSDP needs repeated
        blocks; a tensor dimension a known family (else a plan in the strategy's config)."""
        if capability is PIPELINE_STAGES and self._built is not None:
            loss = self._built.loss
            if loss != "causal_lm":
                kind = loss if isinstance(loss, str) else "a function of the whole model"
                return (
                    f"the factory's loss is {kind}; a pipeline of a user model runs "
                    'loss = "causal_lm" on its last stage'
                )
            model = self.meta_model()
            from shoal.tasks.module.layout import known_cut

            if model is not None and known_cut(model) is None:
                return (
                    f"{type(model).__name__} has no block list a stage knows how to run "
                    "(a Hugging Face causal LM: Llama-style model.layers or GPT-2-style "
                    "transformer.h)"
                )
        return super().lacks(capability)

    def check_layout(self, dims: dict[str, int], fields: dict[str, tuple[str, ...]]) -> None:
        """Whole attention heads (and key/value heads) on each tensor rank; an embedding and
        head that share one weight on one pipeline stage (the first and the last hold
        them, and would train two copies apart)."""
        tensor = dims.get("tensor", 1)
        model = self.meta_model()
        if model is not None and dims.get("pipeline", 1) > 1 and _ties_head(model):
            raise FieldError(
                fields["pipeline"],
                "the factory's model ties its head to its input embedding, which a pipeline "
                "puts on its last and first stages; untie them (tie_word_embeddings = "
                "false) or train it with fully_sharded",
            )
        if tensor == 1 or model is None:
            return
        from shoal.tasks.module.layout import head_counts

        for name, heads in head_counts(model).items():
            if heads % tensor:
                raise FieldError(
                    fields["tensor"],
                    f"a tensor degree of {tensor} does not divide the model's {name} "
                    f"({heads}): each rank computes whole heads; choose a divisor of it",
                )


def _ties_head(model: Any) -> bool:
    """Whether the model's head shares its weight with the input embedding."""
    head = getattr(model, "lm_head", None)
    embed = getattr(model, "get_input_embeddings", None)
    weight = getattr(embed(), "weight", None) if callable(embed) else None
    return weight is not None and getattr(head, "weight", None) is weight
