"""Exploit and explore on their own: counts, direction, bounds, and reproducibility by seed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shoal.strategies.population.config import (
    BinaryConfig,
    Choice,
    LinearRange,
    LogRange,
    PerturbationConfig,
    ResampleConfig,
    TruncationConfig,
)
from shoal.strategies.population.operators import (
    EXPLOITS,
    EXPLORES,
    binary,
    fitness,
    perturbation,
    resample,
    stream,
    truncation,
)
from shoal.strategies.population.space import contains, sample_all

SPACE = {
    "lr": LogRange(low=1e-4, high=1.0),
    "momentum": LinearRange(low=0.0, high=0.99),
    "dropout": Choice(values=[0.0, 0.1, 0.2, 0.4]),
}


def _scores(n: int, seed: int) -> list[float]:
    return np.random.default_rng(seed).permutation(n).astype(float).tolist()


@pytest.mark.parametrize("n", [2, 3, 5, 8, 13])
@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5])
def test_truncation_replaces_exactly_the_bottom_with_top_members(n: int, fraction: float) -> None:
    scores = _scores(n, seed=n)
    count = math.ceil(fraction * n)
    ranked = sorted(range(n), key=lambda m: -scores[m])  # best first
    copies = truncation(fitness(scores, "max"), TruncationConfig(fraction=fraction), stream(0, n))
    assert sorted(c.loser for c in copies) == sorted(ranked[n - count :])
    assert all(c.winner in ranked[:count] for c in copies)
    assert len({c.loser for c in copies}) == len(copies) == count


def test_truncation_direction_follows_the_mode() -> None:
    scores = [0.5, 0.1, 0.9, 0.3]  # a loss: lower is better
    config = TruncationConfig(fraction=0.25)
    (copy,) = truncation(fitness(scores, "min"), config, stream(0))
    assert (copy.loser, copy.winner) == (2, 1)
    (copy,) = truncation(fitness(scores, "max"), config, stream(0))
    assert (copy.loser, copy.winner) == (1, 2)


def test_failed_members_are_always_replaced_from_good_ones() -> None:
    scores = [0.9, math.nan, 0.5, math.inf, 0.7, 0.6, 0.8, 0.4]  # inf: a diverged metric
    fit = fitness(scores, "max")
    for method, config in (
        ("truncation", TruncationConfig(fraction=0.125)),
        ("binary", BinaryConfig(threshold=10.0)),
    ):
        copies = EXPLOITS.load(method)(fit, config, stream(3))
        losers = {c.loser for c in copies}
        assert {1, 3} <= losers
        assert all(c.winner not in (1, 3) for c in copies)
    with pytest.raises(ValueError, match="every member failed"):
        truncation([math.nan, math.nan], TruncationConfig(), stream(0))


def test_binary_copies_only_clearly_better_members() -> None:
    scores = [float(m) for m in range(10)]  # member 9 best
    fit = fitness(scores, "max")
    for seed in range(20):
        copies = binary(fit, BinaryConfig(threshold=2.5), stream(seed))
        assert all(fit[c.winner] - fit[c.loser] > 2.5 for c in copies)
        assert all(c.loser not in (7, 8, 9) for c in copies)  # nobody is 2.5 better than them
        # with threshold 0 the worst member copies whomever it meets, the best never copies
        copies = binary(fit, BinaryConfig(threshold=0.0), stream(seed))
        assert 0 in {c.loser for c in copies} and 9 not in {c.loser for c in copies}
    assert binary(fit, BinaryConfig(threshold=100.0), stream(0)) == []
    # every pairing happens: over many seeds every worse member meets a better one
    met = {(c.loser, c.winner) for s in range(200) for c in binary(fit, BinaryConfig(), stream(s))}
    assert met == {(a, b) for a in range(10) for b in range(10) if b > a}


@pytest.mark.parametrize("method", EXPLOITS.names())
def test_exploit_is_reproducible_by_seed(method: str) -> None:
    config = TruncationConfig() if method == "truncation" else BinaryConfig()
    fit = fitness(_scores(12, seed=1), "max")
    runs = [EXPLOITS.load(method)(fit, config, stream(7, 2, g)) for g in (0, 0, 1)]
    assert runs[0] == runs[1]
    draws = {tuple(EXPLOITS.load(method)(fit, config, stream(s))) for s in range(10)}
    assert len(draws) > 1, "different seeds draw different winners"


def test_perturbation_scales_by_the_factor_and_stays_inside() -> None:
    config = PerturbationConfig(factor=0.2)
    rng = stream(0)
    for _ in range(500):
        hyper = sample_all(SPACE, rng)
        new = perturbation(hyper, SPACE, config, rng)
        for name, dist in SPACE.items():
            assert contains(dist, new[name]), (name, new[name])
        for name in ("lr", "momentum"):
            ratio = new[name] / hyper[name]
            dist = SPACE[name]
            assert isinstance(dist, LogRange | LinearRange)
            clipped = new[name] in (dist.low, dist.high)
            assert clipped or ratio == pytest.approx(0.8) or ratio == pytest.approx(1.2)
        values = SPACE["dropout"].values  # type: ignore[union-attr]
        step = abs(values.index(new["dropout"]) - values.index(hyper["dropout"]))
        assert step <= 1
    # pushed against a bound, perturbation clips to it
    top = perturbation({"lr": 1.0, "momentum": 0.99, "dropout": 0.4}, SPACE, config, stream(1))
    assert top["lr"] <= 1.0 and top["momentum"] <= 0.99


def test_resample_draws_from_the_search_space() -> None:
    start = {"lr": 0.5, "momentum": 0.5, "dropout": 0.2}
    draws = [
        resample(start, SPACE, ResampleConfig(probability=1.0), stream(s)) for s in range(2000)
    ]
    lrs = np.log10([d["lr"] for d in draws])
    assert lrs.min() >= -4 and lrs.max() <= 0
    assert np.median(lrs) == pytest.approx(-2, abs=0.15), "log-uniform over [1e-4, 1]"
    assert np.mean([d["momentum"] for d in draws]) == pytest.approx(0.495, abs=0.03)
    assert {d["dropout"] for d in draws} == set(SPACE["dropout"].values)  # type: ignore[union-attr]
    # with probability p a value is redrawn; otherwise kept (factor 0)
    kept = [
        resample(start, SPACE, ResampleConfig(probability=0.3, factor=0.0), stream(s))["lr"] == 0.5
        for s in range(2000)
    ]
    assert np.mean(kept) == pytest.approx(0.7, abs=0.04)


@pytest.mark.parametrize("method", EXPLORES.names())
def test_explore_is_reproducible_by_seed(method: str) -> None:
    config = PerturbationConfig() if method == "perturbation" else ResampleConfig(probability=0.5)
    hyper = {"lr": 0.01, "momentum": 0.5, "dropout": 0.1}
    first = EXPLORES.load(method)(hyper, SPACE, config, stream(5, 3, 1, 2))
    again = EXPLORES.load(method)(hyper, SPACE, config, stream(5, 3, 1, 2))
    assert first == again
    assert all(contains(SPACE[n], v) for n, v in first.items())
