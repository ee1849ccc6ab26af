"""Which rank runs each server: dedicated ranks, or co-located servers dealt over the hosts."""

from __future__ import annotations

from typing import Any

from shoal.shape.hosts import Hosts
from shoal.strategies.parameter_server.config import ParameterServerStrategyConfig


def server_ranks(config: ParameterServerStrategyConfig, hosts: Hosts) -> list[int]:
    return config.server_ranks(hosts)


def _config(**fields: Any) -> ParameterServerStrategyConfig:
    return ParameterServerStrategyConfig.model_validate(
        {"type": "parameter_server", "num_workers": 4, **fields}
    )


def test_colocated_servers_are_dealt_over_the_hosts() -> None:
    two_by_two = Hosts.consecutive(4, 2)
    colocated = {"placement": "colocated"}
    assert server_ranks(_config(num_servers=2, **colocated), two_by_two) == [0, 2]
    assert server_ranks(_config(num_servers=3, **colocated), two_by_two) == [0, 2, 1]
    assert server_ranks(_config(num_servers=4, **colocated), two_by_two) == [0, 2, 1, 3]
    # hosts whose ranks are not consecutive: even ranks on one, odd on the other
    interleaved = Hosts.from_ranks([("a", "a"), ("b", "b"), ("a", "a"), ("b", "b")])
    assert server_ranks(_config(num_servers=2, **colocated), interleaved) == [0, 1]
    # one host, or colocate_by_host = false: ranks 0..S-1, as before placement by host
    assert server_ranks(_config(num_servers=3, **colocated), Hosts.single(4)) == [0, 1, 2]
    first = _config(num_servers=2, colocate_by_host=False, **colocated)
    assert server_ranks(first, two_by_two) == [0, 1]


def test_dedicated_servers_follow_the_workers() -> None:
    config = _config(num_servers=2, placement="dedicated")
    assert server_ranks(config, Hosts.consecutive(6, 3)) == [4, 5]
