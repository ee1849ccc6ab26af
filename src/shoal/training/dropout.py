"""Dropout masks that follow the samples, not their place in a rank's share of the batch.

torch's dropout draws its mask from the process's generator, element after
element of the batch it is given. So the mask a sample gets depends on which
rank computes it and at which row of that rank's slice: under data_parallel's
dynamic balance, where slices grow and shrink with the ranks' speeds, the same
job trained a different model than under a static split (the demo's MLP with
dropout 0.1 ended 1 % apart in training loss; with dropout 0 they agree to 1e-4).

Here a mask element is a function of the job's seed, the step, the sample's
index in the dataset, the layer and the element's position, through a
counter-based hash (splitmix64, computed in int64 tensor arithmetic that wraps as
unsigned arithmetic does): whichever rank, micro-batch or row computes a sample,
it gets the same mask, so every split of a global batch (local, data_parallel
static or dynamic, any micro-batch count) trains the same model. Each element is
kept with probability 1 - p (24 random bits) and scaled by 1 / (1 - p), as torch's
dropout does.

The step loop's `Learner` installs it on every plain `nn.Dropout` of its model and
names the rows of each micro-batch (`SampleKeys`); a call it cannot key (evaluation,
a learner that names no step, a tensor whose rows are not the batch's samples, a
DTensor) is torch's own dropout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def splitmix64(value: int) -> int:
    """The reference (Python integers): Steele, Lea and Flood's SplitMix64 finaliser."""
    z = (value + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def _shift(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def splitmix64_tensor(z: torch.Tensor) -> torch.Tensor:
    """`splitmix64` of each int64 element (bit for bit the reference's, as signed)."""
    z = z + _signed(_GOLDEN)
    z = (z ^ _shift(z, 30)) * _signed(_MIX1)
    z = (z ^ _shift(z, 27)) * _signed(_MIX2)
    return z ^ _shift(z, 31)


def uniforms(seed: int, step: int, layer: int, rows: torch.Tensor, width: int) -> torch.Tensor:
    """[len(rows), width] numbers in [0, 1), a function of (seed, step, layer, row, column)."""
    base = splitmix64(splitmix64(splitmix64(seed) ^ step) ^ layer)
    keyed = splitmix64_tensor(rows.to(torch.int64) ^ _signed(base))
    columns = torch.arange(width, dtype=torch.int64, device=rows.device) * _signed(_GOLDEN)
    bits = _shift(splitmix64_tensor(keyed[:, None] ^ columns[None, :]), 40)
    return bits.to(torch.float32) * (1.0 / (1 << 24))


@dataclass
class SampleKeys:
    """What the running micro-batch is: the job's seed, the step, its samples' indices."""

    seed: int
    step: int | None = None
    rows: torch.Tensor | None = None


class SampleDropout(nn.Dropout):
    """`nn.Dropout` whose mask follows the samples (see the module); installed by
    `key_dropout`, which gives it the shared `SampleKeys` and its layer number."""

    keys: SampleKeys
    layer: int

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        keys = self.keys
        rows = keys.rows
        if (
            not self.training
            or self.p == 0
            or keys.step is None
            or rows is None
            or type(input) is not torch.Tensor  # a DTensor: laid out over ranks
            or input.dim() == 0
            or input.shape[0] != len(rows)
        ):
            return super().forward(input)
        width = input[0].numel()
        keep = uniforms(keys.seed, keys.step, self.layer, rows.to(input.device), width) >= self.p
        return input * keep.view_as(input).to(input.dtype) * (1.0 / (1.0 - self.p))


def key_dropout(model: nn.Module, seed: int) -> SampleKeys | None:
    """Make every plain `nn.Dropout` of `model` a SampleDropout sharing one SampleKeys
    (returned; None when the model has none)."""
    keys = SampleKeys(seed)
    layers = [m for m in model.modules() if type(m) in (nn.Dropout, SampleDropout)]
    for layer, module in enumerate(layers):
        module.__class__ = SampleDropout
        assert isinstance(module, SampleDropout)
        module.keys, module.layer = keys, layer
    return keys if layers else None
