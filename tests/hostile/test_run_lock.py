"""Red team: two jobs on one run directory. One writer: the second is refused, naming the first;
a holder killed with SIGKILL leaves no stale lock behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import tomli_w

import shoal
from shoal.checkpoint.manager import list_checkpoints
from shoal.run import RunPaths
from shoal.run.lock import RunInUse, RunLock
from tests.conftest import data_parallel, run_shoal, small_job
from tests.hostile.jobs import wait_for


def _workers_of(run: Path) -> bool:
    found = subprocess.run(
        ["pgrep", "-f", f"shoal.launch.worker --run-dir {run}"], capture_output=True
    )
    return bool(found.stdout.strip())


def _wait_for_checkpoint(run: Path, process: subprocess.Popen[bytes], timeout: float) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list_checkpoints(run / "checkpoints")
        if found:
            return found[-1]
        assert process.poll() is None, f"the first job ended early ({process.returncode})"
        time.sleep(0.1)
    raise AssertionError(f"no checkpoint in {run} after {timeout} s")


@pytest.mark.parametrize(
    "strategy",
    [pytest.param({"type": "local"}, marks=pytest.mark.slow), data_parallel(2)],  # one lock
    ids=["local", "dp2"],
)
def test_one_writer_and_a_killed_holder_frees_the_run(
    runs: Path, tmp_path: Path, strategy: dict[str, Any]
) -> None:
    job = small_job(
        runs,
        strategy=strategy,
        train={"epochs": 100_000},
        checkpoint={"every_steps": 10},
        run={"name": "busy", "dir": str(runs)},
    )
    (tmp_path / "busy.toml").write_text(tomli_w.dumps(job))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    first = subprocess.Popen(
        [sys.executable, "-m", "shoal", "train", str(tmp_path / "busy.toml")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run = runs / "busy"
    try:
        _wait_for_checkpoint(run, first, timeout=60)
        second = run_shoal("train", "--resume", str(run), cwd=tmp_path)
        assert second.returncode == 2
        (line,) = second.stderr.strip().splitlines()
        assert line.startswith(f"{run}: in use by another shoal job: pid {first.pid} on ")
        assert socket.gethostname() in line
        assert first.poll() is None, "the first job goes on"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    # the killed launcher's workers stop (their death signal is a stop request, with a
    # checkpoint); the newest checkpoint is read once they are gone
    wait_for(lambda: not _workers_of(run), 30, "the killed launcher's workers to stop")
    newest = json.loads((list_checkpoints(run / "checkpoints")[-1] / "meta.json").read_text())
    resumed = run_shoal(
        "train",
        "--resume",
        str(run),
        "--set",
        f"train.max_steps={newest['step'] + 3}",
        cwd=tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr
    results = json.loads((run / "results.json").read_text())
    assert results["steps"] == newest["step"] + 3


def test_the_lock_names_its_holder_and_is_released(runs: Path) -> None:
    paths = RunPaths(Path(shoal.train(small_job(runs))["run_dir"]))
    with RunLock(paths.lock):
        with pytest.raises(RunInUse, match=rf"in use by another shoal job: pid {os.getpid()} "):
            RunLock(paths.lock).acquire()
        with pytest.raises(RunInUse):
            shoal.train(resume=paths.root, overrides=["train.epochs=3"])
    assert json.loads((paths.root / "results.json").read_text())["steps"] == 26
    assert shoal.train(resume=paths.root, overrides=["train.epochs=3"])["steps"] == 39


@pytest.mark.skipif(
    shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
    reason="torchrun not installed next to this python",
)
def test_under_torchrun_rank_0_holds_the_run(runs: Path, tmp_path: Path) -> None:
    """Rank 0 takes the lock and tells the other ranks it could not: every rank stops at once
    with the holder's name, none waits for a collective that will not come."""
    run = Path(shoal.train(small_job(runs, strategy=data_parallel(2)))["run_dir"])
    torchrun = str(Path(sys.executable).parent / "torchrun")
    command = [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "shoal", "train"]
    with RunLock(RunPaths(run).lock):
        started = time.monotonic()
        done = subprocess.run(
            [*command, "--resume", str(run)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env={k: v for k, v in os.environ.items() if not k.startswith(("RANK", "MASTER_"))},
        )
    assert done.returncode != 0
    assert f"in use by another shoal job: pid {os.getpid()}" in done.stderr
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("what", ["folder", "link"])
def test_a_run_lock_that_is_not_a_file_is_one_line_and_nothing_is_written(
    runs: Path, tmp_path: Path, what: str
) -> None:
    """run.lock made a folder, or a link to a user's file (which the lock would truncate)."""
    paths = RunPaths(Path(shoal.train(small_job(runs))["run_dir"]))
    paths.lock.unlink()
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    if what == "folder":
        paths.lock.mkdir()
    else:
        paths.lock.symlink_to(precious)
    done = run_shoal("train", "--resume", str(paths.root), "--set", "train.epochs=3", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    kind = "is a folder" if what == "folder" else "is a symbolic link"
    assert done.stderr.splitlines() == [
        f"{paths.lock}: {kind}, not the lock file shoal keeps there; move it out of the run "
        "directory and run again"
    ]
    assert precious.read_text() == "keep me\n"
