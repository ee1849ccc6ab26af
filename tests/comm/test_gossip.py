"""Gossip: topologies, mixing weights, and consensus at the rate the spectral gap predicts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from shoal.comm.gossip import GossipSync
from shoal.comm.links import CommGroup
from shoal.comm.topology import check_adjacency, metropolis_hastings, neighbours, torus_shape
from shoal.errors import ShoalError
from shoal.shape.hosts import Hosts
from tests.comm.group import TIMEOUT_S, run_in_group


def mixing_matrix(adjacency: list[list[int]]) -> np.ndarray:
    rows = metropolis_hastings(adjacency)
    w = np.zeros((len(rows), len(rows)))
    for i, row in enumerate(rows):
        for j, weight in row.items():
            w[i, j] = weight
    return w


@pytest.mark.parametrize("topology", ["ring", "torus", "exponential"])
@pytest.mark.parametrize("world_size", range(1, 10))
def test_topologies_give_symmetric_doubly_stochastic_mixing(topology: str, world_size: int) -> None:
    adjacency = neighbours(topology, world_size)
    if world_size > 1:
        check_adjacency(adjacency)  # undirected, no self-loops, connected
    w = mixing_matrix(adjacency)
    np.testing.assert_allclose(w, w.T, atol=1e-15)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
    assert (w >= 0).all()
    if world_size > 2:  # the average is the only fixed point: the spectral gap is positive
        assert np.sort(np.abs(np.linalg.eigvalsh(w)))[-2] < 1 - 1e-9


def test_topology_shapes() -> None:
    assert neighbours("ring", 5)[0] == [1, 4]
    assert torus_shape(6) == (2, 3) and torus_shape(16) == (4, 4) and torus_shape(7) == (1, 7)
    assert neighbours("torus", 16)[5] == [1, 4, 6, 9]
    assert neighbours("exponential", 16)[0] == [1, 2, 4, 8, 12, 14, 15]
    assert neighbours([[1], [0]], 2) == [[1], [0]]
    with pytest.raises(ShoalError, match="has 2 entries but the job has 3 workers"):
        neighbours([[1], [0]], 3)


# (topology, world size): a slow ring, a torus, an exponential graph, a user's path graph;
# all run in one group of 6 processes, each on the first `world size` ranks
CASES = {
    "ring-5": ("ring", 5),
    "torus-6": ("torus", 6),
    "exponential-6": ("exponential", 6),
    "path-4": ([[1], [0, 2], [1, 3], [2]], 4),
}
CURVATURE_LR = 0.1  # lr * a for the quadratic f(x) = a/2 ||x||^2
STEPS = 12


def _start(rank: int) -> torch.Tensor:
    return torch.randn(16, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)


class _Point(nn.Module):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.x = nn.Parameter(_start(rank))


def _run_gossip(rank: int, world_size: int, out: str) -> None:
    """D-PSGD on a quadratic shared by all ranks, from different starting points."""
    found = {}
    for case, (topology, size) in sorted(CASES.items()):
        group = dist.new_group(list(range(size)))  # every process takes part in creating it
        if rank >= size:
            continue
        model = _Point(rank)
        links = CommGroup(rank, size, Hosts.single(size), TIMEOUT_S, group if size > 1 else None)
        sync = GossipSync(model, links, neighbours(topology, size))  # type: ignore[arg-type]
        optimizer = torch.optim.SGD(model.parameters(), lr=CURVATURE_LR)
        distances = [sync.consensus_distance()]
        for _ in range(STEPS):
            sync.zero_grad()
            sync.begin_step()
            # the loss a trainer would hand it: a share 1/n of the (identical) objective
            (0.5 * model.x.square().sum() / size).backward()
            sync.finish()
            optimizer.step()
            distances.append(sync.consensus_distance())
        found[case] = distances
    if rank == 0:
        Path(out).write_text(json.dumps(found))


def _predicted(topology: object, size: int) -> np.ndarray:
    """The same iteration in numpy: X <- (W - lr a I) X, rows = ranks."""
    step = mixing_matrix(neighbours(topology, size)) - CURVATURE_LR * np.eye(size)  # type: ignore[arg-type]
    x = np.stack([_start(rank).numpy() for rank in range(size)])
    distances = []
    for _ in range(STEPS + 1):
        distances.append(np.sqrt(((x - x.mean(axis=0)) ** 2).sum() / size))
        x = step @ x
    return np.array(distances)


def test_consensus_distance_shrinks_at_the_spectral_rate(tmp_path: Path) -> None:
    """x <- W x - lr a x: the deviation from the mean contracts by
    rho = max |lambda_k(W) - lr a| over W's eigenvalues other than the 1 of the average:
    every step by at least that factor, asymptotically by exactly that factor; and the
    logged distances are the ones the linear iteration predicts."""
    out = tmp_path / "distances.json"
    run_in_group(max(size for _, size in CASES.values()), _run_gossip, tmp_path, str(out))
    found = json.loads(out.read_text())
    for case, (topology, size) in CASES.items():
        distances = np.array(found[case])
        np.testing.assert_allclose(distances, _predicted(topology, size), rtol=1e-9, err_msg=case)
        eigenvalues = np.sort(np.linalg.eigvalsh(mixing_matrix(neighbours(topology, size))))  # type: ignore[arg-type]
        rho = np.abs(eigenvalues[:-1] - CURVATURE_LR).max()  # eigenvalues[-1] == 1: the mean
        ratios = distances[1:] / distances[:-1]
        assert distances[0] > 0.5, f"{case}: replicas start apart"
        assert (ratios <= rho * (1 + 1e-9)).all(), (case, ratios, rho)
        tail = (distances[-1] / distances[-5]) ** (1 / 4)
        assert tail == pytest.approx(rho, rel=0.05), (case, tail, rho)
