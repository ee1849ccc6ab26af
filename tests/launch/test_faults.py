"""A worker that raises, exits or hangs ends the job within seconds, naming the rank."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from shoal.launch.start import START_ENV
from tests.conftest import run_shoal

JOB = """
[task]
type = "classification"
[task.data]
samples = 4000
[train]
epochs = 50
batch_size = 64
[strategy]
type = "data_parallel"
num_replicas = {workers}
[monitor]
progress = "off"
[faults]
heartbeat_timeout_s = {heartbeat}
timeout_s = {timeout}
[faults.inject]
rank = {rank}
step = 5
kind = "{kind}"
"""


@pytest.mark.parametrize(
    ("kind", "workers", "rank", "timeouts", "expected"),
    [
        (
            "raise",
            2,
            1,
            (3, 300),
            "rank 1 failed at step 5: InjectedFault: injected fault at step 5",
        ),
        ("exit", 3, 2, (3, 300), "rank 2 exited with code 17 without an error report"),
        # a frozen worker: its heartbeat stops first
        ("hang", 2, 0, (3, 300), "rank 0 stopped responding: no heartbeat for"),
        # a worker stuck while still alive: the collective timeout fires first; its peer
        # reports the timeout, and the launcher names the rank that stopped answering
        ("hang", 2, 1, (60, 4), "rank 0 failed at step 5: "),
    ],
    ids=["raise", "exit", "hang-heartbeat", "hang-collective-timeout"],
)
def test_failed_worker_ends_the_job_naming_its_rank(
    tmp_path: Path, kind: str, workers: int, rank: int, timeouts: tuple[int, int], expected: str
) -> None:
    heartbeat, timeout = timeouts
    (tmp_path / "job.toml").write_text(
        JOB.format(kind=kind, workers=workers, rank=rank, heartbeat=heartbeat, timeout=timeout)
    )
    started = time.monotonic()
    done = run_shoal("train", "job.toml", cwd=tmp_path, timeout=60)
    elapsed = time.monotonic() - started
    assert done.returncode == 1
    assert elapsed < 30
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(expected)
    if timeout < heartbeat:
        assert "Timed out waiting 4000ms" in lines[0] and "pytorch/third_party" not in lines[0]
        assert lines[0].endswith(
            "; rank 1 had not failed but stopped answering (log: runs/job/logs/rank-0.log)"
        )
    else:
        assert f"logs/rank-{rank}.log" in lines[0]
    assert "Traceback" not in done.stderr
    left = subprocess.run(
        ["pgrep", "-f", f"shoal.launch.worker --run-dir {tmp_path}"], capture_output=True
    )
    assert left.stdout == b"", "no worker outlives the job"


def test_user_error_in_workers_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("a,b,label\n1,2,0\n3,x,1\n")
    (tmp_path / "job.toml").write_text(
        '[task]\ntype = "classification"\n[task.data]\nsource = "file"\npath = "data.csv"\n'
        '[train]\nepochs = 1\nbatch_size = 2\n[strategy]\ntype = "data_parallel"\n'
    )
    done = run_shoal("train", "job.toml", cwd=tmp_path, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"{tmp_path / 'data.csv'}:3: column 'b': not a number: 'x'"
    ]


def test_workers_that_do_not_start_in_time_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """start_timeout_s bounds the start-up (separately from collectives' timeout_s)."""
    # exec'd workers take longer than 0.2 s to start; a forked one may not (launch/start.py)
    monkeypatch.setenv(START_ENV, "exec")
    (tmp_path / "job.toml").write_text(
        '[task]\ntype = "classification"\n[train]\nepochs = 1\nbatch_size = 8\n'
        '[strategy]\ntype = "data_parallel"\n[faults]\nstart_timeout_s = 0.2\n'
    )
    done = run_shoal("train", "job.toml", cwd=tmp_path, timeout=60)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rank ")
    assert "did not start within 0.2 s (faults.start_timeout_s)" in lines[0]
