"""Model selection, the test split and artifacts under every loop the driver runs (issue 11).

Federated runs used to keep no best model, evaluate no test split and export
nothing; under the one driver they do what local training does, with the global
model as the model of record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shoal
from shoal.checkpoint.manager import list_checkpoints, load_checkpoint
from tests.conftest import small_job
from tests.tasks.kge.planted import write_planted_graph
from tests.tasks.kge.test_training import kge_job


def _events(results: dict[str, Any], event: str) -> list[dict[str, Any]]:
    lines = (Path(results["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == event]


def test_federated_keeps_the_best_global_model(runs: Path) -> None:
    """Every round is evaluated; the best round's global model is in best/ and in results."""
    job = small_job(
        runs,
        strategy={"type": "federated", "num_clients": 4, "workers": 1, "rounds": 6},
        train={"batch_size": 16, "optimizer": {"kind": "sgd", "lr": 0.5}},
    )
    del job["train"]["epochs"]
    results = shoal.train(job)
    evals = [r for r in _events(results, "eval") if r["split"] == "valid"]
    assert [r["step"] for r in evals] == [1, 2, 3, 4, 5, 6]
    best = max(evals, key=lambda r: r["accuracy"])  # the first of equal values
    assert results["best"]["metric"] == "accuracy"
    assert results["best"]["value"] == best["accuracy"]
    assert results["best"]["step"] == best["step"]
    kept = list_checkpoints(Path(results["run_dir"]) / "best")
    assert [p.name for p in kept] == [f"step-{best['step']:08d}"]
    state, meta = load_checkpoint(kept[0])
    assert meta["unit"] == "round" and "server" in state


@pytest.mark.parametrize("workers", [1, 2])
def test_federated_kge_tests_the_best_model_and_writes_embeddings(
    runs: Path, tmp_path: Path, workers: int
) -> None:
    """The test split is evaluated with the best round's model, whose tables are exported."""
    graph = {k: str(v) for k, v in write_planted_graph(tmp_path).items()}
    job = kge_job(
        runs,
        graph,
        strategy={"type": "federated", "num_clients": 2, "workers": workers, "rounds": 4},
        train={"batch_size": 32, "eval_every_epochs": 0},
    )
    del job["train"]["epochs"]
    results = shoal.train(job)
    assert results["status"] == "completed"
    tests = _events(results, "test")
    assert [r["split"] for r in tests] == ["test"]
    assert tests[0]["model_step"] == results["best"]["step"]
    assert results["test"]["mrr"] == tests[0]["mrr"]
    best = list_checkpoints(Path(results["run_dir"]) / "best")[-1]
    assert best.name == f"step-{results['best']['step']:08d}"
    state, _ = load_checkpoint(best)
    table = np.load(
        Path(results["run_dir"]) / "embeddings" / "entity_embeddings.npy", allow_pickle=False
    )
    np.testing.assert_array_equal(state["model"]["entity.weight"].numpy(), table)


@pytest.mark.parametrize("workers", [1, 2])
def test_population_tests_the_best_member_and_writes_its_embeddings(
    runs: Path, tmp_path: Path, workers: int
) -> None:
    """The best member (by the population's metric) is selected across generations, kept in
    best/, sent to every rank for the test split, and its tables are the exported ones."""
    graph = {k: str(v) for k, v in write_planted_graph(tmp_path).items()}
    job = kge_job(
        runs,
        graph,
        strategy={
            "type": "population_based",
            "population_size": 3,
            "workers": workers,
            "ready_interval": 4,
            "generations": 3,
            "search_space": {"lr": {"kind": "log", "low": 1e-3, "high": 0.1}},
        },
        train={"batch_size": 32, "eval_every_epochs": 0, "max_steps": 12},
    )
    del job["train"]["epochs"]
    results = shoal.train(job)
    assert results["status"] == "completed" and results["steps"] == 12
    generations = _events(results, "generation")
    best = max(generations, key=lambda r: r["best_score"])  # mrr: the first of equal values
    assert results["best"]["metric"] == "mrr"
    assert results["best"]["value"] == best["best_score"]
    assert results["best"]["step"] == best["step"]  # the driver counts the members' steps
    # the final population's best member as before, its figures the last validation
    assert results["valid"]["mrr"] == results["best"]["score"] == generations[-1]["best_score"]
    tests = _events(results, "test")
    assert [r["split"] for r in tests] == ["test"]
    assert tests[0]["model_step"] == best["step"]
    assert results["test"]["mrr"] == tests[0]["mrr"]
    kept = list_checkpoints(Path(results["run_dir"]) / "best")
    assert [p.name for p in kept] == [f"step-{best['step']:08d}"]
    state, meta = load_checkpoint(kept[0])
    assert meta["unit"] == "generation"
    member = json.loads(state["population"])["best_member"]
    assert member == best["best_member"]
    table = np.load(
        Path(results["run_dir"]) / "embeddings" / "entity_embeddings.npy", allow_pickle=False
    )
    saved = state["members"][member]["model"]["entity.weight"].numpy()
    np.testing.assert_array_equal(saved, table)
