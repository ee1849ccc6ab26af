"""SIGTERM and SIGINT stop a run cleanly, however they are delivered (issue 18, item 5).

Every rank stops at the same step, a final checkpoint is written there, results.json
and metrics.jsonl say how the run ended, and the exit code is 128 + the signal.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import shoal
from shoal.checkpoint.manager import list_checkpoints, load_checkpoint
from shoal.monitor.metrics import read_metrics
from tests.conftest import final_state, small_job
from tests.hostile.jobs import (
    finish,
    no_worker_left,
    slow_data_parallel,
    start,
    wait_for,
    wait_for_step,
    workers_of,
    write_job,
)


def assert_stopped(run_dir: Path, code: int, err: str, signum: int) -> dict[str, Any]:
    """The run ended on request: exit code, one-line message, results, metrics, checkpoint."""
    name = signal.Signals(signum).name
    assert code == 128 + signum, err
    assert "Traceback" not in err
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "stopped"
    stop = results["stop"]
    assert stop["signal"] == name
    step = stop["step"]
    checkpoint = Path(stop["checkpoint"])
    assert checkpoint.parent.parent == run_dir and list_checkpoints(checkpoint.parent)[-1] == (
        checkpoint
    )
    _, meta = load_checkpoint(checkpoint)  # complete and verified
    assert meta["step"] == step
    events = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["event"] == "stopped"]
    assert len(events) == 1 and events[0]["step"] == step and events[0]["signal"] == name
    assert err.strip().splitlines()[-1] == (
        f"stopped by {name} at step {step}; final checkpoint: {checkpoint}; "
        f"continue with: shoal train --resume {run_dir}"
    )
    return results


@pytest.mark.parametrize(
    ("target", "signum"),
    [
        ("launcher", signal.SIGTERM),
        pytest.param("launcher", signal.SIGINT, marks=pytest.mark.slow),  # as launcher-term
        pytest.param("one worker", signal.SIGTERM, marks=pytest.mark.slow),  # as every-worker
        ("every worker", signal.SIGTERM),
    ],
    ids=["launcher-term", "launcher-int", "one-worker", "every-worker"],
)
def test_a_signal_stops_every_rank_at_one_step_with_a_checkpoint(
    tmp_path: Path, target: str, signum: int
) -> None:
    job = write_job(tmp_path, **slow_data_parallel(workers=2))
    run_dir = tmp_path / "runs" / "job"
    launcher = start("train", str(job), cwd=tmp_path)
    workers = workers_of(launcher, 2)
    wait_for_step(run_dir, 2)
    if target == "launcher":
        launcher.send_signal(signum)
    elif target == "one worker":
        os.kill(workers[1], signum)
    else:
        for pid in workers:
            os.kill(pid, signum)
    code, _, err = finish(launcher, timeout=60)
    assert_stopped(run_dir, code, err, signum)
    no_worker_left(run_dir)


@pytest.mark.parametrize(
    "exec_workers",
    [pytest.param(False, marks=pytest.mark.slow), True],  # forked: as exec, 4 s
    ids=["forked", "exec"],
)
def test_workers_run_in_process_groups_of_their_own_within_the_launchers_session(
    tmp_path: Path, exec_workers: bool
) -> None:
    """A terminal's Ctrl-C goes to the launcher's process group alone (the launcher then
    stops every rank at one step); a session per worker would also have done that, but
    Linux's autogroup then schedules each worker as a group of its own, which slowed a
    4-process mesh on 2 cores by 7 % (launch/start.py)."""
    job = write_job(tmp_path, **slow_data_parallel(workers=2))
    run_dir = tmp_path / "runs" / "job"
    launcher = start("train", str(job), cwd=tmp_path, exec_workers=exec_workers)
    workers = workers_of(launcher, 2)
    wait_for_step(run_dir, 1)
    for pid in workers:
        assert os.getpgid(pid) == pid, "a worker leads a process group of its own"
        assert os.getsid(pid) == os.getsid(launcher.pid), "in the launcher's session"
    launcher.send_signal(signal.SIGTERM)
    code, _, err = finish(launcher, timeout=60)
    assert_stopped(run_dir, code, err, signal.SIGTERM)
    no_worker_left(run_dir)


def test_a_second_signal_stops_at_once(tmp_path: Path) -> None:
    """Steps of 3 s: the first SIGTERM waits for the step boundary, the second does not."""
    job = write_job(tmp_path, **slow_data_parallel(workers=2, delay_s=3.0))
    run_dir = tmp_path / "runs" / "job"
    launcher = start("train", str(job), cwd=tmp_path)
    workers_of(launcher, 2)
    wait_for_step(run_dir, 1)
    launcher.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    launcher.send_signal(signal.SIGTERM)
    second = time.monotonic()
    code, _, err = finish(launcher, timeout=60)
    assert time.monotonic() - second < 2.5
    assert code == 143
    assert err.strip().splitlines()[-1].startswith("stopped at once by a second SIGTERM")
    for checkpoint in list_checkpoints(run_dir / "checkpoints"):
        load_checkpoint(checkpoint)  # whatever was complete stays complete
    no_worker_left(run_dir)


def test_a_stopped_run_resumes_exactly(tmp_path: Path) -> None:
    """Stopped at whatever step the signal met, resumed: bit for bit the uninterrupted run."""
    sections = slow_data_parallel(workers=2, delay_s=0.05, epochs=3)
    job = write_job(tmp_path, **sections)
    run_dir = tmp_path / "runs" / "job"
    launcher = start("train", str(job), cwd=tmp_path)
    workers_of(launcher, 2)
    wait_for_step(run_dir, 3)
    launcher.send_signal(signal.SIGTERM)
    code, _, err = finish(launcher, timeout=60)
    stopped = assert_stopped(run_dir, code, err, signal.SIGTERM)
    resumed = shoal.train(resume=run_dir)
    assert resumed["status"] == "completed"
    del sections["faults"]
    reference = shoal.train(small_job(tmp_path / "reference", **sections))
    assert 3 <= stopped["stop"]["step"] < reference["steps"] == resumed["steps"]
    mine, theirs = final_state(resumed)["model"], final_state(reference)["model"]
    for name in mine:
        torch.testing.assert_close(mine[name], theirs[name], rtol=0, atol=0, msg=name)


def test_an_in_process_local_run_stops_on_sigterm(tmp_path: Path) -> None:
    job = write_job(
        tmp_path,
        train={"epochs": 100000},
        monitor={"progress": "off", "log_every_steps": 1},
    )
    run_dir = tmp_path / "runs" / "job"
    process = start("train", str(job), cwd=tmp_path)
    wait_for_step(run_dir, 2)
    process.send_signal(signal.SIGTERM)
    code, _, err = finish(process, timeout=60)
    assert_stopped(run_dir, code, err, signal.SIGTERM)


@pytest.mark.parametrize("strategy", ["federated", "population_based"])
def test_rounds_and_generations_stop_at_their_boundary(tmp_path: Path, strategy: str) -> None:
    """The unit is a round or a generation: the stop comes after a whole one, checkpointed."""
    if strategy == "federated":
        sections: dict[str, Any] = {
            "strategy": {"type": "federated", "num_clients": 4, "workers": 2, "rounds": 200},
            "train": {"epochs": None, "batch_size": 16},
        }
    else:
        sections = {
            "strategy": {
                "type": "population_based",
                "population_size": 2,
                "workers": 2,
                "ready_interval": 2,
                "generations": 200,
                "checkpoint_every": 0,
                "search_space": {"lr": {"kind": "log", "low": 1e-3, "high": 1.0}},
            },
            "train": {"epochs": None, "max_steps": 10000},
        }
    sections["faults"] = {"inject": {"rank": 0, "step": 0, "kind": "slow", "delay_s": 0.1}}
    sections["monitor"] = {"progress": "off"}
    job = write_job(tmp_path, **sections)
    run_dir = tmp_path / "runs" / "job"
    launcher = start("train", str(job), cwd=tmp_path)
    workers_of(launcher, 2)
    event = "round" if strategy == "federated" else "member"
    wait_for(
        lambda: (
            (run_dir / "metrics.jsonl").is_file()
            and f'"event": "{event}"' in (run_dir / "metrics.jsonl").read_text()
        ),
        60,
        f"a {event} line",
    )
    launcher.send_signal(signal.SIGTERM)
    code, _, err = finish(launcher, timeout=60)
    results = assert_stopped(run_dir, code, err, signal.SIGTERM)
    assert results["steps"] == results["stop"]["step"]  # a whole round / generation
    no_worker_left(run_dir)


@pytest.mark.skipif(
    shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
    reason="torchrun not installed next to this python",
)
def test_under_torchrun_every_rank_exits_with_128_plus_the_signal(tmp_path: Path) -> None:
    """SIGTERM to one rank of a torchrun job: both ranks stop at one step and exit 143."""
    job = write_job(tmp_path, **slow_data_parallel(workers=2))
    run_dir = tmp_path / "runs" / "job"
    torchrun = str(Path(sys.executable).parent / "torchrun")
    env_cleared = {k: v for k, v in os.environ.items() if k.startswith(("RANK", "MASTER_"))}
    assert not env_cleared, "run the tests outside a torchrun job"
    process = start(
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "shoal",
        "train",
        str(job),
        cwd=tmp_path,
        program=[torchrun],
    )
    ranks = workers_of(process, 2)
    wait_for_step(run_dir, 2)
    os.kill(ranks[1], signal.SIGTERM)
    _, _, err = finish(process, timeout=90)
    exit_codes = re.findall(r"exitcode\s*:\s*(-?\d+)", err)
    assert exit_codes and set(exit_codes) == {"143"}, err[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "stopped" and results["stop"]["signal"] == "SIGTERM"
    load_checkpoint(Path(results["stop"]["checkpoint"]))
