"""A parameter server's workers score on the GPU with the rows they pulled.

Two workers share the one GPU (their messages and collectives run on gloo), the two
dedicated servers keep the rows and their optimizer state on the CPU. In sync mode the
job is the same problem on either device: the tables after training equal the CPU run's
within the GPU's rounding, as the CPU parameter server equals `local`
(tests/strategies/parameter_server/test_jobs.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.cuda.helpers import needs_gpu, results_of, train
from tests.strategies.parameter_server.test_jobs import DROP_LAST, job, ps, ps_tables
from tests.tasks.kge.planted import write_planted_graph

pytestmark = needs_gpu


def _served(runs: Path, graph: dict[str, str], device: str) -> dict[str, Any]:
    strategy = ps(placement="dedicated", mode="sync")
    config = job(runs, graph, f"ps-{device}", strategy=strategy, train=DROP_LAST)
    config["run"]["device"] = device
    config["monitor"] = {"progress": "off"}
    train(config)
    return results_of(config)


def _log(results: dict[str, Any], rank: int) -> str:
    return (Path(results["run_dir"]) / "logs" / f"rank-{rank}.log").read_text()


def test_parameter_server_workers_score_on_the_gpu_as_on_the_cpu(tmp_path: Path) -> None:
    graph = {k: str(v) for k, v in write_planted_graph(tmp_path).items()}
    runs = tmp_path / "runs"
    cpu, cuda = _served(runs, graph, "cpu"), _served(runs, graph, "cuda")
    for rank in (0, 1):
        assert f"rank {rank} of 4 joined (gloo on cuda:0)" in _log(cuda, rank)
    for rank in (2, 3):  # the dedicated servers: rows on the CPU
        assert f"rank {rank} of 4 joined (gloo on cpu)" in _log(cuda, rank)
    assert cuda["steps"] == cpu["steps"] == 12
    on_gpu, on_cpu = ps_tables(cuda), ps_tables(cpu)
    for name in ("entity", "relation"):
        torch.testing.assert_close(on_gpu[name], on_cpu[name], rtol=0, atol=1e-4)
    assert cuda["valid"]["mrr"] == pytest.approx(cpu["valid"]["mrr"], abs=1e-3)
    # the exported tables (pulled in blocks to the GPU, then written from the CPU)
    exported = np.load(Path(cuda["run_dir"]) / "embeddings" / "entity_embeddings.npy")
    assert exported.shape == tuple(on_gpu["entity"].shape)
    assert cuda["test"]["mrr"] == pytest.approx(cpu["test"]["mrr"], abs=1e-3)
