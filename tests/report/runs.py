"""Small real runs of four strategies for the report's tests (a few seconds each)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import data_parallel, small_job
from tests.tasks.kge.planted import write_planted_graph
from tests.tasks.kge.test_training import kge_job

SGD = {"kind": "sgd", "lr": 0.5}
#: every interval logged, and the scalars written to TensorBoard too
MONITOR = {"progress": "off", "log_every_steps": 2, "tensorboard": True}


def dp_job(runs: Path) -> dict[str, Any]:
    """26 steps on 2 workers; checkpoints at steps 10, 20 and 26 (the end)."""
    return small_job(
        runs,
        strategy=data_parallel(2),
        monitor=MONITOR,
        run={"dir": str(runs), "name": "dp"},
        checkpoint={"every_steps": 10},
    )


def ps_job(runs: Path) -> dict[str, Any]:
    folder = runs / "graph"
    folder.mkdir(parents=True, exist_ok=True)
    graph = {name: str(path) for name, path in write_planted_graph(folder).items()}
    return kge_job(
        runs,
        graph,
        task={"model": {"type": "transe", "p": 2}, "loss": {"kind": "margin_ranking"}},
        train={"epochs": 2, "optimizer": SGD, "eval_every_epochs": 1},
        run={"name": "ps"},
        monitor=MONITOR,
        strategy={
            "type": "parameter_server",
            "num_workers": 2,
            "num_servers": 1,
            "optimizer": SGD,
            "mode": "bounded",
            "max_staleness": 1,
            "barrier_timeout_s": 20.0,
        },
        faults={"timeout_s": 60.0, "heartbeat_timeout_s": 60.0},
    )


def federated_job(runs: Path) -> dict[str, Any]:
    job = small_job(
        runs,
        strategy={"type": "federated", "num_clients": 4, "workers": 1, "rounds": 4},
        train={"batch_size": 16, "optimizer": SGD},
        monitor=MONITOR,
        run={"dir": str(runs), "name": "fed"},
    )
    del job["train"]["epochs"]
    return job


def population_job(runs: Path) -> dict[str, Any]:
    return small_job(
        runs,
        strategy={
            "type": "population_based",
            "population_size": 4,
            "ready_interval": 5,
            "generations": 4,
            "metric": "loss",
            "exploit": {"method": "truncation", "fraction": 0.25},
            "explore": {"method": "perturbation", "factor": 0.2},
            "search_space": {"lr": {"kind": "log", "low": 1e-3, "high": 3.0}},
            "checkpoint_every": 0,
        },
        train={
            "epochs": None,
            "max_steps": 20,
            "batch_size": 32,
            "seed": 0,
            "optimizer": {"kind": "sgd", "lr": 0.1},
        },
        monitor=MONITOR,
        run={"dir": str(runs), "name": "pop", "threads_per_worker": 1},
    )


JOBS = {"dp": dp_job, "ps": ps_job, "fed": federated_job, "pop": population_job}
