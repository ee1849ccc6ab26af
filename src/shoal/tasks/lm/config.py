"""`[task]` with `type = "lm"`: a decoder-only transformer trained on a text file."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from shoal.config.base import ConfigModel, ExistingFile

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

    dim: int = Field(384, ge=1, description="Width of the residual stream (embedding size).")
    heads: int = Field(6, ge=1, description="Attention heads per block; must divide dim.")
    layers: int = Field(6, ge=1, description="Transformer blocks.")
    mlp_ratio: float = Field(
        4.0, gt=0, description="Hidden width of each block's MLP, as a multiple of dim."
    )
    context: int = Field(
        256, ge=1, description="Tokens the model attends over (a training window's length)."
    )
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Dropout on embeddings, attention weights and residual branches.",
    )
    bias: bool = Field(False, description="Biases in the linear layers and norms.")
    position: Literal["learned", "rotary"] = Field(
        "learned",
        description="learned = a positional embedding table (GPT-2); rotary = rotate queries and "
        "keys by position (RoFormer; Su et al., 2021).",
    )
    rotary_base: float = Field(10000.0, gt=1, description="position = rotary: the base theta.")
    tie_embeddings: bool = Field(
        False,
        description="Share the token embedding with the LM head. It puts one parameter on the "
        "first and the last pipeline stage, so pipeline training needs it false.",
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
    )


class LMTaskConfig(ConfigModel):
    """Causal language modelling: predict each next token of a text."""

    type: Literal["lm"] = "lm"
    tokenizer: Literal["char", "byte"] = Field(
        "char",
        description="char = one token per character of the text files (vocabulary built from "
        "them); byte = one token per UTF-8 byte (256 tokens, any text).",
    )
    data: LMDataConfig = Field(..., description="The text to train and validate on.")
    model: LMModelConfig = Field(
        default_factory=LMModelConfig, description="Sizes of the transformer."
    )
    evaluation: LMEvaluationConfig = Field(
        default_factory=LMEvaluationConfig, description="Validation."
    )
