"""Rank roles: one object answers who trains, who serves and who hosts what (issue 11)."""

from __future__ import annotations

import pytest

from shoal.errors import ShoalError
from shoal.runtime.roles import RankRoles


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
