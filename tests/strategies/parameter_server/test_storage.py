"""Shards in memory-mapped files (`strategy.shard_dir`): the same training as in memory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import shoal
from shoal.strategies.parameter_server.storage import FileStorage
from tests.strategies.parameter_server.test_jobs import job, ps, ps_tables
from tests.tasks.kge.planted import write_planted_graph

ADAGRAD = {"kind": "adagrad", "lr": 0.3}


def test_file_tensors_start_at_zero_and_leave_no_file(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path / "shards", "server-0")
    rows = storage.zeros(1000, 3)
    assert rows.shape == (1000, 3) and not rows.any()
    rows.index_add_(0, torch.tensor([7, 999]), torch.ones(2, 3))
    assert rows.sum().item() == 6.0
    assert list((tmp_path / "shards").iterdir()) == []  # unlinked once mapped
    assert storage.bytes == 12_000


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    paths = write_planted_graph(tmp_path_factory.mktemp("planted"))
    return {name: str(path) for name, path in paths.items()}


@pytest.mark.parametrize("placement", ["dedicated", "colocated"])
def test_shards_in_files_train_as_in_memory(
    runs: Path, graph: dict[str, str], tmp_path: Path, placement: str
) -> None:
    """Row-wise Adagrad (state in the files too), a validation each epoch (the best
    model's snapshot in the files), 3 workers x 2 servers, sync: tables torch.equal."""
    strategy = ps(num_workers=3, placement=placement, optimizer=ADAGRAD)
    train = {"eval_every_epochs": 1}
    memory = shoal.train(job(runs, graph, "memory", strategy=strategy, train=train))
    files = shoal.train(
        job(
            runs,
            graph,
            "files",
            strategy={**strategy, "shard_dir": str(tmp_path / "shards")},
            train=train,
        )
    )
    a, b = ps_tables(memory), ps_tables(files)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert memory["valid"] == files["valid"] and memory["test"] == files["test"]
    logs = [p.read_text() for p in (Path(files["run_dir"]) / "logs").glob("rank-*.log")]
    assert sum("memory-mapped files in" in log for log in logs) == 2  # each server says so
