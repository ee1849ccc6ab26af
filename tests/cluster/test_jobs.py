"""Jobs across hosts: 2 hosts x 2 ranks under torchrun or Slurm train what 1 host x 4 ranks trains.

Every host is a network namespace with its own address and host name (see
netns.py); the jobs are started as a user starts them on each machine. The
reference is the job on one host: in `make test` one process (`local`, which
N data-parallel workers reproduce up to float rounding), in the slow checks
shoal's own launcher with 4 workers on 127.0.0.1. Exact methods agree up to
float rounding (only the order of additions differs between methods).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import shoal
from tests.cluster.jobs import start_slurm, start_torchrun
from tests.cluster.netns import Cluster
from tests.conftest import final_state, small_job


def _dp(aggregation: dict[str, Any]) -> dict[str, Any]:
    return {"type": "data_parallel", "num_replicas": 4, "aggregation": aggregation}


def _same_parameters(mine: dict[str, Any], theirs: dict[str, Any], atol: float = 1e-6) -> None:
    one, other = final_state(mine)["model"], final_state(theirs)["model"]
    assert one.keys() == other.keys()
    for name in one:
        torch.testing.assert_close(one[name], other[name], rtol=0, atol=atol, msg=name)


def _one_host(folder: Path, aggregation: dict[str, Any], name: str) -> dict[str, Any]:
    job = small_job(folder / "runs", strategy=_dp(aggregation))
    return shoal.train({**job, "run": {"dir": str(folder / "runs"), "name": name}})


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The job in one process (the `local` strategy)."""
    runs = tmp_path_factory.mktemp("one-process") / "runs"
    return shoal.train({**small_job(runs), "run": {"dir": str(runs), "name": "local"}})


@pytest.fixture(scope="module")
def one_host(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The job on this machine: 4 workers of shoal's own launcher, native all-reduce."""
    return _one_host(tmp_path_factory.mktemp("one-host"), {"method": "native"}, "one")


def _check_hosts(run_log: str, cluster: Cluster) -> None:
    h0, h1 = cluster.hosts
    expected = f"hosts: {h0.name} ({h0.address}): ranks 0, 1; {h1.name} ({h1.address}): ranks 2, 3"
    assert expected in run_log, run_log


# 10 s; make test keeps two hosts (test_slurm_step_two_hosts_without_torchrun) and torchrun
# against shoal's launcher (tests/launch/test_torchrun.py)
@pytest.mark.slow
def test_torchrun_two_hosts_hierarchical_equals_one_process(
    make_cluster: Callable[..., Cluster], tmp_path: Path, one_process: dict[str, Any]
) -> None:
    """Ranks grouped by host; gloo on each host's own interface, chosen by the route."""
    cluster = make_cluster(2)
    job = small_job(tmp_path / "runs", strategy=_dp({"method": "hierarchical"}))
    run = start_torchrun(cluster, job, tmp_path, "two").wait()
    results = run.check()
    assert results["world_size"] == 4 and results["steps"] == one_process["steps"]
    log = run.log(3)
    assert f"(torchrun, gloo on cpu; store {cluster.hosts[0].name}:" in log
    assert f"gloo listens on {cluster.hosts[1].address} on eth0 (the route to MASTER_ADDR" in log
    _check_hosts(log, cluster)
    _same_parameters(one_process, results, atol=1e-5)


def test_slurm_step_two_hosts_without_torchrun(
    make_cluster: Callable[..., Cluster], tmp_path: Path, one_process: dict[str, Any]
) -> None:
    """srun's environment alone (rank, world, node list): rank 0 hosts the store on host 0."""
    cluster = make_cluster(2)
    job = small_job(tmp_path / "runs", strategy=_dp({"method": "native"}), run={"bind": "eth0"})
    run = start_slurm(cluster, job, tmp_path, "slurm").wait()
    results = run.check()
    assert results["world_size"] == 4
    log = run.log(2)
    assert f"(slurm, gloo on cpu; store {cluster.hosts[0].name}:24242)" in log
    assert f"gloo listens on {cluster.hosts[1].address} on eth0 (run.bind = eth0)" in log
    _check_hosts(log, cluster)
    _same_parameters(one_process, results, atol=1e-5)


EXACT = {
    "native": {"method": "native"},
    "ring": {"method": "ring"},
    "tree": {"method": "tree"},
    "parameter_server": {"method": "parameter_server", "num_servers": 2},
    "hierarchical-branching-3": {"method": "hierarchical", "branching_factor": 3},
}
INEXACT = {  # not the native sum, but the same on any placement: compared with their own run
    "gossip": {"method": "gossip", "topology": "ring"},
    "hierarchical-topk": {"method": "hierarchical", "compression": {"kind": "topk", "ratio": 0.1}},
}


@pytest.mark.slow
@pytest.mark.parametrize("method", [*EXACT, *INEXACT])
def test_torchrun_two_hosts_every_aggregation(
    make_cluster: Callable[..., Cluster],
    tmp_path: Path,
    one_host: dict[str, Any],
    method: str,
) -> None:
    cluster = make_cluster(2)
    aggregation = EXACT.get(method) or INEXACT[method]
    job = small_job(tmp_path / "runs", strategy=_dp(aggregation))
    results = start_torchrun(cluster, job, tmp_path, "two").wait().check()
    reference = one_host if method in EXACT else _one_host(tmp_path, aggregation, "one")
    _same_parameters(reference, results, atol=1e-5)


@pytest.mark.slow
def test_torchrun_two_hosts_federated_clients_on_both_hosts(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """8 clients dealt over 4 workers (2 per host), secure aggregation across the hosts."""
    from tests.strategies.test_federated import fed_job

    job = fed_job(
        tmp_path / "runs",
        num_clients=8,
        workers=4,
        privacy={"secure_aggregation": True},
        partition={"kind": "dirichlet", "alpha": 0.5},
    )
    one = shoal.train({**job, "run": {"dir": str(tmp_path / "runs"), "name": "one"}})
    cluster = make_cluster(2)
    run = start_torchrun(cluster, job, tmp_path, "two").wait()
    results = run.check()
    assert results["world_size"] == 4 and results["rounds"] == one["rounds"] == 3
    _check_hosts(run.log(0), cluster)
    _same_parameters(one, results, atol=1e-6)


@pytest.mark.slow
def test_torchrun_two_hosts_population_based_is_bit_identical(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """Members on both hosts, copied between hosts as tensors: the same population bit for bit."""
    from tests.strategies.population.test_population import (
        _assert_same_population,
        _member_records,
        _small_population,
    )

    one = shoal.train(_small_population(tmp_path / "runs", "one", 4))
    cluster = make_cluster(2)
    job = _small_population(tmp_path / "runs", "two", 4)
    results = start_torchrun(cluster, job, tmp_path, "two").wait().check()
    assert {r["rank"] for r in _member_records(results["run_dir"])} == {0, 1, 2, 3}
    assert one["replaced"] > 0  # members were copied, between hosts too
    _assert_same_population(one, results)


def test_a_bind_no_host_has_fails_on_every_host_in_one_line(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster(2)
    job = small_job(tmp_path / "runs", strategy=_dp({}), run={"bind": "10.99.0.0/16"})
    run = start_slurm(cluster, job, tmp_path, "bad", tasks_per_node=1).wait()
    assert run.codes == [2, 2], run.report()
    for index, host in enumerate(cluster.hosts):
        lines = run.output(index).strip().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith(
            f"run.bind: no address in 10.99.0.0/16 on host {host.name}; its interfaces: lo "
            f"127.0.0.1, ::1; eth0 {host.address}"
        ), lines[0]


@pytest.mark.slow
def test_torchrun_two_hosts_parameter_server_with_a_server_on_each_host(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """Co-located servers dealt over the hosts (ranks 0 and 2): the tables one host trains."""
    from tests.strategies.parameter_server.test_jobs import job, ps, ps_tables
    from tests.tasks.kge.planted import write_planted_graph

    (tmp_path / "graph").mkdir()
    graph = {k: str(v) for k, v in write_planted_graph(tmp_path / "graph").items()}
    config = job(
        tmp_path / "runs",
        graph,
        "one",
        strategy=ps(num_workers=4, num_servers=2, placement="colocated"),
    )
    one = shoal.train(config)
    cluster = make_cluster(2)
    run = start_torchrun(cluster, config, tmp_path, "two").wait()
    results = run.check()
    assert results["world_size"] == 4 and results["steps"] == one["steps"]
    h0, h1 = cluster.hosts
    assert "parameter server 0 of 2 on rank 0: " in run.log(0)
    assert f"; host {h0.name} ({h0.address})" in run.log(0)
    assert "parameter server 1 of 2 on rank 2: " in run.log(2)
    assert f"; host {h1.name} ({h1.address})" in run.log(2)
    mine, theirs = ps_tables(one), ps_tables(results)
    for name in mine:
        torch.testing.assert_close(mine[name], theirs[name], rtol=0, atol=1e-5, msg=name)
