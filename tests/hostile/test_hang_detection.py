"""A stopped or frozen worker is found in seconds by default, without false alarms (item 7).

SIGSTOP is seen in the worker's process state (/proc) within about a second; a worker
frozen otherwise is found when its heartbeat stops, after faults.heartbeat_timeout_s
(5 s by default: the heartbeat thread keeps beating while a worker evaluates or
writes checkpoints, see benchmarks/heartbeat_gaps.py).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from shoal.config.sections import FaultsConfig
from tests.hostile.jobs import (
    finish,
    no_worker_left,
    slow_data_parallel,
    start,
    wait_for_step,
    workers_of,
    write_job,
)


def test_a_sigstopped_worker_is_named_within_seconds(tmp_path: Path) -> None:
    job = write_job(tmp_path, **slow_data_parallel(workers=2, heartbeat_timeout_s=600))
    run_dir = tmp_path / "runs" / "job"
    launcher = start("train", str(job), cwd=tmp_path)
    workers = workers_of(launcher, 2)
    wait_for_step(run_dir, 2)
    os.kill(workers[1], signal.SIGSTOP)
    stopped_at = time.monotonic()
    code, _, err = finish(launcher, timeout=60)
    detected = time.monotonic() - stopped_at
    assert code == 1, err
    (line,) = err.strip().splitlines()
    assert line.startswith(
        f"rank 1 is stopped (process {workers[1]} in state T: SIGSTOP, Ctrl-Z or a debugger)"
    ), line
    assert "; it last reported " in line and line.endswith(f"see {run_dir}/logs/rank-1.log")
    assert detected < 5, f"named after {detected:.1f} s"
    no_worker_left(run_dir)


@pytest.mark.slow  # suite budget: the sigstopped and hung-worker tests name a hang in make test
def test_a_frozen_worker_is_found_within_the_default_heartbeat_timeout(tmp_path: Path) -> None:
    """kind = "hang" stops the heartbeat of a running process: no faults settings given."""
    assert FaultsConfig().heartbeat_timeout_s <= 5
    sections = slow_data_parallel(workers=2, delay_s=0.05)
    sections["faults"] = {"inject": {"rank": 1, "step": 5, "kind": "hang"}}
    job = write_job(tmp_path, **sections)
    run_dir = tmp_path / "runs" / "job"
    launcher = start("train", str(job), cwd=tmp_path)
    workers_of(launcher, 2)
    wait_for_step(run_dir, 4)
    hung_by = time.monotonic()
    code, _, err = finish(launcher, timeout=90)
    detected = time.monotonic() - hung_by
    assert code == 1, err
    assert err.strip().splitlines()[-1].startswith("rank 1 stopped responding: no heartbeat for")
    assert detected < 12, f"found after {detected:.1f} s"
    no_worker_left(run_dir)


@pytest.mark.slow  # 9 s: its steps must outlast the heartbeat timeout
def test_steps_longer_than_the_heartbeat_timeout_are_no_false_alarm(tmp_path: Path) -> None:
    """A worker busy for 2.5 s per step (compute, evaluation, a checkpoint write: here a
    sleep) with a 1.5 s heartbeat timeout: its heartbeat thread keeps the launcher informed."""
    sections = slow_data_parallel(workers=2, delay_s=2.5, epochs=1, heartbeat_timeout_s=1.5)
    sections["train"]["max_steps"] = 2
    job = write_job(tmp_path, **sections)
    launcher = start("train", str(job), cwd=tmp_path)
    code, _, err = finish(launcher, timeout=90)
    assert code == 0, err
