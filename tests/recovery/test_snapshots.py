"""`[faults] snapshot_every_steps`: a restart resumes from the newest in-memory snapshot, losing
at most that many steps, even when the rank that wrote it is the one killed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import shoal
from shoal.recovery.snapshots import snapshot_dir
from shoal.run import RunPaths
from tests.conftest import final_state
from tests.hostile.jobs import finish, no_worker_left, start, write_job
from tests.recovery.chaos import assert_identical, chaos_job, events, strike


def test_a_restart_from_a_snapshot_loses_at_most_snapshot_every_steps(tmp_path: Path) -> None:
    sections = chaos_job(2)
    sections["checkpoint"] = {"every_steps": 1000}  # disk checkpoints would lose everything
    sections["faults"] = {**sections["faults"], "snapshot_every_steps": 3}
    reference = shoal.train(chaos_job(0) | {"run": {"dir": str(tmp_path / "ref")}})
    config = write_job(tmp_path, **sections)
    run_dir = tmp_path / "runs" / "job"
    launcher = start("train", str(config), cwd=tmp_path)
    strike(launcher, run_dir, 0, 100, rank=0)  # rank 0 writes the snapshots
    code, _, err = finish(launcher, timeout=180)
    assert code == 0, err[-3000:]

    records = events(run_dir)
    restart = next(i for i, e in enumerate(records) if e["event"] == "restart")
    reached = max(int(e["step"]) for e in records[:restart] if e["event"] == "train")
    resumed = records[restart]
    assert str(resumed["resume_from"]).startswith(str(snapshot_dir(RunPaths(run_dir))))
    assert reached - 3 <= int(resumed["resume_step"]) <= reached
    assert not snapshot_dir(RunPaths(run_dir)).exists()  # the launcher removed them

    results = json.loads((run_dir / "results.json").read_text())
    assert results["restarts"] == 1 and results["steps"] == reference["steps"]
    ours, theirs = final_state(results), final_state(reference)
    for part in ("model", "optimizer", "progress"):
        assert_identical(ours[part], theirs[part], part)
    no_worker_left(run_dir)


def _unshare_available() -> str | None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "needs root and unshare(1) to give the job a small /dev/shm of its own"
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", SMALL_SHM + " && true"],
        capture_output=True,
    )
    return None if probe.returncode == 0 else f"cannot mount a tmpfs here: {probe.stderr!r}"


#: a 1 MiB /dev/shm in the job's own mount namespace: the machine's stays as it is
SMALL_SHM = "mount -t tmpfs -o size=1m tmpfs /dev/shm"


def test_a_snapshot_that_does_not_fit_in_memory_is_skipped_not_a_failure(tmp_path: Path) -> None:
    """A 2 MiB state, snapshots into a 1 MiB /dev/shm: each is skipped with a warning and the
    job completes without a restart (before, every snapshot failed rank 0, burned a restart
    and the job ended with 'RuntimeError: . unexpected pos ...')."""
    reason = _unshare_available()
    if reason:
        pytest.skip(reason)
    config = write_job(
        tmp_path,
        task={"model": {"hidden": [512, 512]}},
        strategy={"type": "data_parallel", "num_replicas": 2},
        faults={"snapshot_every_steps": 10, "max_restarts": 2},
    )
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f'{SMALL_SHM} && exec "$0" -m shoal train "$1"', sys.executable, str(config)],
        cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "runs" / "job"
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "completed" and results.get("restarts", 0) == 0
    skipped = [e for e in events(run_dir) if e["event"] == "snapshot_skipped"]
    assert [e["step"] for e in skipped] == [10, 20], skipped
    assert (
        skipped[0]["reason"].startswith(
            "in-memory snapshot of step 10 not written: the disk holding /dev/shm/shoal-"
        )
        and " is full (" in skipped[0]["reason"]
    )
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "snapshot of step 10 not written" in log and "training goes on" in log
