"""Which device and backend each rank takes, on a host with a given number of GPUs.

The GPUs are counted by `process_group._gpus`, replaced here by a fixed number: the
decisions are the config's and the count's, and a device object needs no GPU to exist.
Replicas need a GPU each (NCCL refuses two ranks on one device); a parameter server's
workers share whatever GPUs there are, talk through gloo, and its dedicated servers stay
on the CPU (`JobShape.shares_gpus`).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch

from shoal.config import ShoalConfig, load_config
from shoal.errors import ConfigError, ShoalError
from shoal.launch import process_group
from shoal.launch.process_group import Placement, check_devices, choose_device

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kge-kinships-ps.toml"


def _ps(device: str = "auto", **strategy: Any) -> ShoalConfig:
    data = tomllib.loads(EXAMPLE.read_text())
    data["strategy"].update(strategy)
    data["run"]["device"] = device
    data["task"]["data"] = {"name": "kinships"}
    return load_config(data)


def _replicas(device: str = "auto") -> ShoalConfig:
    data = tomllib.loads(EXAMPLE.read_text())
    data["strategy"] = {"type": "data_parallel", "num_replicas": 2}
    data["run"]["device"] = device
    return load_config(data)


def _devices(config: ShoalConfig, world: int) -> list[tuple[str, str]]:
    """(device, backend) of every rank of a one-host job of `world` processes."""
    chosen = []
    for rank in range(world):
        device, backend = choose_device(config, Placement(rank, world, rank, world))
        chosen.append((str(device), backend))
    return chosen


@pytest.fixture
def one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process_group, "_gpus", lambda: 1)
    monkeypatch.setattr(process_group, "set_cpu_threads", lambda run, n: 1)


def test_parameter_server_workers_share_one_gpu_through_gloo(one_gpu: None) -> None:
    colocated = _ps(num_workers=2, num_servers=2, placement="colocated")
    assert _devices(colocated, 2) == [("cuda:0", "gloo"), ("cuda:0", "gloo")]
    assert check_devices(colocated.run, 2, shared=True) is None  # no "too few GPUs" note
    dedicated = _ps(num_workers=3, num_servers=2, placement="dedicated")
    assert _devices(dedicated, 5) == [("cuda:0", "gloo")] * 3 + [("cpu", "gloo")] * 2
    insisted = _ps("cuda", num_workers=3, num_servers=2, placement="dedicated")
    assert _devices(insisted, 5) == [("cuda:0", "gloo")] * 3 + [("cpu", "gloo")] * 2
    on_cpu = _ps("cpu", num_workers=2, num_servers=2, placement="colocated")
    assert _devices(on_cpu, 2) == [("cpu", "gloo"), ("cpu", "gloo")]


def test_workers_are_dealt_over_the_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process_group, "_gpus", lambda: 2)
    monkeypatch.setattr(process_group, "set_cpu_threads", lambda run, n: 1)
    config = _ps(num_workers=3, num_servers=1, placement="colocated")
    assert [d for d, _ in _devices(config, 3)] == ["cuda:0", "cuda:1", "cuda:0"]


def test_replicas_still_need_a_gpu_each(one_gpu: None) -> None:
    """Unchanged for data parallelism: two replicas on one GPU train on the CPU (auto) or
    are refused (cuda)."""
    assert _devices(_replicas(), 2) == [("cpu", "gloo"), ("cpu", "gloo")]
    assert "2 workers on this host but 1 GPU" in (check_devices(_replicas().run, 2) or "")
    with pytest.raises(ShoalError, match="need a GPU each but only 1 exist"):
        choose_device(_replicas("cuda"), Placement(0, 2, 0, 2))


def test_no_gpu_keeps_the_parameter_server_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process_group, "_gpus", lambda: 0)
    monkeypatch.setattr(process_group, "set_cpu_threads", lambda run, n: 1)
    assert _devices(_ps(), 2) == [("cpu", "gloo"), ("cpu", "gloo")]
    with pytest.raises(ShoalError, match="CUDA is not available here"):
        choose_device(_ps("cuda"), Placement(0, 2, 0, 2))
    with pytest.raises(ShoalError, match="CUDA is not available here"):
        check_devices(_ps("cuda").run, 2, shared=True)
    assert torch.device("cpu") == choose_device(_ps(), Placement(1, 2, 1, 2))[0]


def test_nccl_is_refused_where_workers_share_gpus() -> None:
    data = tomllib.loads(EXAMPLE.read_text())
    data["run"]["backend"] = "nccl"
    with pytest.raises(ConfigError, match=r"run.backend: .*talks through gloo"):
        load_config(data)
