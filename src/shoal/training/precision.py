"""Mixed precision: autocast for the forward pass, and fp16's dynamic loss scale.

bf16 has float32's exponent range, so autocast alone is enough. fp16 has not:
small gradients underflow to zero in backward unless the loss is multiplied by
a large scale first (Micikevicius et al., 2018). The scale is dynamic, as in
torch.amp.GradScaler (same constants): halved on a step whose gradients
overflowed (that step is skipped), doubled after `growth_interval` good steps.
shoal keeps its own scale instead of GradScaler because overflow is detected
where it can be attributed, on each rank's local gradients before they are
combined (:mod:`shoal.training.nonfinite`), and because the gradient sync
unscales buckets before communication, so compression and its error feedback
work on true gradients whatever the scale does.
Parameters, gradients and optimizer state stay float32.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Any

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """The precision policy of one learner."""

    init_scale = 2.0**16
    growth_factor = 2.0
    backoff_factor = 0.5
    growth_interval = 2000

    def __init__(self, mode: str, device: torch.device) -> None:
        self.mode = mode
        self.device = device
        self.scale = self.init_scale if mode == "fp16" else 1.0
        self.good_steps = 0

    def autocast(self) -> AbstractContextManager[Any]:
        if self.mode == "off":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=DTYPES[self.mode])

    @property
    def loss_scale(self) -> float:
        return self.scale

    def update(self, overflowed: bool) -> None:
        """After a step: back off on overflow, grow after a run of good steps."""
        if self.mode != "fp16":
            return
        if overflowed:
            self.scale = max(self.scale * self.backoff_factor, 1.0)
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.good_steps = int(state["good_steps"])
