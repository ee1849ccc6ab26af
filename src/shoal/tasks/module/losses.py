"""The losses a module task names, each a *sum* over the batch's samples (the contract of
`protocols/task.py`), and how a batch is read for them.

- `cross_entropy`: a batch `(inputs, labels)` (or a dict with `labels`); logits over
  classes; the sum of per-sample losses; `accuracy` reported.
- `mse`: a batch `(inputs, targets)`; each sample's mean squared error, summed.
- `causal_lm`: a batch of token ids (a tensor, or a dict with `input_ids` and perhaps
  `attention_mask`); the model returns logits (or an object with `.logits`); each
  sample's mean cross-entropy over its next-token targets (inputs shifted by one,
  padding left out), summed over samples: the objective is the mean loss per
  sequence's token, whatever the split of the batch.
- a function `loss(model, batch) -> (summed_loss, count)`: the user's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from shoal.errors import ShoalError

Loss = Callable[[nn.Module, Any], tuple[torch.Tensor, int, dict[str, torch.Tensor]]]


def logits_of(output: Any) -> torch.Tensor:
    """A model's logits: the tensor it returned, or its output's `.logits`."""
    logits = getattr(output, "logits", output)
    if isinstance(output, tuple | list) and not isinstance(logits, torch.Tensor):
        logits = output[0]
    if not isinstance(logits, torch.Tensor):
        raise ShoalError(
            f"the model returned a {type(output).__name__}; the task's loss needs logits (a "
            "tensor, or an output with .logits)"
        )
    return logits


def _split(batch: Any, target_key: str) -> tuple[Any, torch.Tensor]:
    """(model input, target) of a batch: a pair, or a dict whose `target_key` is the target."""
    if isinstance(batch, dict):
        inputs = {k: v for k, v in batch.items() if k != target_key}
        if target_key not in batch:
            raise ShoalError(
                f"a batch dict needs {target_key!r} for this loss, got {sorted(batch)}"
            )
        return inputs, batch[target_key]
    if isinstance(batch, tuple | list) and len(batch) == 2:
        return batch[0], batch[1]
    raise ShoalError(
        f"a batch of this loss is (inputs, {target_key}) or a dict with {target_key!r}, got "
        f"{type(batch).__name__}"
    )


def _call(model: nn.Module, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, dict) else model(inputs)


def cross_entropy(model: nn.Module, batch: Any) -> tuple[torch.Tensor, int, dict[str, Any]]:
    inputs, labels = _split(batch, "labels")
    logits = logits_of(_call(model, inputs))
    loss = F.cross_entropy(logits, labels, reduction="sum")
    correct = (logits.detach().argmax(dim=-1) == labels).sum()
    return loss, int(labels.shape[0]), {"accuracy": correct}


def mse(model: nn.Module, batch: Any) -> tuple[torch.Tensor, int, dict[str, Any]]:
    inputs, targets = _split(batch, "labels")
    prediction = logits_of(_call(model, inputs))
    errors = (prediction.reshape(targets.shape) - targets).pow(2)
    per_sample = errors.reshape(targets.shape[0], -1).mean(dim=1)
    return per_sample.sum(), int(targets.shape[0]), {}


def causal_lm_targets(batch: Any) -> tuple[Any, torch.Tensor, torch.Tensor | None]:
    """(model input, token ids, attention mask or None) of a causal-LM batch."""
    if isinstance(batch, dict):
        if "input_ids" not in batch:
            raise ShoalError(f"a causal_lm batch dict needs 'input_ids', got {sorted(batch)}")
        return batch, batch["input_ids"], batch.get("attention_mask")
    if isinstance(batch, torch.Tensor):
        return batch, batch, None
    raise ShoalError(
        f"a causal_lm batch is a tensor of token ids or a dict with 'input_ids', got "
        f"{type(batch).__name__}"
    )


def causal_lm_sum(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor | None) -> Any:
    """The sum over sequences of each one's mean next-token loss (targets: ids shifted)."""
    predictions, targets = logits[:, :-1].float(), ids[:, 1:]
    per_token = F.cross_entropy(
        predictions.reshape(-1, predictions.shape[-1]), targets.reshape(-1), reduction="none"
    ).reshape(targets.shape)
    weights = torch.ones_like(per_token) if mask is None else mask[:, 1:].to(per_token.dtype)
    counted = weights.sum(dim=1).clamp(min=1.0)
    return ((per_token * weights).sum(dim=1) / counted).sum()


def causal_lm(model: nn.Module, batch: Any) -> tuple[torch.Tensor, int, dict[str, Any]]:
    inputs, ids, mask = causal_lm_targets(batch)
    logits = logits_of(_call(model, inputs))
    return causal_lm_sum(logits, ids, mask), int(ids.shape[0]), {}


LOSSES: dict[str, Loss] = {
    "cross_entropy": cross_entropy,
    "mse": mse,
    "causal_lm": causal_lm,
}


def user_loss(function: Callable[[nn.Module, Any], Any], where: str) -> Loss:
    """The user's `loss(model, batch) -> (summed_loss, count)`, its result checked."""

    def loss(model: nn.Module, batch: Any) -> tuple[torch.Tensor, int, dict[str, Any]]:
        out = function(model, batch)
        if not (isinstance(out, tuple | list) and len(out) == 2):
            raise ShoalError(
                f"{where}: the loss returned a {type(out).__name__}; return (summed_loss, count)"
            )
        total, count = out
        if not isinstance(total, torch.Tensor) or total.dim() != 0:
            shape = tuple(total.shape) if isinstance(total, torch.Tensor) else type(total).__name__
            raise ShoalError(
                f"{where}: the loss returned a summed_loss of shape {shape}; return a scalar "
                "tensor (the sum over the batch's samples) and the sample count"
            )
        return total, int(count), {}

    return loss
