"""Rank roles: one object answers who trains, who serves and who hosts what (issue 11)."""

from __future__ import annotations

import math
import random

import pytest

from shoal.errors import ShoalError
from shoal.shape.hosts import Hosts
from shoal.shape.placement import dimension_groups, keeps_rank_order, mesh_order
from shoal.shape.roles import RankRoles


def test_parameter_server_placements() -> None:
    dedicated = RankRoles.parameter_server(workers=2, servers=[2, 3], dedicated=True)
    assert dedicated.world_size == 4 and dedicated.workers == (0, 1)
    assert [dedicated.server_of(r) for r in range(4)] == [None, None, 0, 1]
    assert not dedicated.is_worker(2)
    colocated = RankRoles.parameter_server(workers=3, servers=[0, 1], dedicated=False)
    assert colocated.world_size == 3 and colocated.servers == (0, 1)
    assert [colocated.server_of(r) for r in range(3)] == [0, 1, None]
    assert colocated.describe() == "3 ranks, workers 0-2, servers 0,1"
    by_host = RankRoles.parameter_server(workers=4, servers=[0, 2], dedicated=False)
    assert [by_host.server_of(r) for r in range(4)] == [0, None, 1, None]


def test_items_are_dealt_round_robin_and_described_once() -> None:
    roles = RankRoles.hosting(2, "member", 5)
    assert [roles.owner(m) for m in range(5)] == [0, 1, 0, 1, 0]
    assert roles.hosted_by(1) == [1, 3]
    assert roles.describe() == "2 ranks, workers 0,1, members by rank: rank 0: 0,2,4; rank 1: 1,3"


def test_validation_names_the_field_and_the_counts() -> None:
    roles = RankRoles.hosting(3, "member", 2, items_field="strategy.population_size")
    with pytest.raises(ShoalError, match=r"^strategy.population_size: 2 members cannot occupy 3"):
        roles.validate(3, "strategy population_based")
    with pytest.raises(ShoalError, match=r"the roles need 4 processes .* this job has 3"):
        RankRoles.parameter_server(2, [2, 3], dedicated=True).validate(
            3, "strategy parameter_server"
        )
    RankRoles.hosting(3, "client", 2).validate(3, "strategy federated")  # a worker may host none


# ------------------------------------------------------------ meshes placed by host
def _hosts(*groups: list[int]) -> Hosts:
    host_of = [0] * sum(map(len, groups))
    for h, ranks in enumerate(groups):
        for rank in ranks:
            host_of[rank] = h
    names = tuple(f"h{h}" for h in range(len(groups)))
    return Hosts(names, tuple(f"10.0.0.{h}" for h in range(len(groups))), tuple(host_of))


def test_a_mesh_on_interleaved_hosts_keeps_tensor_groups_inside_a_host() -> None:
    """srun --distribution=cyclic: ranks 0, 2 on h0 and 1, 3 on h1; rank order would put
    both tensor groups across the hosts."""
    hosts = _hosts([0, 2], [1, 3])
    roles = RankRoles.mesh(4, {"data": 2, "tensor": 2}, hosts)
    assert roles.workers == (0, 2, 1, 3)
    assert roles.groups("tensor") == [[0, 2], [1, 3]]
    assert roles.groups("data") == [[0, 1], [2, 3]]
    assert roles.coordinates(2) == {"data": 0, "tensor": 1}
    line, warnings, record = roles.mesh_placement(hosts) or ("", [], {})
    assert line == (
        "mesh placed by host: data groups 0,1 on h0+h1, 2,3 on h0+h1; "
        "tensor groups 0,2 on h0, 1,3 on h1"
    )
    assert warnings == []
    assert record["event"] == "placement" and record["order"] == [0, 2, 1, 3]
    assert record["groups"]["tensor"] == [
        {"ranks": [0, 2], "hosts": ["h0"]},
        {"ranks": [1, 3], "hosts": ["h1"]},
    ]
    assert record["spanning"] == [] and record["hosts"] == {"h0": [0, 2], "h1": [1, 3]}


def test_three_dimensions_on_cyclic_hosts_put_pipeline_and_tensor_inside_hosts() -> None:
    hosts = _hosts([0, 2, 4, 6], [1, 3, 5, 7])
    roles = RankRoles.mesh(8, {"data": 2, "pipeline": 2, "tensor": 2}, hosts)
    assert roles.workers == (0, 2, 4, 6, 1, 3, 5, 7)
    assert roles.groups("tensor") == [[0, 2], [4, 6], [1, 3], [5, 7]]
    assert roles.groups("pipeline") == [[0, 4], [2, 6], [1, 5], [3, 7]]
    assert roles.groups("data") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # pipeline x tensor without data: tensor inside the hosts, the pipeline across them
    two = _hosts([0, 2], [1, 3])
    roles = RankRoles.mesh(4, {"pipeline": 2, "tensor": 2}, two)
    assert roles.groups("tensor") == [[0, 2], [1, 3]]
    placed = roles.mesh_placement(two)
    assert placed is not None and placed[1] == [] and placed[2]["spanning"] == ["pipeline"]


@pytest.mark.parametrize(
    "dims",
    [
        {"data": 2, "tensor": 2},
        {"data": 2, "pipeline": 2},
        {"pipeline": 2, "tensor": 2},
        {"tensor": 4},
    ],
)
def test_consecutive_hosts_and_one_host_keep_rank_order(dims: dict[str, int]) -> None:
    for hosts in (_hosts([0, 1], [2, 3]), _hosts([0, 1, 2, 3])):
        assert RankRoles.mesh(4, dims, hosts).workers == (0, 1, 2, 3)
    assert RankRoles.mesh(4, dims).workers == (0, 1, 2, 3)


def test_a_tensor_dimension_wider_than_a_host_is_warned_in_one_line() -> None:
    hosts = _hosts([0, 1], [2, 3])
    roles = RankRoles.mesh(4, {"tensor": 4}, hosts)
    _, warnings, record = roles.mesh_placement(hosts) or ("", [], {})
    assert warnings == [
        "tensor groups span hosts (1 of 1 groups across h0, h1; ranks per host: h0 2, h1 2): "
        "their traffic crosses the network every block; make tensor at most the ranks of a "
        "host (4 now), or start more ranks per host"
    ]
    assert record["spanning"] == ["tensor"]
    # a pipeline across hosts is logged and recorded, not warned about
    piped = RankRoles.mesh(4, {"pipeline": 4}, hosts).mesh_placement(hosts)
    assert piped is not None and piped[1] == [] and piped[2]["spanning"] == ["pipeline"]
    # data only: nothing is placed
    assert RankRoles.mesh(4, {"data": 4}, hosts).mesh_placement(hosts) is None


def test_host_numbers_that_torch_cannot_order_keep_rank_order_and_say_why() -> None:
    """Hosts {0, 3} and {1, 2}: the only host-aligned meshes put 3 before 2 or 1 before 0
    along the data dimension, and torch orders a group's members by rank."""
    hosts = _hosts([0, 3], [1, 2])
    roles = RankRoles.mesh(4, {"data": 2, "tensor": 2}, hosts)
    assert roles.workers == (0, 1, 2, 3)
    _, warnings, _ = roles.mesh_placement(hosts) or ("", [], {})
    assert len(warnings) == 1 and warnings[0].startswith("tensor groups span hosts (2 of 2")
    assert "number each host's ranks consecutively (torchrun does" in warnings[0]
    unplaced = RankRoles.mesh(4, {"data": 2, "tensor": 2})
    line, warnings, record = unplaced.mesh_placement(_hosts([0, 2], [1, 3])) or ("", [], {})
    assert line.startswith("mesh placed in rank order (strategy.place_by_host = false): ")
    assert warnings[0].endswith("set strategy.place_by_host = true")
    assert record["by_host"] is False


def test_every_layout_is_a_permutation_in_rank_order_with_rank_0_at_the_origin() -> None:
    """Random hosts (any sizes, any numbering) and meshes: DeviceMesh's rule always holds,
    and no layout puts more groups of the innermost dimension across hosts than rank order."""
    rng = random.Random(0)
    meshes = [{"data": 2, "tensor": 2}, {"data": 3, "tensor": 2}, {"data": 2, "pipeline": 2, "tensor": 2}, {"data": 4, "pipeline": 2}, {"pipeline": 2, "tensor": 4}]  # fmt: skip
    for _ in range(300):
        dims = rng.choice(meshes)
        world = math.prod(dims.values())
        count = rng.randint(1, world)
        host_of = [rng.randrange(count) for _ in range(world)]
        groups = [[r for r in range(world) if host_of[r] == h] for h in range(count)]
        order = mesh_order(groups, dims)
        assert sorted(order) == list(range(world)) and order[0] == 0
        assert keeps_rank_order(order, dims)
        inner = list(dims)[-1]
        split = [
            sum(len({host_of[r] for r in g}) > 1 for g in dimension_groups(o, dims, inner))
            for o in (order, list(range(world)))
        ]
        assert split[0] <= split[1], (dims, groups, order)
