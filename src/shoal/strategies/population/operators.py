"""Exploit and explore: pure functions of (scores, hyperparameters, random generator).

Jaderberg et al., "Population Based Training of Neural Networks" (2017), section 3:
when a member is ready, *exploit* decides whether it abandons its weights for a
better member's, and *explore* changes the hyperparameters it copied.

Scores enter as *fitness*: higher is better (a `min` metric is negated), and NaN
marks a member whose training failed or diverged. A failed member is always
replaced, whatever the method, from a member that did not fail.

Every rank calls these with identical inputs and identically seeded generators,
so every rank reaches the same decisions without exchanging them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shoal.plugins.registry import closed_choice
from shoal.strategies.population.config import (
    BinaryConfig,
    Distribution,
    PerturbationConfig,
    ResampleConfig,
    TruncationConfig,
)
from shoal.strategies.population.space import Hyperparameters, perturb, sample

# independent random streams of one population, each a function of the seed alone
INIT_STREAM, EXPLOIT_STREAM, EXPLORE_STREAM, DATA_STREAM = 1, 2, 3, 4


def stream(seed: int, *keys: int) -> np.random.Generator:
    """The generator of one decision (e.g. explore, generation 3, member 5): fixed by the seed."""
    return np.random.default_rng([seed, *keys])


@dataclass(frozen=True)
class Copy:
    """`loser` abandons its weights, optimizer state and hyperparameters for `winner`'s."""

    loser: int
    winner: int


def fitness(scores: Sequence[float], mode: str) -> list[float]:
    """Scores turned into higher-is-better; a non-finite score (a failed member) becomes NaN."""
    sign = 1.0 if mode == "max" else -1.0
    return [sign * s if math.isfinite(s) else math.nan for s in scores]


def _failed(fit: Sequence[float]) -> list[int]:
    return [m for m, f in enumerate(fit) if math.isnan(f)]


def truncation(
    fit: Sequence[float], config: TruncationConfig, rng: np.random.Generator
) -> list[Copy]:
    """The worst ceil(fraction * N) members (and any failed one) copy members drawn from the best.

    Ties are broken by member index, so equal scores give reproducible decisions.
    """
    n = len(fit)
    count = math.ceil(config.fraction * n)
    failed = set(_failed(fit))
    good = sorted((m for m in range(n) if m not in failed), key=lambda m: (-fit[m], m))
    if not good:
        raise ValueError("every member failed: nothing to copy from")
    ranked = good + sorted(failed)  # best first, failed last
    losers = set(ranked[n - count :]) | failed
    top = [m for m in good[:count] if m not in losers] or good[:1]
    return [Copy(loser, top[int(rng.integers(len(top)))]) for loser in sorted(losers)]


def binary(fit: Sequence[float], config: BinaryConfig, rng: np.random.Generator) -> list[Copy]:
    """Each member meets one other drawn at random and copies it if worse by over `threshold`."""
    n = len(fit)
    good = [m for m in range(n) if not math.isnan(fit[m])]
    if not good:
        raise ValueError("every member failed: nothing to copy from")
    copies = []
    for member in range(n):
        if math.isnan(fit[member]):
            copies.append(Copy(member, good[int(rng.integers(len(good)))]))
            continue
        other = int(rng.integers(n - 1))
        other += other >= member  # uniform over the others
        if not math.isnan(fit[other]) and fit[other] - fit[member] > config.threshold:
            copies.append(Copy(member, other))
    return copies


def perturbation(
    hyper: Hyperparameters,
    space: Mapping[str, Distribution],
    config: PerturbationConfig,
    rng: np.random.Generator,
) -> Hyperparameters:
    """Every hyperparameter times 1 - factor or 1 + factor, kept inside the search space."""
    return {name: perturb(space[name], hyper[name], config.factor, rng) for name in sorted(hyper)}


def resample(
    hyper: Hyperparameters,
    space: Mapping[str, Distribution],
    config: ResampleConfig,
    rng: np.random.Generator,
) -> Hyperparameters:
    """Each hyperparameter redrawn from the space with `probability`, otherwise perturbed."""
    out = {}
    for name in sorted(hyper):
        redraw = rng.random() < config.probability
        if redraw:
            out[name] = sample(space[name], rng)
        elif config.factor > 0:
            out[name] = perturb(space[name], hyper[name], config.factor, rng)
        else:
            out[name] = hyper[name]
    return out


ExploitFn = Callable[[Sequence[float], Any, np.random.Generator], list[Copy]]
ExploreFn = Callable[
    [Hyperparameters, Mapping[str, Distribution], Any, np.random.Generator], Hyperparameters
]


EXPLOITS = closed_choice(
    "exploit method",
    "method",
    "shoal.strategies.population.operators",
    "shoal.strategies.population.config",
    {
        "truncation": ("truncation", "TruncationConfig"),
        "binary": ("binary", "BinaryConfig"),
    },
)
"""The exploit methods, by their config's `method`."""


EXPLORES = closed_choice(
    "explore method",
    "method",
    "shoal.strategies.population.operators",
    "shoal.strategies.population.config",
    {
        "perturbation": ("perturbation", "PerturbationConfig"),
        "resample": ("resample", "ResampleConfig"),
    },
)
"""The explore methods, by their config's `method`."""
