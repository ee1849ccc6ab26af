"""Who launched this process (torchrun, a Slurm step, shoal itself) and where it listens."""

from __future__ import annotations

import socket

import pytest

from shoal.errors import ShoalError
from shoal.launch.environment import external_launch
from shoal.launch.network import interfaces, resolve_bind, route_address
from shoal.launch.slurm import SlurmStep, expand_nodelist, expand_tasks_per_node
from shoal.shape.hosts import Hosts


def test_nodelists_and_tasks_per_node_expand_as_slurm_writes_them() -> None:
    assert expand_nodelist("gpu[01-03,07],login") == ["gpu01", "gpu02", "gpu03", "gpu07", "login"]
    assert expand_nodelist("r[1-2]n[8-9]") == ["r1n8", "r1n9", "r2n8", "r2n9"]
    assert expand_nodelist("node-a") == ["node-a"]
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(ShoalError, match="cannot read the range 'a-b'"):
        expand_nodelist("n[a-b]")


STEP = {
    "SLURM_JOB_ID": "123456",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "2",
    "SLURM_STEP_NUM_TASKS": "7",
    "SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
    "SLURM_STEP_NODELIST": "cn[08-11]",
}


def test_a_slurm_task_finds_its_place_and_the_master() -> None:
    step = SlurmStep.from_env(STEP)
    assert step == SlurmStep(
        rank=5,
        world_size=7,
        local_rank=1,
        local_world_size=2,
        node_rank=2,
        master_addr="cn08",
        master_port=20000 + 123456 % 10000,
    )
    exported = SlurmStep.from_env({**STEP, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"})
    assert exported is not None and (exported.master_addr, exported.master_port) == (
        "10.0.0.1",
        29400,
    )


def test_only_a_multi_task_step_is_joined_and_torchrun_wins() -> None:
    batch_script = {k: v for k, v in STEP.items() if not k.startswith("SLURM_STEP")}
    assert external_launch(batch_script) is None  # sbatch's shell: shoal starts its own workers
    assert external_launch({**STEP, "SLURM_STEP_NUM_TASKS": "1"}) is None
    slurm = external_launch(STEP)
    assert slurm is not None and slurm.launcher == "slurm" and not slurm.hosts_store
    first = external_launch({**STEP, "SLURM_PROCID": "0", "SLURM_NODEID": "0"})
    assert first is not None and first.hosts_store and first.placement.rank == 0
    torchrun = {"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "h0", "MASTER_PORT": "29500"}
    launch = external_launch({**STEP, **torchrun, "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert launch is not None and launch.launcher == "torchrun"
    assert (launch.placement.rank, launch.placement.local_world_size) == (3, 2)
    assert external_launch({**torchrun, "SHOAL_LAUNCHER": "1"}) is None  # shoal's own worker


def test_under_torchrun_without_the_agent_s_store_rank_0_hosts_a_new_one_each_start() -> None:
    torchrun = {"WORLD_SIZE": "4", "MASTER_ADDR": "h0", "MASTER_PORT": "29500",
                "TORCHELASTIC_RESTART_COUNT": "2"}  # fmt: skip
    shared = external_launch({**torchrun, "RANK": "0"})
    assert shared is not None and shared.agent_store and not shared.hosts_store
    assert shared.attempt == "torchrun-2"  # the agent's store outlives a start: keys apart
    own = {**torchrun, "TORCHELASTIC_USE_AGENT_STORE": "False"}
    first, other = external_launch({**own, "RANK": "0"}), external_launch({**own, "RANK": "3"})
    assert first is not None and first.hosts_store and not first.agent_store
    assert other is not None and not other.hosts_store
    # a store new at each start: ranks whose agents counted restarts apart still meet
    assert first.attempt == other.attempt == "torchrun" and first.restart == 2


def test_bind_resolves_on_this_host_or_names_what_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    assert "127.0.0.1" in interfaces()["lo"]
    assert route_address("127.0.0.1") == "127.0.0.1"
    single = resolve_bind(None, "127.0.0.1")  # one host: loopback, as before
    assert (single.address, single.interface) == ("127.0.0.1", "lo")
    assert resolve_bind("lo", "x").address == "127.0.0.1"
    assert resolve_bind("127.0.0.0/8", "x").interface == "lo"
    assert resolve_bind("127.0.0.1", "x").interface == "lo"
    host = socket.gethostname()
    with pytest.raises(ShoalError, match=rf"run.bind: no interface 'eth9' on host {host}; its int"):
        resolve_bind("eth9", "127.0.0.1")
    with pytest.raises(ShoalError, match=r"run.bind: 192.0.2.250 is not an address of host"):
        resolve_bind("192.0.2.250", "127.0.0.1")
    with pytest.raises(ShoalError, match=r"run.bind: no address in 198.51.100.0/24 on host"):
        resolve_bind("198.51.100.0/24", "127.0.0.1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    exported = resolve_bind(None, "198.51.100.1")
    assert exported.interface == "lo" and "from the environment" in exported.reason


def test_hosts_group_ranks_by_name_and_address_whatever_their_numbers() -> None:
    hosts = Hosts.from_ranks(
        [("a", "10.0.0.1"), ("b", "10.0.0.2"), ("a", "10.0.0.1"), ("b", "10.0.0.2"), ("c", "c")]
    )
    assert hosts.groups == [[0, 2], [1, 3], [4]]
    assert hosts.label(0) == "a (10.0.0.1)" and hosts.label(2) == "c"
    assert hosts.describe() == "a (10.0.0.1): ranks 0, 2; b (10.0.0.2): ranks 1, 3; c: ranks 4"
    assert Hosts.consecutive(5, 2).groups == [[0, 1], [2, 3], [4]]
    assert Hosts.single(3).groups == [[0, 1, 2]]
