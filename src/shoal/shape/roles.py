"""Which rank does what: one object per job, computed once, validated once, logged once.

After PyTorch-BigGraph's `ProcessRanks` and torchtitan's `ParallelDims`. A
strategy computes its :class:`RankRoles` from its config (`Strategy.roles`);
`launch/job.py` validates it against the job's world size and rank 0 logs it
in one line. Every placement question is answered here: which ranks train
(`workers`), which serve (`servers`, server s on `servers[s]`), which rank
hosts which federated client or population member (`owner`, `hosted_by`).

Issue 12 extends it with mesh dimensions over the workers (data x pipeline x
tensor): `dims` names each dimension's size, their product is the number of
workers, and the groups of a dimension are derived here, once. `workers` lists
the rank at each point of the mesh (row-major): rank order on one host, laid out
by host across hosts (`runtime/placement.py`: tensor, then pipeline, inside a host).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from shoal.errors import ShoalError
from shoal.shape.hosts import Hosts
from shoal.shape.placement import INNER, dimension_groups, mesh_order, placement_report


@dataclass(frozen=True)
class RankRoles:
    world_size: int
    workers: tuple[int, ...]
    servers: tuple[int, ...] = ()
    #: what `items` counts ("client", "member"); items are dealt round-robin to the workers
    item: str = ""
    items: int = 0
    #: the config field that sets `items` when every worker must host one at least (a
    #: population's members time-share the workers); "" when a worker may host none
    items_field: str = ""
    #: sizes of the workers' mesh dimensions, e.g. {"data": 4}; their product is len(workers)
    dims: dict[str, int] = field(default_factory=dict)
    #: the worker index of each item when they are not dealt round-robin (a balanced
    #: placement, `placed`); empty: item m on worker m mod workers
    placement: tuple[int, ...] = ()
    #: the mesh's points were given to ranks by host (`mesh(..., hosts)`)
    by_host: bool = False

    # ------------------------------------------------------------ constructors
    @classmethod
    def replicas(cls, world_size: int) -> RankRoles:
        """Every rank trains (local, data_parallel)."""
        return cls(world_size, tuple(range(world_size)), dims={"data": world_size})

    @classmethod
    def mesh(cls, world_size: int, dims: dict[str, int], hosts: Hosts | None = None) -> RankRoles:
        """Every rank trains at a point of a mesh (tensor_parallel, fully_sharded, hybrid):
        `dims` in order, outermost first. Without `hosts` the rank at a point is the
        row-major index of its coordinates; with them the inner dimensions lie inside a
        host where they fit (`placement.mesh_order`)."""
        if hosts is None or hosts.world_size != world_size:
            return cls(world_size, tuple(range(world_size)), dims=dict(dims))
        order = tuple(mesh_order(hosts.groups, dims))
        return cls(world_size, order, dims=dict(dims), by_host=True)

    @classmethod
    def hosting(cls, world_size: int, item: str, items: int, items_field: str = "") -> RankRoles:
        """Every rank trains and hosts items m with m mod world_size == rank."""
        workers = tuple(range(world_size))
        return cls(world_size, workers, item=item, items=items, items_field=items_field)

    @classmethod
    def parameter_server(cls, workers: int, servers: list[int], dedicated: bool) -> RankRoles:
        """Ranks 0..W-1 train; server s runs on `servers[s]` (dedicated: ranks W..W+S-1;
        colocated: worker ranks, dealt over the hosts by the strategy's placement)."""
        world = workers + (len(servers) if dedicated else 0)
        return cls(world, tuple(range(workers)), tuple(servers), dims={"data": workers})

    # ------------------------------------------------------------ questions
    def is_worker(self, rank: int) -> bool:
        return rank in self.workers

    def server_of(self, rank: int) -> int | None:
        """The server rank `rank` runs (None: none)."""
        return self.servers.index(rank) if rank in self.servers else None

    def owner(self, item: int) -> int:
        """The worker rank that hosts item `item` (a client, a member)."""
        if self.placement:
            return self.workers[self.placement[item]]
        return self.workers[item % len(self.workers)]

    def placed(self, placement: list[int]) -> RankRoles:
        """These roles with item m on worker `placement[m]` (e.g. by `longest_first`)."""
        if len(placement) != self.items or not all(0 <= w < len(self.workers) for w in placement):
            workers = len(self.workers)
            raise ValueError(f"a placement of {self.items} {self.item}s on {workers}: {placement}")
        return replace(self, placement=tuple(placement))

    def coordinates(self, rank: int) -> dict[str, int]:
        """`rank`'s index along each mesh dimension (row-major: the last varies fastest),
        as torch's DeviceMesh lays out the same sizes."""
        index = self.workers.index(rank)
        coords: dict[str, int] = {}
        for name, size in reversed(self.dims.items()):
            coords[name] = index % size
            index //= size
        return {name: coords[name] for name in self.dims}

    def groups(self, dim: str) -> list[list[int]]:
        """The ranks of each group of mesh dimension `dim`, in coordinate order."""
        return dimension_groups(self.workers, self.dims, dim)

    def mesh_placement(self, hosts: Hosts) -> tuple[str, list[str], dict[str, Any]] | None:
        """For a mesh with a tensor or pipeline dimension: the log line saying which ranks
        form each group on which hosts, a warning when tensor groups span hosts, and the
        metrics.jsonl record (None: nothing is placed)."""
        if not any(name in self.dims for name in INNER) or hosts.world_size != self.world_size:
            return None
        return placement_report(self.workers, self.dims, hosts.host_of, hosts.names, self.by_host)

    def hosted_by(self, rank: int) -> list[int]:
        return [m for m in range(self.items) if self.owner(m) == rank]

    def role_of(self, rank: int) -> str:
        """One word for `shoal status`: worker, server, worker+server (colocated), idle."""
        here = (("worker", self.is_worker(rank)), ("server", rank in self.servers))
        names = [name for name, held in here if held]
        return "+".join(names) or "idle"

    # ------------------------------------------------------------ once per job
    def validate(self, world_size: int, where: str) -> None:
        """The job's processes are the ones these roles need; each has a role."""
        if world_size != self.world_size:
            raise ShoalError(
                f"{where}: the roles need {self.world_size} processes ({self.describe()}), "
                f"this job has {world_size}"
            )
        if self.items_field and self.items < len(self.workers):
            raise ShoalError(
                f"{self.items_field}: {self.items} {self.item}s cannot occupy "
                f"{len(self.workers)} workers; start at most {self.items} workers"
            )
        product = 1
        for size in self.dims.values():
            product *= size
        if self.dims and product != len(self.workers):
            raise ShoalError(
                f"{where}: mesh {self.dims} has {product} ranks, the job has "
                f"{len(self.workers)} workers"
            )

    def describe(self) -> str:
        """One line for rank 0's log."""
        parts = [f"{self.world_size} ranks", f"workers {_ranks(self.workers)}"]
        if self.servers:
            parts.append(f"servers {_ranks(self.servers)}")
        if self.items:
            hosts = "; ".join(f"rank {r}: {_ranks(tuple(self.hosted_by(r)))}" for r in self.workers)
            parts.append(f"{self.item}s by rank: {hosts}")
        if self.dims and (len(self.dims) > 1 or "data" not in self.dims):
            parts.append("mesh " + " x ".join(f"{k} {v}" for k, v in self.dims.items()))
        return ", ".join(parts)


def _ranks(ranks: tuple[int, ...]) -> str:
    if ranks and ranks == tuple(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks)) or "none"


def longest_first(costs: list[float], speeds: list[float]) -> list[int]:
    """Items placed on workers by longest processing time first (Graham's LPT rule).

    Items in decreasing cost (ties: lower index first) each go to the worker that would
    finish it soonest, (load + cost) / speed (ties: lower worker). A pure function of its
    arguments, so every rank computes the same placement. Returns each item's worker.
    """
    loads = [0.0] * len(speeds)
    placement = [0] * len(costs)
    for item in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        worker = min(range(len(speeds)), key=lambda w: ((loads[w] + costs[item]) / speeds[w], w))
        placement[item] = worker
        loads[worker] += costs[item]
    return placement
