"""Client-level differential privacy: clip every update, add Gaussian noise to their sum.

DP-FedAvg (McMahan et al., "Learning Differentially Private Recurrent Language
Models", ICLR 2018) with equal client weights:

    Delta = (sum_{i in R} clip(Delta_i, C) + N(0, (sigma * C)^2 I)) / |R|

clip(v, C) = v * min(1, C / ||v||). One client changes the sum by at most C, and
the noise's standard deviation is sigma * C (sigma: the noise multiplier). The
noise is added in shares: each reporting client adds N(0, (sigma * C)^2 / |R|),
so their sum has the full variance, also under secure aggregation (which sees
only noised updates) and whichever worker hosts whom. The noise comes from the
operating system's randomness: nobody, the aggregator included, can reproduce
and subtract it (so a run with noise is not bit-reproducible, by design).

This reports the noise multiplier; turning it into an (epsilon, delta) guarantee
needs a privacy accountant over the rounds and the sampling rate, which shoal
does not compute.
"""

from __future__ import annotations

import math
import secrets

import torch


def clip_update(update: torch.Tensor, clip_norm: float) -> tuple[torch.Tensor, bool]:
    """`update` scaled down to L2 norm <= clip_norm; and whether it was clipped."""
    norm = float(torch.linalg.vector_norm(update))
    if norm <= clip_norm:
        return update, False
    return update * (clip_norm / norm), True


def noise_share(
    size: int, noise_multiplier: float, clip_norm: float, reporters: int
) -> torch.Tensor:
    """One client's share of the Gaussian noise: N(0, (sigma * C)^2 / reporters)."""
    generator = torch.Generator().manual_seed(secrets.randbits(63))
    std = noise_multiplier * clip_norm / math.sqrt(reporters)
    return torch.randn(size, generator=generator, dtype=torch.float64) * std
