"""Helpers of the hostile tests: run `shoal train` in the background and reach into it.

A job is started as a user starts it (`python -m shoal train job.toml`); the test
then finds its worker processes (descendants of the launcher, or children of torchrun), reads
their environment as any process of the same user can, and signals, stops or
lies to them. Every helper waits with a timeout and says what it waited for.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import tomli_w
import torch.distributed as dist

from shoal.launch.processes import children, descendants, environ, rank_of
from shoal.launch.start import START_ENV
from shoal.runtime.auth import SECRET_ENV, Signer
from tests.conftest import small_job

T = TypeVar("T")
#: torchrun next to this python (the tests that need it skip without it)
TORCHRUN = Path(sys.executable).parent / "torchrun"


def write_job(tmp_path: Path, **sections: Any) -> Path:
    """small_job's config as tmp_path/job.toml (run directory: tmp_path/runs/job); a None
    value leaves the field unset."""
    job = small_job(tmp_path / "runs", **sections)
    job.setdefault("run", {})["name"] = "job"
    path = tmp_path / "job.toml"
    path.write_text(tomli_w.dumps(_without_none(job)))
    return path


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    return value


def slow_data_parallel(
    workers: int = 2, delay_s: float = 0.1, epochs: int = 40, **faults: Any
) -> dict[str, Any]:
    """Sections of a data-parallel job whose rank 0 sleeps `delay_s` before every step, so that
    a test can act while it trains."""
    return {
        "strategy": {"type": "data_parallel", "num_replicas": workers},
        "train": {"epochs": epochs},
        "monitor": {"progress": "off", "log_every_steps": 1},
        "faults": {"inject": {"rank": 0, "step": 0, "kind": "slow", "delay_s": delay_s}, **faults},
    }


def start(
    *args: str, cwd: Path, program: list[str] | None = None, exec_workers: bool = False
) -> subprocess.Popen[str]:
    """`python -m shoal ARGS` (or `program ARGS`) in the background, output captured.
    `exec_workers`: workers are fresh interpreters, not forked (launch/start.py), so that
    their environment can be read through /proc (a forked one shows its server's)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    if exec_workers:
        env[START_ENV] = "exec"
    command = program or [sys.executable, "-m", "shoal"]
    return subprocess.Popen(
        [*command, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def start_torchrun(tmp_path: Path, job: dict[str, Any], *extra: str) -> subprocess.Popen[str]:
    """`torchrun --standalone --nproc-per-node 2 [extra] -m shoal train job.toml` in the
    background, on this machine, without the test process's own rank variables."""
    (tmp_path / "job.toml").write_text(tomli_w.dumps(job))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "MASTER_"))}
    return subprocess.Popen(
        [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", *extra,
         "-m", "shoal", "train", str(tmp_path / "job.toml")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def finish(process: subprocess.Popen[str], timeout: float) -> tuple[int, str, str]:
    """Wait for `process` (killed if it overruns: the test then fails on its exit code)."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(process.pid)
        out, err = process.communicate()
        err += f"\n[test: killed after {timeout} s]"
    return process.returncode, out, err


def kill_tree(pid: int) -> None:
    for child in children(pid):
        kill_tree(child)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def wait_for(check: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def workers_of(parent: subprocess.Popen[str], count: int, timeout: float = 60) -> list[int]:
    """Pids of the `count` workers `parent` started, in rank order."""

    def ranked() -> list[int] | None:
        if parent.poll() is not None:
            raise AssertionError(f"the job ended early: {parent.communicate()}")
        pids = {rank_of(p): p for p in descendants(parent.pid)}
        pids.pop(-1, None)
        return [pids[r] for r in range(count)] if len(pids) == count else None

    return wait_for(ranked, timeout, f"{count} workers")


def wait_for_step(run_dir: Path, step: int, timeout: float = 60) -> int:
    """Wait until metrics.jsonl has a train line at or past `step`; returns its step."""

    def reached() -> int | None:
        try:
            lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        except OSError:
            return None
        steps = [
            r["step"] for r in map(json.loads, filter(None, lines)) if r.get("event") == "train"
        ]
        return max(steps) if steps and max(steps) >= step else None

    return wait_for(reached, timeout, f"training to reach step {step} in {run_dir}")


def store_of(worker: int) -> dist.TCPStore:
    """A client of the job's store, as any local process can connect one."""
    port = int(environ(worker)["MASTER_PORT"])
    return dist.TCPStore(
        "127.0.0.1",
        port,
        is_master=False,
        timeout=datetime.timedelta(seconds=10),
        wait_for_workers=False,
    )


def job_signer(worker: int) -> Signer:
    """The job's signer, from a worker's environment: a process of the same user can read it
    (the secret keeps other users out). Tests use it to find the keys shoal reads."""
    return Signer(environ(worker)[SECRET_ENV])


def no_worker_left(run_dir: Path) -> None:
    left = subprocess.run(
        ["pgrep", "-f", f"shoal.launch.worker --run-dir {run_dir}"], capture_output=True
    )
    assert left.stdout == b"", "no worker outlives the job"
