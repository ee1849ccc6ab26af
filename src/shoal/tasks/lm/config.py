"""`[task]` with `type = "lm"`: a decoder-only transformer trained on a text file."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from shoal.config.base import (
    RESUME_FIXED,
    RESUME_SAFE,
    ConfigModel,
    ExistingFile,
    FieldError,
    TaskSection,
)
from shoal.protocols.capabilities import PIPELINE_STAGES, SHARD_UNITS, TENSOR_PLAN, Capability
from shoal.textfile import text_size

DEFAULT_SPLIT = 0.9


class LMDataConfig(ConfigModel):
    """The text: one UTF-8 file to train on (gzip read transparently), validation apart or cut
    from its end."""

    train: ExistingFile = Field(
        ..., description="UTF-8 text file to train on (relative to the config; .gz is fine)."
    )
    valid: ExistingFile | None = Field(
        None, description="A separate UTF-8 text file to validate on (instead of `split`)."
    )
    split: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Without `valid`: train on this leading fraction of `train`'s tokens and "
        "validate on the rest, the end of the file (default 0.9; 1.0: no validation).",
    )

    @model_validator(mode="after")
    def _one_validation_source(self) -> LMDataConfig:
        if self.valid is not None and self.split is not None:
            raise ValueError("give either valid (a file) or split (a fraction of train), not both")
        return self

    @property
    def train_fraction(self) -> float:
        """The share of `train` that is trained on (1.0 with a separate `valid` file)."""
        if self.valid is not None:
            return 1.0
        return DEFAULT_SPLIT if self.split is None else self.split


class LMModelConfig(ConfigModel):
    """Sizes of the decoder-only transformer (the vocabulary comes from the tokenizer)."""

    dim: int = Field(
        384,
        ge=1,
        description="Width of the residual stream (embedding size).",
        json_schema_extra=RESUME_FIXED,
    )
    heads: int = Field(
        6,
        ge=1,
        description="Attention heads per block; must divide dim.",
        json_schema_extra=RESUME_FIXED,
    )
    layers: int = Field(6, ge=1, description="Transformer blocks.", json_schema_extra=RESUME_FIXED)
    mlp_ratio: float = Field(
        4.0,
        gt=0,
        description="Hidden width of each block's MLP, as a multiple of dim.",
        json_schema_extra=RESUME_FIXED,
    )
    context: int = Field(
        256,
        ge=1,
        description="Tokens the model attends over (a training window's length).",
        json_schema_extra=RESUME_FIXED,
    )
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Dropout on embeddings, attention weights and residual branches.",
    )
    bias: bool = Field(
        False, description="Biases in the linear layers and norms.", json_schema_extra=RESUME_FIXED
    )
    position: Literal["learned", "rotary"] = Field(
        "learned",
        description="learned = a positional embedding table (GPT-2); rotary = rotate queries and "
        "keys by position (RoFormer; Su et al., 2021).",
        json_schema_extra=RESUME_FIXED,
    )
    rotary_base: float = Field(10000.0, gt=1, description="position = rotary: the base theta.")
    tie_embeddings: bool = Field(
        False,
        description="Share the token embedding with the LM head. It puts one parameter on the "
        "first and the last pipeline stage, so pipeline training needs it false.",
        json_schema_extra=RESUME_FIXED,
    )
    init_std: float = Field(
        0.02, gt=0, description="Standard deviation of the normal initialisation (GPT-2)."
    )

    @model_validator(mode="after")
    def _check(self) -> LMModelConfig:
        if self.dim % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide dim ({self.dim})")
        if self.position == "rotary" and (self.dim // self.heads) % 2:
            raise ValueError(
                "position = rotary needs an even head width dim / heads, "
                f"got {self.dim // self.heads}"
            )
        if self.hidden < 1:
            raise ValueError(f"mlp_ratio ({self.mlp_ratio}) * dim gives an empty MLP")
        return self

    @property
    def hidden(self) -> int:
        """The MLP's hidden width."""
        return round(self.mlp_ratio * self.dim)


class LMEvaluationConfig(ConfigModel):
    """Validation: the loss per token over the validation text, in windows of `context`."""

    max_windows: int | None = Field(
        None,
        ge=1,
        description="Evaluate only the first N windows of the validation text, for quick checks "
        "(unset: all of it, the figure to report).",
        json_schema_extra=RESUME_SAFE,
    )


class LMTaskConfig(TaskSection):
    """Causal language modelling: predict each next token of a text."""

    type: Literal["lm"] = "lm"
    tokenizer: Literal["char", "byte"] = Field(
        "char",
        description="char = one token per character of the text files (vocabulary built from "
        "them); byte = one token per UTF-8 byte (256 tokens, any text).",
        json_schema_extra=RESUME_FIXED,
    )
    data: LMDataConfig = Field(..., description="The text to train and validate on.")
    model: LMModelConfig = Field(
        default_factory=LMModelConfig, description="Sizes of the transformer."
    )
    evaluation: LMEvaluationConfig = Field(
        default_factory=LMEvaluationConfig, description="Validation."
    )

    #: its blocks cut into pipeline stages, Megatron's plan over a tensor dimension, FSDP per
    #: block (tasks/lm/model.py lays the transformer out for all three)
    offers: ClassVar[frozenset[Capability[Any]]] = frozenset(
        {PIPELINE_STAGES, TENSOR_PLAN, SHARD_UNITS}
    )

    def pipeline_block_names(self) -> list[str]:
        return [f"blocks.{index}" for index in range(self.model.layers)]

    def memory_needs(self) -> list[tuple[str, int, int]]:
        """The text read whole: its bytes, the decoded string (1 to 4 bytes a character)
        and the token ids (4 bytes each), about 7 bytes a byte of text for mostly-ASCII text
        (a gzip file's size is its trailer's); the transformer's parameters from its sizes
        and a vocabulary of at most 256 for bytes (char vocabularies are rarely larger)."""
        text = sum(text_size(Path(f)) for f in (self.data.train, self.data.valid) if f)
        m = self.model
        vocab = 256
        per_block = 4 * m.dim * m.dim + 2 * m.dim * m.hidden + 9 * m.dim + m.hidden
        tables = vocab * m.dim * (1 if m.tie_embeddings else 2)
        positions = m.context * m.dim if m.position == "learned" else 0
        parameters = m.layers * per_block + tables + positions
        what = f"task.data: {text:,} bytes of text"
        return [(what, 7 * text + (32 << 20), parameters)]

    def check_layout(self, dims: dict[str, int], fields: dict[str, tuple[str, ...]]) -> None:
        """Whole heads on each tensor rank; no weight shared by the embedding and the head
        when a tensor dimension splits them differently or a pipeline puts them apart."""
        tensor = dims.get("tensor", 1)
        if tensor > 1 and self.model.heads % tensor:
            raise FieldError(
                fields["tensor"],
                f"a tensor degree of {tensor} does not divide task.model.heads "
                f"({self.model.heads}): each rank computes whole heads; choose a divisor of "
                "the heads",
            )
        if not self.model.tie_embeddings:
            return
        if tensor > 1:
            raise FieldError(
                ("task", "model", "tie_embeddings"),
                "the embedding is split by vocabulary rows and the head by columns under tensor "
                "parallelism, so they cannot share one weight; set tie_embeddings = false",
            )
        if dims.get("pipeline", 1) > 1:
            raise FieldError(
                ("task", "model", "tie_embeddings"),
                "strategy pipeline puts the embedding on the first stage and the head on the "
                "last, which tying would share; set tie_embeddings = false",
            )
