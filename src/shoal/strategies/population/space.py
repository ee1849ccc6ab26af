"""Drawing, perturbing and checking hyperparameter values of a search space.

Every function is pure: the random draws come from the numpy Generator passed
in, so a population is reproducible from its seed, and every rank, drawing from
identically seeded generators, computes the same values without talking.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from shoal.strategies.population.config import Choice, Distribution, LinearRange, LogRange

Hyperparameters = dict[str, float]


def sample(dist: Distribution, rng: np.random.Generator) -> float:
    """One value drawn from `dist`: log-uniform, uniform, or a uniformly chosen value."""
    if isinstance(dist, LogRange):
        return float(math.exp(rng.uniform(math.log(dist.low), math.log(dist.high))))
    if isinstance(dist, LinearRange):
        return float(rng.uniform(dist.low, dist.high))
    return float(dist.values[int(rng.integers(len(dist.values)))])


def perturb(dist: Distribution, value: float, factor: float, rng: np.random.Generator) -> float:
    """`value` times 1 - factor or 1 + factor (PBT's "perturb"), kept inside the range.

    A choice moves to the previous or next value of its list instead (staying at
    an end of the list when it would leave it). A value of 0 in a range cannot be
    scaled away from 0, so it moves by `factor` of the range's width instead.
    """
    up = bool(rng.integers(2))
    if isinstance(dist, Choice):
        index = _nearest_index(dist.values, value) + (1 if up else -1)
        return float(dist.values[min(max(index, 0), len(dist.values) - 1)])
    if value == 0.0:
        moved = factor * (dist.high - dist.low) * (1 if up else -1)
    else:
        moved = value * ((1 + factor) if up else (1 - factor)) - value
    return clip(dist, value + moved)


def clip(dist: LogRange | LinearRange, value: float) -> float:
    return float(min(max(value, dist.low), dist.high))


def contains(dist: Distribution, value: float) -> bool:
    """True when `value` is a value `dist` can produce."""
    if isinstance(dist, Choice):
        return value in dist.values
    return dist.low <= value <= dist.high


def sample_all(space: Mapping[str, Distribution], rng: np.random.Generator) -> Hyperparameters:
    """A value for every hyperparameter of the space, in the order of the names."""
    return {name: sample(space[name], rng) for name in sorted(space)}


def sample_population(
    space: Mapping[str, Distribution], size: int, rng: np.random.Generator
) -> list[Hyperparameters]:
    """`size` members' starting values, spread over the space (Latin hypercube sampling).

    Drawn independently, a small population can start all in one corner: seed 0 put
    four members' learning rates between 0.05 and 0.061 on a log range of 1e-3 to 0.1, and
    the population then only searches there. Instead each hyperparameter's range (in
    the scale it is sampled in: log for a log range) is cut into `size` equal strata,
    every stratum gets exactly one member (a random permutation per hyperparameter,
    so the dimensions are not tied together), and the member's value is drawn
    uniformly inside its stratum. A choice is the same with its values as the range:
    the members spread over the values as evenly as their number allows.
    """
    columns: dict[str, list[float]] = {}
    for name in sorted(space):
        strata = (rng.permutation(size) + rng.random(size)) / size  # one point per stratum
        columns[name] = [_at(space[name], float(u)) for u in strata]
    return [{name: columns[name][m] for name in columns} for m in range(size)]


def _at(dist: Distribution, u: float) -> float:
    """The value at quantile `u` in [0, 1) of `dist`'s sampling scale."""
    if isinstance(dist, LogRange):
        low, high = math.log(dist.low), math.log(dist.high)
        return float(math.exp(low + u * (high - low)))
    if isinstance(dist, LinearRange):
        return float(dist.low + u * (dist.high - dist.low))
    return float(dist.values[min(int(u * len(dist.values)), len(dist.values) - 1)])


def _nearest_index(values: list[float], value: float) -> int:
    return min(range(len(values)), key=lambda i: abs(values[i] - value))
