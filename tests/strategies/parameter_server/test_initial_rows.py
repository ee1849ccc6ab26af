"""Servers build only their rows: any number of servers and any sharding start from the
table one process starts from, and no server allocates a table it does not own."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch

import shoal
from shoal.strategies.parameter_server.config import (
    HashShardingConfig,
    RangeShardingConfig,
    RowSGDConfig,
)
from shoal.strategies.parameter_server.row_optimizers import build_row_optimizer
from shoal.strategies.parameter_server.sharding import table_owners
from shoal.strategies.parameter_server.shards import build_shard
from shoal.tasks.kge.config import ComplExConfig, RotatEConfig, TransEConfig
from shoal.tasks.kge.models import build_kge_model
from tests.strategies.parameter_server.test_jobs import job, ps, ps_tables
from tests.tasks.kge.planted import write_planted_graph

MODELS = {"transe": TransEConfig(), "complex": ComplExConfig(), "rotate": RotatEConfig()}


@pytest.mark.parametrize("sharding", [HashShardingConfig(), RangeShardingConfig()])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_shards_of_one_two_and_three_servers_are_the_local_table(model: str, sharding: Any) -> None:
    """Each server computes its rows from a model on the meta device; put together they are,
    bit for bit, the tables of the model one process builds after the same seed."""
    torch.manual_seed(5)
    local = build_kge_model(MODELS[model], 101, 7, 10, gamma=6.0)
    optimizer = build_row_optimizer(RowSGDConfig(lr=0.1))
    for servers in (1, 2, 3):
        torch.manual_seed(5)
        with torch.device("meta"):
            shapes = build_kge_model(MODELS[model], 101, 7, 10, gamma=6.0)
        for table, weight in local.tables().items():
            owners = table_owners(sharding, servers, [""] * len(weight), table == "relation")
            assembled = torch.full_like(weight, float("nan"))
            for server in range(servers):
                rows = functools.partial(shapes.initial_rows, table)
                shard = build_shard(owners, server, weight.shape[1], rows, optimizer)
                assembled[shard.ids] = shard.rows
            assert torch.equal(assembled, weight.detach()), (servers, table)


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    paths = write_planted_graph(tmp_path_factory.mktemp("planted"))
    return {name: str(path) for name, path in paths.items()}


def test_one_and_three_servers_train_bit_identical(runs: Path, graph: dict[str, str]) -> None:
    """The same start and the same sums whichever server holds a row (sync, 2 workers)."""
    one = shoal.train(job(runs, graph, "one", strategy=ps(num_servers=1)))
    three = shoal.train(job(runs, graph, "three", strategy=ps(num_servers=3)))
    a, b = ps_tables(one), ps_tables(three)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def wide_graph(folder: Path, entities: int) -> dict[str, str]:
    """`entities` entities, each in one training triple: a table far larger than the data."""
    lines = "".join(f"e{2 * i}\tr{i % 4}\te{2 * i + 1}\n" for i in range(entities // 2))
    path = folder / "train.txt"
    path.write_text(lines)
    return {"train": str(path)}


def test_no_server_allocates_a_table_it_does_not_own(tmp_path: Path, runs: Path) -> None:
    """4 servers of a 120,000 x 256 entity table (117 MiB): building the model and its
    shard raises a server's resident set by its quarter and small blocks of temporaries,
    far below the table (measured in the server process, from a peak reset just before)."""
    entities, dim = 120_000, 256
    results = shoal.train(
        job(
            runs,
            wide_graph(tmp_path, entities),
            "wide",
            task={"dim": dim, "model": {"type": "distmult"}, "loss": {"kind": "softmax"}},
            train={"max_steps": 2, "batch_size": 64},
            strategy=ps(num_servers=4),
        )
    )
    table_bytes = 4 * dim * entities
    growth = results["parameter_server"]["server_build_peak_bytes"]
    assert len(growth) == 4 and all(g is not None for g in growth), growth
    for grew in growth:
        assert 0.2 * table_bytes < grew < 0.6 * table_bytes, (grew, table_bytes)
