"""Failure messages name the rank, the newest step and the cause, and only files that exist
(issue 18, items 8 and 11): a full disk, a rank lost right after a resume, a worker that
never started."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w

from shoal.launch.start import START_ENV
from tests.conftest import data_parallel, run_shoal
from tests.hostile.jobs import (
    finish,
    no_worker_left,
    slow_data_parallel,
    start,
    wait_for,
    workers_of,
    write_job,
)
from tests.tasks.lm.helpers import lm_job, write_text


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: a disk that a checkpoint fills (root only)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_disk_is_named_with_rank_and_step(tmp_path: Path, small_disk: Path) -> None:
    """The checkpoint at step 5 (2 MiB) does not fit. The report reaches the launcher through
    the store, which needs no disk (the half-written checkpoint is removed first, so the
    rank's error file may fit again: the line does not depend on it)."""
    write_job(
        tmp_path,
        task={"model": {"hidden": [512, 512]}},
        strategy=data_parallel(2),
        checkpoint={"every_steps": 5},
        run={"dir": str(small_disk)},
        faults={"heartbeat_timeout_s": 30},
    )
    done = run_shoal("train", "job.toml", cwd=tmp_path, timeout=120)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "rank 0 failed at step 5: DiskFull: checkpoint of step 5 not written: the disk holding "
        f"{small_disk}/job/checkpoints is full ("
    ), last
    assert last.endswith(f"(log: {small_disk}/job/logs/rank-0.log)")
    assert "Traceback" not in done.stderr


def test_a_rank_lost_right_after_a_resume_is_named_at_the_resumed_step(tmp_path: Path) -> None:
    write_job(
        tmp_path,
        strategy=data_parallel(2),
        train={"epochs": 400},
        checkpoint={"every_steps": 5},
        faults={"inject": {"rank": 1, "step": 12, "kind": "raise"}},
        monitor={"progress": "off"},
    )
    run_dir = tmp_path / "runs" / "job"
    first = run_shoal("train", "job.toml", cwd=tmp_path, timeout=120)
    assert first.returncode == 1 and "rank 1 failed at step 12" in first.stderr
    launcher = start("train", "--resume", str(run_dir), cwd=tmp_path)
    rank1 = workers_of(launcher, 2)[1]
    log = run_dir / "logs" / "rank-1.log"
    wait_for(lambda: "resumed from" in log.read_text(), 60, "rank 1 to resume")
    os.kill(rank1, signal.SIGKILL)
    code, _, err = finish(launcher, timeout=60)
    assert code == 1, err
    last = err.strip().splitlines()[-1]
    found = re.match(r"rank 1 was killed by SIGKILL \(last reported step (\d+)\)", last)
    assert found and int(found.group(1)) >= 10, last
    no_worker_left(run_dir)


def test_a_worker_that_never_started_is_named_without_a_missing_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # exec'd workers take longer than 0.2 s to start; a forked one may not (launch/start.py)
    monkeypatch.setenv(START_ENV, "exec")
    write_job(tmp_path, strategy=data_parallel(2), faults={"start_timeout_s": 0.2})
    done = run_shoal("train", "job.toml", cwd=tmp_path, timeout=60)
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert "did not start within 0.2 s (faults.start_timeout_s)" in line
    seen = re.search(r"; see (\S+)$", line)
    assert seen is None or Path(seen.group(1)).is_file(), line
    assert seen is not None or line.endswith("; it has written no log yet"), line


def test_a_full_disk_during_a_dcp_checkpoint_is_one_line_naming_it(
    tmp_path: Path, small_disk: Path
) -> None:
    """fully_sharded writes its pieces through DCP on every rank: a full disk there ends the
    job in one line naming the disk (not DCP's CheckpointException of ranks)."""
    job = lm_job(
        small_disk,
        write_text(tmp_path),
        task={"model": {"dim": 128, "heads": 4, "layers": 2, "context": 16}},
        strategy={"type": "fully_sharded", "degree": 2},
        checkpoint={"every_steps": 3},
        run={"dir": str(small_disk), "name": "job"},
        faults={"heartbeat_timeout_s": 30},
    )
    (tmp_path / "job.toml").write_text(tomli_w.dumps(job))
    done = run_shoal("train", "job.toml", cwd=tmp_path, timeout=180)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    found = re.match(
        rf"rank (\d) \(data \d\) failed at step 3: DiskFull: checkpoint of step 3 not written: "
        rf"the disk holding "
        rf"{small_disk}/job/checkpoints is full \(([\d,]+) bytes free\) \(log: ",
        last,
    )
    assert found, last
    assert "Traceback" not in done.stderr and "CheckpointException" not in done.stderr


@pytest.mark.parametrize("victim", [1, 0])
def test_a_killed_rank_is_named_at_the_step_it_reached(tmp_path: Path, victim: int) -> None:
    """Killed once `shoal status` shows it past step 20, a rank (rank 0 or another) is
    named at that step or later, not at the first step it reported."""
    write_job(tmp_path, **slow_data_parallel(2, delay_s=0.05, epochs=400))
    run_dir = tmp_path / "runs" / "job"
    launcher = start("train", "job.toml", cwd=tmp_path)
    pid = workers_of(launcher, 2)[victim]

    def reached() -> int | None:
        with contextlib.suppress(OSError, ValueError, KeyError, IndexError):
            status = json.loads((run_dir / "status.json").read_text())
            step = int(status["ranks"][victim]["step"])
            return step if step >= 20 else None
        return None

    seen = wait_for(reached, 120, f"rank {victim} to pass step 20")
    os.kill(pid, signal.SIGKILL)
    code, _, err = finish(launcher, timeout=60)
    assert code == 1, err
    last = err.strip().splitlines()[-1]
    found = re.match(rf"rank {victim} was killed by SIGKILL \(last reported step (\d+)\)", last)
    assert found and int(found.group(1)) >= seen, (seen, last)
