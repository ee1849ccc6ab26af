"""Rows shared on a host (`strategy.host_rows`): workers read and update their host's shards in
place, and train as they would by message."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import shoal
from shoal.errors import ConfigError
from shoal.strategies.parameter_server.config import RowAdagradConfig
from shoal.strategies.parameter_server.host_rows import HostShard, SharedStorage, description
from shoal.strategies.parameter_server.row_optimizers import RowAdagrad, RowOptimizer
from shoal.strategies.parameter_server.server import TableShard
from shoal.strategies.parameter_server.sharding import local_index, owner_positions
from tests.strategies.parameter_server.test_jobs import job, ps, ps_tables
from tests.tasks.kge.planted import random_mrr, write_planted_graph

ADAGRAD = {"kind": "adagrad", "lr": 0.3}


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    paths = write_planted_graph(tmp_path_factory.mktemp("planted"))
    return {name: str(path) for name, path in paths.items()}


def _logs(results: dict[str, Any]) -> str:
    return "".join(p.read_text() for p in (Path(results["run_dir"]) / "logs").glob("rank-*.log"))


def _shared_folders() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("shoal-server-*")}


def test_one_worker_trains_bit_for_bit_as_by_message(runs: Path, graph: dict[str, str]) -> None:
    """One worker, two dedicated servers on its host, async with prefetch: the reads happen
    where the pulls were answered and the updates where the pushes were applied, so the
    tables after two epochs (and a validation, and the best model's snapshot) are equal."""
    before = _shared_folders()
    results = {}
    for rows in ("messages", "shared"):
        strategy = ps(num_workers=1, mode="async", optimizer=ADAGRAD, host_rows=rows)
        results[rows] = shoal.train(
            job(runs, graph, rows, strategy=strategy, train={"eval_every_epochs": 1})
        )
    a, b = ps_tables(results["messages"]), ps_tables(results["shared"])
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert results["messages"]["test"] == results["shared"]["test"]
    assert "in shared memory" in _logs(results["shared"])
    assert "in shared memory" not in _logs(results["messages"])
    assert _shared_folders() == before  # nothing left in /dev/shm


def test_two_workers_share_their_hosts_shards_and_learn(runs: Path, graph: dict[str, str]) -> None:
    """Two workers with a co-located server each (the PyTorch-BigGraph comparison's layout):
    both map both shards, rows go by no message, and the model learns as async does."""
    before = _shared_folders()
    strategy = ps(placement="colocated", mode="async", optimizer=ADAGRAD)
    results = shoal.train(job(runs, graph, "shared2", strategy=strategy, train={"epochs": 6}))
    logs = _logs(results)
    assert logs.count("reads and updates the rows of server(s) 0, 1 in shared memory") == 2
    section = results["parameter_server"]
    assert section["pushed_bytes_per_s"] == 0.0  # pushes carried clocks, no rows
    assert results["test"]["mrr"] > 2 * random_mrr(results["data"]["entities"])
    assert _shared_folders() == before


def test_shared_rows_refuse_what_they_cannot_keep(runs: Path, graph: dict[str, str]) -> None:
    """sync (a pull waits for other workers) and lazy_adam (a server-wide step count) are
    refused in one line naming the field when `shared` is asked for (`auto` falls back)."""
    for fields, words in (
        ({"mode": "sync"}, 'mode "sync" does not allow'),
        ({"mode": "async", "optimizer": {"kind": "lazy_adam", "lr": 0.1}}, "lazy_adam"),
    ):
        config = job(runs, graph, "refused", strategy=ps(host_rows="shared", **fields))
        with pytest.raises(ConfigError, match="host_rows") as caught:
            shoal.train(config)
        assert words in str(caught.value)


# ---------------------------------------------------------------- the shard itself
def _shared_shard(tmp_path: Path, owners: np.ndarray, optimizer: RowOptimizer) -> tuple[
    dict[str, TableShard], SharedStorage
]:  # fmt: skip
    storage = SharedStorage(tmp_path, "server-0")
    tables = {}
    for name, width in (("entity", 4), ("relation", 3)):
        ids = torch.from_numpy(np.flatnonzero(owners == 0))
        rows = storage.zeros(len(ids), width)
        rows.copy_(torch.randn(len(ids), width, generator=torch.Generator().manual_seed(width)))
        state = optimizer.new_state(len(ids), width, storage.zeros)
        tables[name] = TableShard(ids, local_index(owners, 0), rows, state)
    storage.seal()
    return tables, storage


def test_a_workers_update_is_the_servers_and_is_seen_by_the_server(tmp_path: Path) -> None:
    owners = np.array([0, 1, 0, 0, 1, 0], dtype=np.int64)
    optimizer = RowAdagrad(RowAdagradConfig(kind="adagrad", lr=0.1))
    tables, storage = _shared_shard(tmp_path, owners, optimizer)
    expected = {n: (t.rows.clone(), {k: v.clone() for k, v in t.state.items()})
                for n, t in tables.items()}  # fmt: skip
    index = {"entity": owner_positions(owners), "relation": owner_positions(owners)}
    mapped = HostShard(0, description(tables, storage), index, optimizer)
    ids, grads = torch.tensor([0, 3, 5]), torch.randn(3, 4)
    r_ids, r_grads = torch.tensor([2]), torch.randn(1, 3)
    mapped.apply(ids, grads, r_ids, r_grads)
    for name, (i, g) in {"entity": (ids, grads), "relation": (r_ids, r_grads)}.items():
        rows, state = expected[name]
        optimizer.apply(rows, state, tables[name].positions(i, name), g)
        assert torch.equal(tables[name].rows, rows)  # the server's own tensors see it
        assert torch.equal(tables[name].state["sum"], state["sum"])
    entity, relation = mapped.read(ids, r_ids)
    assert torch.equal(entity, tables["entity"].rows[tables["entity"].positions(ids, "entity")])
    at = tables["relation"].positions(r_ids, "relation")
    assert torch.equal(relation, tables["relation"].rows[at])
    mapped.unlink()
    storage.unlink()
    assert list(tmp_path.iterdir()) == []


def _add_ones(blob: bytes, owners: np.ndarray, times: int, start: Any) -> None:
    index = {"entity": owner_positions(owners), "relation": owner_positions(owners)}
    shard = HostShard(0, blob, index, RowOptimizer(RowAdagradConfig(kind="adagrad", lr=1.0)))
    ids = torch.tensor([0, 2, 3, 5])
    start.wait(timeout=60)  # both at once, so their updates overlap
    for _ in range(times):
        shard.apply(ids, torch.ones(4, 4), ids[:0], torch.ones(0, 3))


def test_two_processes_updating_the_same_rows_lose_nothing(tmp_path: Path) -> None:
    """The shard's lock makes each apply whole across processes: 2 x 3000 steps of -1 on the
    same rows end at exactly -6000 (read-modify-write without it loses some)."""
    owners = np.array([0, 1, 0, 0, 1, 0], dtype=np.int64)
    plain = RowOptimizer(RowAdagradConfig(kind="adagrad", lr=1.0))
    tables, storage = _shared_shard(tmp_path, owners, plain)
    tables["entity"].rows.zero_()
    blob = description(tables, storage)
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(2)
    workers = [
        context.Process(target=_add_ones, args=(blob, owners, 3000, start)) for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    assert torch.equal(tables["entity"].rows, torch.full((4, 4), -6000.0))
    storage.unlink()
