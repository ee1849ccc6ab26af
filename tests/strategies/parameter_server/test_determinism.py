"""Sync mode is deterministic: identical runs, and a crashed run resumed, end bit for bit alike.

A row pushed by three or more workers in one clock is a sum whose float result depends on
the order of its terms; the servers add them in worker order, whatever order the pushes
arrived in. (Two terms would not show it: a + b == b + a exactly.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import shoal
from shoal.checkpoint.manager import list_checkpoints
from shoal.errors import JobFailed
from shoal.strategies.parameter_server.shards import SHARD_GLOB
from tests.strategies.parameter_server.test_jobs import job, ps
from tests.tasks.kge.planted import write_planted_graph

ADAGRAD = {"kind": "adagrad", "lr": 0.3}


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    paths = write_planted_graph(tmp_path_factory.mktemp("planted"))
    return {name: str(path) for name, path in paths.items()}


def shard_states(results: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Every tensor of every shard file of the run's final checkpoint (rows and row state)."""
    out = {}
    for file in sorted(Path(results["checkpoint"]).glob(SHARD_GLOB)):
        for key, value in torch.load(file, weights_only=True).items():
            out[f"{file.name}:{key}"] = value
    assert out, "the checkpoint holds no shard files"
    return out


def assert_identical(a: dict[str, Any], b: dict[str, Any]) -> None:
    first, second = shard_states(a), shard_states(b)
    assert first.keys() == second.keys()
    for key, value in first.items():
        assert torch.equal(value, second[key]), f"{key} differs"
    assert a["valid"] == b["valid"] and a["test"] == b["test"]


def sync_job(runs: Path, graph: dict[str, str], name: str, placement: str, **sections: Any) -> Any:
    strategy = ps(num_workers=3, num_servers=2, placement=placement, optimizer=ADAGRAD)
    return job(runs, graph, name, strategy=strategy, **sections)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, graph: dict[str, str]) -> Any:
    """3 workers, 2 dedicated servers, row-wise Adagrad (state on the servers), 14 clocks."""
    runs = tmp_path_factory.mktemp("runs")
    return shoal.train(sync_job(runs, graph, "uninterrupted", "dedicated"))


@pytest.mark.parametrize("placement", ["dedicated", "colocated"])
def test_identical_sync_runs_end_bit_identical(
    runs: Path, graph: dict[str, str], uninterrupted: dict[str, Any], placement: str
) -> None:
    if placement == "dedicated":
        first = uninterrupted
    else:
        first = shoal.train(sync_job(runs, graph, "first", placement))
    second = shoal.train(sync_job(runs, graph, "second", placement))
    assert first["steps"] == second["steps"] == 14
    assert_identical(first, second)


def test_a_crashed_sync_run_resumes_bit_identical(
    runs: Path, graph: dict[str, str], uninterrupted: dict[str, Any]
) -> None:
    """Worker 2 dies at step 10; the run resumes from its checkpoint of step 8."""
    with pytest.raises(JobFailed, match=r"rank 2 \(worker 2[^)]*\) exited with code 17"):
        shoal.train(
            sync_job(
                runs,
                graph,
                "broken",
                "dedicated",
                checkpoint={"every_steps": 4},
                faults={"inject": {"rank": 2, "step": 10, "kind": "exit"}},
            )
        )
    broken = runs / "broken"
    steps = [int(p.name.removeprefix("step-")) for p in list_checkpoints(broken / "checkpoints")]
    assert steps[-1] == 8
    resumed = shoal.train(resume=broken)
    assert resumed["steps"] == uninterrupted["steps"] == 14
    assert_identical(resumed, uninterrupted)
