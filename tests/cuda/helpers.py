"""What the CUDA tests share: the GPU count (in a process that sees the GPUs), `shoal train`
of a job there, and readers of a run's results."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomli_w
import torch

from tests.conftest import GPU_ENV, run_shoal


def _gpus() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    env = {k: v for k, v in {**os.environ, **GPU_ENV}.items() if v is not None}
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return int(probe.stdout.strip() or 0)


GPUS = _gpus()
needs_gpu = pytest.mark.skipif(GPUS == 0, reason="no CUDA device here")


def train(job: dict[str, Any], *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    """`shoal train` of `job` (written as TOML beside its runs) in a process that sees the GPUs."""
    runs = Path(job["run"]["dir"])
    runs.mkdir(parents=True, exist_ok=True)
    config = runs / f"{job['run']['name']}.toml"
    config.write_text(tomli_w.dumps(job))
    done = run_shoal("train", str(config), *args, cwd=runs, env=GPU_ENV, timeout=600)
    if ok:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


def results_of(job: dict[str, Any]) -> dict[str, Any]:
    run_dir = Path(job["run"]["dir"]) / job["run"]["name"]
    return json.loads((run_dir / "results.json").read_text())


def final_model(results: dict[str, Any]) -> dict[str, torch.Tensor]:
    state = Path(results["checkpoint"]) / "state.pt"
    return torch.load(state, map_location="cpu", weights_only=True)["model"]


def joined(results: dict[str, Any]) -> str:
    return (Path(results["run_dir"]) / "logs" / "rank-0.log").read_text()


def assert_close_models(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float):
    assert a.keys() == b.keys()
    off = {n: float((a[n] - b[n]).abs().max()) for n in a}
    assert max(off.values()) <= atol, {n: d for n, d in off.items() if d > atol}


def named(job: dict[str, Any], name: str, device: str) -> dict[str, Any]:
    job["run"] = {**job["run"], "name": name, "device": device}
    return job
