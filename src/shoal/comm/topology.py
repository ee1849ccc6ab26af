"""Gossip topologies and their Metropolis-Hastings mixing weights.

A topology says which ranks average parameters with which. Its mixing matrix W
(w_ij > 0 only between neighbours) must be symmetric and doubly stochastic so
that gossip preserves the average and converges to it; the Metropolis-Hastings
rule (Xiao & Boyd, 2004) gives such weights from degrees alone, which every
rank knows:

    w_ij = 1 / (1 + max(d_i, d_j))   for each neighbour j,   w_ii = 1 - sum_j w_ij.

The deviation from the average shrinks by the second-largest eigenvalue modulus
of W each round: the larger the spectral gap, the faster the consensus. A ring
mixes slowly (gap ~ 1/n^2), a 2-D torus faster, the exponential graph
(neighbours at distance 2^k, Ying et al. 2021) almost like a complete graph
with only 2 log2(n) neighbours.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from shoal.errors import ShoalError

Topology = str | Sequence[Sequence[int]]


def check_adjacency(adjacency: Sequence[Sequence[int]]) -> None:
    """An undirected, connected graph without self-loops; raises ValueError saying what is wrong."""
    n = len(adjacency)
    if n == 0:
        raise ValueError("an adjacency list needs one list of neighbours per rank; got none")
    for i, row in enumerate(adjacency):
        for j in row:
            if not 0 <= j < n:
                raise ValueError(f"rank {i} lists neighbour {j}, but ranks are 0..{n - 1}")
            if j == i:
                raise ValueError(f"rank {i} lists itself as a neighbour; remove it")
            if i not in adjacency[j]:
                raise ValueError(
                    f"rank {i} lists {j} but rank {j} does not list {i}: gossip links are "
                    "two-way; add it"
                )
        if len(set(row)) != len(row):
            raise ValueError(f"rank {i} lists a neighbour twice")
    seen, frontier = {0}, [0]
    while frontier:
        for j in adjacency[frontier.pop()]:
            if j not in seen:
                seen.add(j)
                frontier.append(j)
    if len(seen) != n:
        missing = sorted(set(range(n)) - seen)
        raise ValueError(
            f"the graph is not connected (ranks {missing} cannot reach rank 0): its ranks "
            "would never agree"
        )


def torus_shape(world_size: int) -> tuple[int, int]:
    """(rows, columns) of the squarest grid with world_size cells (1 x n for a prime n)."""
    rows = max(d for d in range(1, math.isqrt(world_size) + 1) if world_size % d == 0)
    return rows, world_size // rows


def neighbours(topology: Topology, world_size: int) -> list[list[int]]:
    """Each rank's neighbours, sorted."""
    n = world_size
    if not isinstance(topology, str):
        if len(topology) != n:
            raise ShoalError(
                f"strategy.aggregation.topology: the adjacency list has {len(topology)} entries "
                f"but the job has {n} workers; give one list of neighbours per rank"
            )
        return [sorted(row) for row in topology]
    found: list[set[int]] = [set() for _ in range(n)]
    for i in range(n):
        if topology == "ring":
            found[i] |= {(i - 1) % n, (i + 1) % n}
        elif topology == "torus":
            rows, cols = torus_shape(n)
            r, c = divmod(i, cols)
            found[i] |= {
                ((r - 1) % rows) * cols + c,
                ((r + 1) % rows) * cols + c,
                r * cols + (c - 1) % cols,
                r * cols + (c + 1) % cols,
            }
        elif topology == "exponential":
            hop = 1
            while hop < n:
                found[i] |= {(i - hop) % n, (i + hop) % n}
                hop *= 2
        else:
            raise ShoalError(
                f"strategy.aggregation.topology: unknown {topology!r}; choose ring, torus, "
                "exponential or an adjacency list"
            )
        found[i].discard(i)
    return [sorted(row) for row in found]


def metropolis_hastings(adjacency: Sequence[Sequence[int]]) -> list[dict[int, float]]:
    """Row i of the mixing matrix as {rank: weight}, the rank itself included."""
    degree = [len(row) for row in adjacency]
    rows = []
    for i, row in enumerate(adjacency):
        weights = {j: 1.0 / (1 + max(degree[i], degree[j])) for j in row}
        weights[i] = 1.0 - sum(weights.values())
        rows.append(weights)
    return rows
