"""`[train]`: how long, how big a batch, which optimizer and schedule."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from shoal.config.base import RESUME_SAFE, ConfigModel, fill_default_tag


class _Optimizer(ConfigModel):
    """What every optimizer section says: the torch optimizer it builds, and with what."""

    #: the class in `torch.optim` this section builds
    torch_class: ClassVar[str]

    def arguments(self) -> dict[str, Any]:
        """Keyword arguments of `torch_class`: the section's fields (betas as a pair)."""
        fields = self.model_dump(exclude={"kind"})
        if "betas" in fields:
            fields["betas"] = tuple(fields["betas"])
        return fields


class _Betas(ConfigModel):
    """Adam's moment decay rates."""

    betas: list[float] = Field(
        [0.9, 0.999], min_length=2, max_length=2, description="[beta1, beta2], each in [0, 1)."
    )

    @model_validator(mode="after")
    def _betas_in_range(self) -> _Betas:
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must each lie in [0, 1), got {self.betas}")
        return self


class SGDConfig(_Optimizer):
    """Stochastic gradient descent, optionally with (Nesterov) momentum."""

    torch_class: ClassVar[str] = "SGD"
    kind: Literal["sgd"] = "sgd"
    lr: float = Field(0.01, gt=0, description="Learning rate (peak, after warm-up).")
    momentum: float = Field(0.0, ge=0, lt=1, description="Momentum factor in [0, 1).")
    dampening: float = Field(0.0, ge=0, le=1, description="Dampening for momentum.")
    nesterov: bool = Field(False, description="Use Nesterov momentum (needs momentum > 0).")
    weight_decay: float = Field(0.0, ge=0, description="L2 penalty added to the gradient.")

    @model_validator(mode="after")
    def _nesterov_needs_momentum(self) -> SGDConfig:
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("nesterov = true needs momentum > 0 and dampening = 0")
        return self


class AdamConfig(_Optimizer, _Betas):
    """Adam (Kingma & Ba, 2015)."""

    torch_class: ClassVar[str] = "Adam"
    kind: Literal["adam"] = "adam"
    lr: float = Field(1e-3, gt=0, description="Learning rate (peak, after warm-up).")
    eps: float = Field(1e-8, gt=0, description="Term added to the denominator.")
    weight_decay: float = Field(0.0, ge=0, description="L2 penalty added to the gradient.")
    amsgrad: bool = Field(False, description="Use the AMSGrad variant.")


class AdamWConfig(AdamConfig):
    """AdamW: Adam with decoupled weight decay (Loshchilov & Hutter, 2019)."""

    torch_class: ClassVar[str] = "AdamW"
    kind: Literal["adamw"] = "adamw"  # type: ignore[assignment]
    weight_decay: float = Field(0.01, ge=0, description="Decoupled weight decay.")


class AdagradConfig(_Optimizer):
    """Adagrad (Duchi et al., 2011)."""

    torch_class: ClassVar[str] = "Adagrad"
    kind: Literal["adagrad"] = "adagrad"
    lr: float = Field(0.01, gt=0, description="Learning rate (peak, after warm-up).")
    lr_decay: float = Field(0.0, ge=0, description="Adagrad's own learning-rate decay.")
    eps: float = Field(1e-10, gt=0, description="Term added to the denominator.")
    weight_decay: float = Field(0.0, ge=0, description="L2 penalty added to the gradient.")
    initial_accumulator_value: float = Field(0.0, ge=0, description="Start of the sum of squares.")


class SparseAdamConfig(_Optimizer, _Betas):
    """Lazy Adam for sparse gradients (torch's SparseAdam): moments of a row are updated only
    in the steps that use it. For embedding tables with sparse row gradients."""

    torch_class: ClassVar[str] = "SparseAdam"
    kind: Literal["sparse_adam"] = "sparse_adam"
    lr: float = Field(1e-3, gt=0, description="Learning rate (peak, after warm-up).")
    eps: float = Field(1e-8, gt=0, description="Term added to the denominator.")


OptimizerConfig = Annotated[
    SGDConfig | AdamConfig | AdamWConfig | AdagradConfig | SparseAdamConfig,
    Field(discriminator="kind"),
]


class PlateauConfig(ConfigModel):
    """Multiply the learning rate by `factor` when the task's validation metric stops improving
    (torch's ReduceLROnPlateau, as LibKGE uses it), down to min_lr_ratio * lr."""

    factor: float = Field(0.5, gt=0, lt=1, description="Multiplies the learning rate at a plateau.")
    patience: int = Field(
        5,
        ge=0,
        description="Evaluations without improvement tolerated; the next one lowers the rate.",
    )
    threshold: float = Field(
        1e-4,
        ge=0,
        description="Relative improvement that counts: better than best * (1 + threshold) "
        "(max metrics) or best * (1 - threshold) (min metrics).",
    )
    cooldown: int = Field(
        0, ge=0, description="Evaluations after a reduction before patience counts again."
    )


class TrainConfig(ConfigModel):
    """How the model is optimized. `batch_size` is global: the same problem at any world size."""

    epochs: int | None = Field(
        None, ge=1, description="Passes over the training data.", json_schema_extra=RESUME_SAFE
    )
    max_steps: int | None = Field(
        None,
        ge=1,
        description="Optimizer steps to take; with `epochs`, whichever comes first.",
        json_schema_extra=RESUME_SAFE,
    )
    batch_size: int = Field(
        ...,
        ge=1,
        description="Global batch size: samples per optimizer step summed over all workers.",
    )
    micro_batches: int = Field(
        1,
        ge=1,
        description="Split each step's batch into this many micro-batches and accumulate "
        "their gradients; workers communicate only after the last one.",
    )
    eval_batch_size: int | None = Field(
        None,
        ge=1,
        description="Batch size for evaluation (default: batch_size).",
        json_schema_extra=RESUME_SAFE,
    )
    shuffle: bool = Field(True, description="Shuffle the training data every epoch (seeded).")
    drop_last: bool = Field(
        False, description="Drop the last, smaller batch of each epoch instead of training on it."
    )
    optimizer: OptimizerConfig = Field(
        default_factory=SGDConfig,
        description="Optimizer: kind = sgd (the default) | adam | adamw | adagrad | sparse_adam.",
    )
    warmup_steps: int = Field(
        0, ge=0, description="Linear learning-rate warm-up from 0 over this many steps."
    )
    lr_decay: Literal["constant", "linear", "cosine", "plateau"] = Field(
        "constant",
        description="Learning-rate decay after warm-up, down to min_lr_ratio * lr: constant, "
        "linear, cosine (by step), or plateau (by the validation metric, see `plateau`).",
    )
    plateau: PlateauConfig = Field(
        default_factory=PlateauConfig,
        description="lr_decay = plateau: factor, patience, threshold, cooldown (read only then).",
    )
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="Final learning rate of a decay, as a fraction of lr."
    )
    grad_clip_norm: float | None = Field(
        None, gt=0, description="Clip gradients to this global L2 norm (over all workers)."
    )
    eval_every_epochs: int = Field(
        1,
        ge=0,
        description="Evaluate on the held-out split every N epochs (0: only at the end).",
        json_schema_extra=RESUME_SAFE,
    )
    early_stopping_patience: int | None = Field(
        None,
        ge=1,
        description="Stop when this many evaluations in a row have not improved the task's "
        "primary validation metric (unset: never stop early).",
        json_schema_extra=RESUME_SAFE,
    )
    early_stopping_min_delta: float = Field(
        0.0,
        ge=0,
        description="Smallest change of the metric that counts as an improvement.",
        json_schema_extra=RESUME_SAFE,
    )
    seed: int = Field(0, ge=0, description="Seed for model initialization, shuffling and dropout.")
    mixed_precision: Literal["off", "bf16", "fp16"] = Field(
        "off",
        description="Run forward and loss under autocast: bf16 (CPU or CUDA), or fp16 with a "
        "dynamic loss scale (needs on_nonfinite = skip_step); parameters, gradients and the "
        "optimizer stay float32.",
    )
    on_nonfinite: Literal["halt", "skip_step"] = Field(
        "halt",
        description="When any worker's gradient holds NaN or Inf: halt every worker before the "
        "optimizer step (exit code 3, naming rank, step and parameters), or skip_step: skip "
        "that update on every worker and count it.",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_kind(cls, data: Any) -> Any:
        return fill_default_tag(data, "optimizer", "kind", "sgd")

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        # "set epochs or max_steps" is checked by the root config: some strategies
        # (federated rounds) define the run's length themselves
        if self.mixed_precision == "fp16" and self.on_nonfinite == "halt":
            raise ValueError(
                'mixed_precision = "fp16" overflows now and then by design (the loss scale then '
                'backs off); set on_nonfinite = "skip_step"'
            )
        if self.lr_decay == "plateau" and self.eval_every_epochs == 0:
            raise ValueError(
                'lr_decay = "plateau" lowers the rate after evaluations; set eval_every_epochs >= 1'
            )
        if self.micro_batches > self.batch_size:
            raise ValueError(
                f"micro_batches ({self.micro_batches}) cannot exceed batch_size ({self.batch_size})"
            )
        return self
