"""A chaos process's tools: wait for a job to reach a step, then kill or stop one of its workers.

Shared by the restart tests and benchmarks/chaos.py. Steps are read from
metrics.jsonl (`log_every_steps = 1`), counted after the job's newest `restart`
event: an earlier attempt's lines reach further than the current one has.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from shoal.launch.processes import descendants, rank_of
from tests.hostile.jobs import wait_for


def events(run_dir: Path) -> list[dict[str, Any]]:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written
            continue
    return out


def current_step(run_dir: Path, restarts: int) -> int | None:
    """The newest train step logged after the `restarts`-th restart (None: none yet)."""
    seen, step = 0, None
    for record in events(run_dir):
        if record.get("event") == "restart":
            seen += 1
            step = None
        elif record.get("event") == "train" and seen == restarts:
            step = int(record["step"])
    return step if seen == restarts else None


def worker_pid(launcher: subprocess.Popen[str], rank: int) -> int | None:
    for pid in descendants(launcher.pid):
        if rank_of(pid) == rank:
            return pid
    return None


def strike(
    launcher: subprocess.Popen[str],
    run_dir: Path,
    restarts: int,
    step: int,
    rank: int,
    sig: int = signal.SIGKILL,
    timeout: float = 120,
) -> float:
    """Once the attempt after `restarts` restarts has logged `step`, send `sig` to `rank`'s
    worker; returns the wall time of the signal."""

    def ready() -> int | None:
        if launcher.poll() is not None:
            raise AssertionError(f"the job ended before step {step}: {launcher.communicate()}")
        reached = current_step(run_dir, restarts)
        if reached is None or reached < step:
            return None
        return worker_pid(launcher, rank)

    pid = wait_for(ready, timeout, f"rank {rank} at step {step} after {restarts} restarts")
    os.kill(pid, sig)
    return time.time()


def chaos_job(max_restarts: int, epochs: int = 5) -> dict[str, Any]:
    """The sections of a 2-worker data-parallel job of 62 steps per epoch (310 in 5 epochs)
    that logs every step (the restart tests' and benchmarks/chaos.py's job)."""
    return {
        "task": {
            "type": "classification",
            "data": {"source": "synthetic", "samples": 2000, "features": 10, "informative": 5,
                     "classes": 3, "seed": 1},
            "model": {"hidden": [16, 16]},
        },
        "strategy": {"type": "data_parallel", "num_replicas": 2},
        "train": {"epochs": epochs, "batch_size": 32, "seed": 3,
                  "optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9}},
        "checkpoint": {"every_steps": 7, "every_epochs": 0},  # as write_job (small_job) has it
        "monitor": {"progress": "off", "log_every_steps": 1},
        "faults": {"max_restarts": max_restarts, "restart_backoff_s": 0.1},
    }  # fmt: skip


def assert_identical(ours: object, theirs: object, where: str) -> None:
    """Bit-identical state: equal tensors (torch.equal), equal everything else."""
    if isinstance(ours, torch.Tensor):
        assert isinstance(theirs, torch.Tensor) and torch.equal(ours, theirs), where
    elif isinstance(ours, dict):
        assert isinstance(theirs, dict) and ours.keys() == theirs.keys(), where
        for key in ours:
            assert_identical(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(ours, (list, tuple)):
        assert isinstance(theirs, (list, tuple)) and len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_identical(a, b, f"{where}[{i}]")
    elif where.endswith(("time_s", "checkpoints_written", "sent_bytes")):
        # wall-clock times, the count of checkpoints (their schedule) and the bytes sent (a
        # parameter server's messages are split by timing, and a restart sends some again):
        # not state
        return
    else:
        assert ours == theirs, f"{where}: {ours} != {theirs}"
