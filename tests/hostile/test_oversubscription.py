"""More workers than cores: a warning; far more: refused in one line (issue 18, item 8)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import shoal
from shoal.errors import ShoalError
from shoal.launch import cores
from shoal.launch.cores import MAX_WORKERS_PER_CORE, available_cores, check_cores
from tests.conftest import data_parallel, run_shoal, small_job
from tests.hostile.jobs import write_job


def test_far_too_many_workers_are_refused_before_anything_starts(tmp_path: Path) -> None:
    workers = MAX_WORKERS_PER_CORE * available_cores() + 1
    write_job(tmp_path, strategy=data_parallel(2))
    started = time.monotonic()
    done = run_shoal("train", "job.toml", "--workers", str(workers), cwd=tmp_path, timeout=60)
    assert time.monotonic() - started < 30
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"--workers {workers}: {workers} worker processes on {available_cores()} CPU cores "
        f"would spend their time waiting for each other (at most "
        f"{MAX_WORKERS_PER_CORE * available_cores()} without --force); start fewer workers, "
        "or pass --force (shoal.train(..., force=True)) to start them anyway"
    ]
    assert not (tmp_path / "runs").exists(), "no run directory for a refused run"


def test_the_api_refuses_too_many_from_the_config_and_force_lets_them_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cores, "available_cores", lambda: 1)
    job = small_job(tmp_path / "runs", strategy=data_parallel(MAX_WORKERS_PER_CORE + 1))
    with pytest.raises(ShoalError, match=r"^\[strategy\] of the config: 5 worker processes"):
        shoal.train(job)
    assert not (tmp_path / "runs").exists()
    warning = check_cores(MAX_WORKERS_PER_CORE + 1, "--workers 5", force=True)
    assert warning is not None and "5 worker processes on 1 CPU cores" in warning
    assert check_cores(1, "--workers 1") is None


def test_more_workers_than_cores_start_with_a_warning(tmp_path: Path) -> None:
    workers = available_cores() + 1
    write_job(tmp_path, strategy=data_parallel(2), train={"epochs": 1})
    done = run_shoal("train", "job.toml", "--workers", str(workers), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (
        f"shoal: warning: {workers} worker processes on {available_cores()} CPU cores "
        f"(--workers {workers}): they share the cores" in done.stdout
    )
