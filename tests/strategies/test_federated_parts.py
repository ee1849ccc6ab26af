"""The federated strategy's parts on their own: server steps, selection, partitions, privacy.

Each family (aggregation methods, selection methods, partition kinds) has one
parametrized test of the contract every member keeps, plus the hand-computed and
statistical checks that pin the maths down.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from shoal.config import load_config
from shoal.strategies.federated import privacy, secure
from shoal.strategies.federated.aggregation import AGGREGATIONS, ProximalGradientSync
from shoal.strategies.federated.config import FederatedStrategyConfig
from shoal.strategies.federated.partition import PARTITIONS, dirichlet_shards, iid_shards
from shoal.strategies.federated.selection import SELECTIONS, select_clients


def _strategy(**fields: Any) -> FederatedStrategyConfig:
    config = load_config(
        {
            "task": {"type": "classification"},
            "train": {"batch_size": 8},
            "strategy": {"type": "federated", "num_clients": 10, "workers": 1, **fields},
        }
    )
    assert isinstance(config.strategy, FederatedStrategyConfig)
    return config.strategy


# ---------------------------------------------------------------- aggregation


@pytest.mark.parametrize("method", AGGREGATIONS.names())
def test_every_server_step_keeps_the_contract(method: str) -> None:
    """A fresh server: a zero update leaves x alone; any update moves x in its direction."""
    config = _strategy(aggregation={"method": method}).aggregation
    x = torch.tensor([1.0, -2.0, 0.5, 3.0])
    still = AGGREGATIONS.load(method)(config, 4)
    unchanged = x.clone()
    still.server_step(unchanged, torch.zeros(4))
    assert torch.equal(unchanged, x)
    delta = torch.tensor([0.1, -0.2, 0.0, 1e-3])
    moving = AGGREGATIONS.load(method)(config, 4)
    moved = x.clone()
    moving.server_step(moved, delta)
    assert torch.equal(torch.sign(moved - x), torch.sign(delta))
    restored = AGGREGATIONS.load(method)(config, 4)
    restored.load_state_dict(moving.state_dict())
    a, b = moved.clone(), moved.clone()
    moving.server_step(a, delta)
    restored.server_step(b, delta)
    assert torch.equal(a, b), "state_dict holds the whole server state"


def _yogi_by_hand() -> list[list[float]]:
    """Two FedYogi steps written out with Python floats, straight from Reddi et al.'s Algorithm 2."""
    eta, beta1, beta2, tau = 0.01, 0.9, 0.99, 1e-3
    x, m, v = [1.0, -2.0], [0.0, 0.0], [tau**2, tau**2]
    steps = []
    for delta in ([0.1, -0.2], [0.3, 0.05]):
        for k in range(2):
            m[k] = beta1 * m[k] + (1 - beta1) * delta[k]
            d2 = delta[k] ** 2
            v[k] = v[k] - (1 - beta2) * d2 * math.copysign(1.0, v[k] - d2)
            x[k] = x[k] + eta * m[k] / (math.sqrt(v[k]) + tau)
        steps.append(list(x))
    return steps


def test_fedyogi_server_step_matches_a_hand_computed_example() -> None:
    # step 1: m = 0.1 * delta = [0.01, -0.02]; v = 1e-6 + 0.01 * delta^2 = [1.01e-4, 4.01e-4];
    # x = x + 0.01 * m / (sqrt(v) + 1e-3) = [1 + 1e-4 / 0.0110499, -2 - 2e-4 / 0.0210250]
    assert _yogi_by_hand()[0] == pytest.approx([1.0090498, -2.0095125], abs=1e-7)
    config = _strategy(
        aggregation={
            "method": "fedyogi",
            "server_lr": 0.01,
            "beta1": 0.9,
            "beta2": 0.99,
            "tau": 1e-3,
        }
    ).aggregation
    yogi = AGGREGATIONS.load("fedyogi")(config, 2)
    x = torch.tensor([1.0, -2.0])
    for delta, expected in zip(([0.1, -0.2], [0.3, 0.05]), _yogi_by_hand(), strict=True):
        yogi.server_step(x, torch.tensor(delta))
        torch.testing.assert_close(x, torch.tensor(expected), rtol=0, atol=1e-6)


def test_fedadam_and_fedadagrad_differ_from_fedyogi_only_in_v() -> None:
    delta = torch.tensor([0.1, -0.2])
    d2 = delta * delta
    tau2 = 1e-6
    expected_v = {
        "fedadagrad": tau2 + d2,
        "fedadam": 0.99 * tau2 + 0.01 * d2,
        "fedyogi": tau2 + 0.01 * d2,  # v < delta^2, so Yogi adds (1 - beta2) * delta^2
    }
    for method, v in expected_v.items():
        server = AGGREGATIONS.load(method)(_strategy(aggregation={"method": method}).aggregation, 2)
        server.server_step(torch.zeros(2), delta)
        torch.testing.assert_close(server.v, v, rtol=1e-6, atol=1e-12, msg=method)


def test_fedprox_adds_the_gradient_of_the_proximal_term() -> None:
    model = torch.nn.Linear(2, 1, bias=False)
    anchor = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        model.weight.add_(torch.tensor([[1.0, -2.0]]))
    sync = ProximalGradientSync(model, anchor, mu=0.5)
    model.weight.grad = torch.tensor([[0.1, 0.1]])
    sync.finish()
    torch.testing.assert_close(model.weight.grad, torch.tensor([[0.6, -0.9]]))


# ---------------------------------------------------------------- selection


@pytest.mark.parametrize("method", SELECTIONS.names())
def test_every_selection_keeps_the_contract(method: str) -> None:
    """Sorted distinct client ids in range, the same for the same (seed, round)."""
    fields = {
        "all": {"method": "all"},
        "random": {"method": "random", "fraction": 0.3},
        "by_capability": {"method": "by_capability", "required_tags": ["gpu"]},
    }[method]
    config = _strategy(client_selection=fields, client_tags={"gpu": [1, 4, 7]})
    for rnd in range(5):
        picked = select_clients(config, 3, rnd)
        assert picked == sorted(set(picked))
        assert all(0 <= c < config.num_clients for c in picked)
        assert len(picked) >= config.min_clients
        assert select_clients(config, 3, rnd) == picked


def test_random_selection_picks_the_right_count_reproducibly() -> None:
    config = _strategy(client_selection={"method": "random", "fraction": 0.35})
    rounds = [select_clients(config, 7, rnd) for rnd in range(20)]
    assert all(len(picked) == 3 for picked in rounds)  # floor(0.35 * 10)
    assert rounds == [select_clients(config, 7, rnd) for rnd in range(20)]
    assert len({tuple(p) for p in rounds}) > 5, "different rounds pick different clients"
    assert rounds != [select_clients(config, 8, rnd) for rnd in range(20)], "the seed matters"
    floor = _strategy(client_selection={"method": "random", "fraction": 0.05, "min_clients": 2})
    assert len(select_clients(floor, 7, 0)) == 2


def test_by_capability_picks_only_tagged_clients() -> None:
    config = _strategy(
        client_selection={"method": "by_capability", "required_tags": ["gpu", "eu"]},
        client_tags={"gpu": [1, 2, 5, 8], "eu": [2, 3, 8, 9]},
    )
    assert select_clients(config, 0, 0) == [2, 8]


# ---------------------------------------------------------------- partitions


@pytest.mark.parametrize("kind", [k for k in PARTITIONS.names() if k != "files"])
def test_every_label_partition_is_disjoint_and_covers_the_data(kind: str) -> None:
    labels = np.random.default_rng(0).integers(0, 5, size=1000)
    if kind == "iid":
        shards = iid_shards(len(labels), 7, seed=1)
        again = iid_shards(len(labels), 7, seed=1)
    else:
        shards = dirichlet_shards(labels, 7, alpha=0.5, min_samples=10, seed=1)
        again = dirichlet_shards(labels, 7, alpha=0.5, min_samples=10, seed=1)
    joined = np.concatenate(shards)
    assert sorted(joined.tolist()) == list(range(len(labels)))
    assert all(np.array_equal(a, b) for a, b in zip(shards, again, strict=True))


def test_dirichlet_skews_labels_and_iid_does_not() -> None:
    labels = np.random.default_rng(0).integers(0, 10, size=5000)

    def dominant_share(shards: list[np.ndarray]) -> float:
        return float(np.mean([np.bincount(labels[s], minlength=10).max() / len(s) for s in shards]))

    iid = iid_shards(len(labels), 20, seed=0)
    assert max(len(s) for s in iid) - min(len(s) for s in iid) <= 1
    skewed = dirichlet_shards(labels, 20, alpha=0.1, min_samples=1, seed=0)
    assert dominant_share(iid) < 0.2 < 0.5 < dominant_share(skewed)
    assert min(len(s) for s in dirichlet_shards(labels, 20, 0.1, 50, 0)) >= 50


# ---------------------------------------------------------------- secure aggregation


def test_pairwise_masks_cancel_and_hide_each_update() -> None:
    clients = [0, 1, 2, 3]
    keys = {c: secure.KeyPair() for c in clients}
    seeds = {
        c: {p: keys[c].shared_seed(keys[p].public_bytes()) for p in clients if p != c}
        for c in clients
    }
    assert seeds[0][1] == seeds[1][0] != seeds[0][2], "each pair agrees on its own secret"
    generator = torch.Generator().manual_seed(0)
    updates = {c: torch.randn(50, generator=generator, dtype=torch.float64) for c in clients}
    reported = [0, 1, 3]  # client 2 dropped: the survivors mask among themselves
    masked = {c: secure.mask(c, secure.encode(updates[c]), seeds[c], reported, 5) for c in reported}
    plain_sum = sum(secure.encode(updates[c]) for c in reported)
    masked_sum = sum(masked.values())
    assert torch.equal(
        torch.remainder(masked_sum, secure.MODULUS), torch.remainder(plain_sum, secure.MODULUS)
    )
    torch.testing.assert_close(
        secure.decode(masked_sum), sum(updates[c] for c in reported), rtol=0, atol=1e-6
    )
    for c in reported:
        assert not torch.equal(masked[c], secure.encode(updates[c]))
        decoded = secure.decode(masked[c])
        assert (decoded - updates[c]).abs().min() > 1e-3, "no coordinate of a masked update leaks"
    other_round = secure.mask(0, secure.encode(updates[0]), seeds[0], reported, 6)
    assert not torch.equal(other_round, masked[0]), "fresh masks every round"


def test_fixed_point_encoding_round_trips_signed_values() -> None:
    values = torch.tensor([0.0, 1.5, -1.5, 1234.000001, -0.00000006], dtype=torch.float64)
    torch.testing.assert_close(secure.decode(secure.encode(values)), values, rtol=0, atol=2**-24)


# ---------------------------------------------------------------- differential privacy


def test_clipping_bounds_the_norm_and_noise_has_the_reported_scale() -> None:
    update = torch.tensor([3.0, 4.0], dtype=torch.float64)
    clipped, was = privacy.clip_update(update, 1.0)
    torch.testing.assert_close(clipped, torch.tensor([0.6, 0.8], dtype=torch.float64))
    assert was
    kept, was = privacy.clip_update(update, 10.0)
    assert torch.equal(kept, update) and not was
    # 4 clients' shares sum to noise of std sigma * C = 1.5 * 2 = 3
    total = sum(privacy.noise_share(200_000, 1.5, 2.0, 4) for _ in range(4))
    assert float(total.std()) == pytest.approx(3.0, rel=0.02)
    assert abs(float(total.mean())) < 0.05
