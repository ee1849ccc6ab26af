"""Shared helpers: small job configs, running the CLI, reading a run's final state."""

from __future__ import annotations

import copy
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
# RotatE's compiled kernels cost seconds of compilation in every process that scores with them
# (workers included, which inherit this): the suite scores through the tiles, and the kernels'
# own test (tests/tasks/kge/test_models.py) switches them on
os.environ.setdefault("SHOAL_KGE_COMPILE", "0")
# The suite tests the CPU paths (gloo) and must pass alike on a machine with GPUs, where its
# jobs' run.device "auto" would pick them: it hides them from itself and from every process
# it starts. tests/cuda runs its jobs in processes that see the GPUs again (GPU_ENV).
GPU_ENV = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
os.environ["CUDA_VISIBLE_DEVICES"] = ""


def small_job(run_dir: Path, **sections: Any) -> dict[str, Any]:
    """A tiny classification job (a second or two of training), sections overridable."""
    config: dict[str, Any] = {
        "task": {
            "type": "classification",
            "data": {
                "source": "synthetic",
                "samples": 500,
                "features": 10,
                "informative": 5,
                "classes": 3,
                "seed": 1,
            },
            "model": {"hidden": [16, 16]},
        },
        "strategy": {"type": "local"},
        "train": {
            "epochs": 2,
            "batch_size": 31,
            "seed": 3,
            "optimizer": {"kind": "sgd", "lr": 0.1, "momentum": 0.9},
        },
        "checkpoint": {"every_epochs": 0},
        "run": {"dir": str(run_dir)},
        "monitor": {"progress": "off"},
    }
    for name, value in sections.items():
        if isinstance(value, dict) and isinstance(config.get(name), dict):
            merged = copy.deepcopy(config[name])
            merged.update(value)
            config[name] = merged
        else:
            config[name] = value
    return config


def data_parallel(workers: int) -> dict[str, Any]:
    return {"type": "data_parallel", "num_replicas": workers}


def one_worker_context(job: dict[str, Any]) -> Any:
    """A WorkerContext of rank 0 in a world of one for `job`, with its run directory made
    (for building a task in the test's own process)."""
    from shoal.launch.plan import create_run, plan_job
    from shoal.runtime.context import WorkerContext
    from shoal.shape.hosts import Hosts

    plan = plan_job(job)
    return WorkerContext(
        config=plan.config,
        paths=create_run(plan),
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        device=torch.device("cpu"),
        backend=None,
        launch_mode="inprocess",
        log=logging.getLogger("test"),
        hosts=Hosts.single(1),
    )


def final_state(results: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint a run ended with (model, optimizer, progress, ...)."""
    return torch.load(Path(results["checkpoint"]) / "state.pt", weights_only=True)


def run_shoal(
    *args: str, cwd: Path, timeout: float = 120, env: dict[str, str | None] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m shoal ARGS` in a fresh process, as a user runs it (`env`: extra variables;
    None unsets one)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200", **(env or {}))
    env = {name: value for name, value in env.items() if value is not None}  # None: unset
    return subprocess.run(
        [sys.executable, "-m", "shoal", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"
