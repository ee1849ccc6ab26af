"""Across hosts, when things go wrong: a host disappears, or a stray process tries to join.

A host is removed as a machine is: every process in its namespace killed at once
(power lost), or its link taken down (its processes keep running, unreachable).
The survivors must stop within the heartbeat timeout, naming the host and its
ranks. A process on a third host without the job's secret that connects to the
job's store is refused, named in rank 0's log, and the job goes on.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.jobs import ClusterRun, clean_env, start_torchrun, write_job
from tests.cluster.netns import Cluster
from tests.conftest import small_job

HEARTBEAT_TIMEOUT_S = 5.0
SECRET = "0123456789abcdef" * 4


def long_job(folder: Path, epochs: int = 2000) -> dict[str, Any]:
    """A data-parallel job of many epochs (minutes): it is still training when a host goes."""
    return small_job(
        folder / "runs",
        strategy={"type": "data_parallel", "num_replicas": 4},
        train={"epochs": epochs},
        monitor={"log_every_steps": 1, "progress": "off"},
        faults={"heartbeat_interval_s": 0.5, "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S},
    )


def wait_for_training(run: ClusterRun, steps: int = 5, limit_s: float = 120.0) -> None:
    """Until rank 0 logged `steps` training steps (every host has joined and trains)."""
    deadline = time.monotonic() + limit_s
    metrics = run.run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.exists():
            lines = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
            if sum(1 for r in lines if r.get("event") == "train") >= steps:
                return
        if any(p.poll() is not None for p in run.processes):
            break
        time.sleep(0.2)
    pytest.fail(f"the job did not start training:\n{run.report()}")


def stop_on(run: ClusterRun, process: int, limit_s: float) -> float:
    """Seconds until process `process` of the run exits (killed and failed after `limit_s`)."""
    started = time.monotonic()
    try:
        run.processes[process].wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        run.cluster.wait_all(run.processes, 0)
        pytest.fail(f"host 0 still running {limit_s:.0f} s after host 1 went:\n{run.report()}")
    return time.monotonic() - started


@pytest.mark.slow
@pytest.mark.parametrize("how", ["killed", "link down"])
def test_a_lost_host_is_named_with_its_ranks_within_the_heartbeat_timeout(
    make_cluster: Callable[..., Cluster], tmp_path: Path, how: str
) -> None:
    cluster = make_cluster(2)
    h1 = cluster.hosts[1]
    run = start_torchrun(cluster, long_job(tmp_path), tmp_path, "lost")
    wait_for_training(run)
    if how == "killed":
        cluster.kill_host(h1)
    else:
        cluster.link_down(h1)
    took = stop_on(run, 0, HEARTBEAT_TIMEOUT_S + 60)
    output = run.output(0)
    named = f"host {h1.name} ({h1.address}) lost: ranks 2, 3 sent no heartbeat for "
    assert named in output, output[-3000:]
    assert f"(faults.heartbeat_timeout_s = {HEARTBEAT_TIMEOUT_S:g}); the job stops" in output
    # the first of host 0's ranks to decide exits, and torchrun then ends the other
    assert named in run.log(0) or named in run.log(1)
    # detection within the timeout (plus an interval); torchrun then ends host 0's workers
    assert took < HEARTBEAT_TIMEOUT_S + 20, (took, output[-3000:])
    assert run.processes[0].returncode != 0


@pytest.mark.slow
def test_a_stray_process_without_the_secret_is_refused_and_the_job_goes_on(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster(3)
    h0, h1, h2 = cluster.hosts
    job = long_job(tmp_path, epochs=150)  # ~1 min: still training when the stray is done
    run = start_torchrun(cluster, job, tmp_path, "secured", hosts=[h0, h1],
                         env={"SHOAL_JOB_SECRET": SECRET})  # fmt: skip
    wait_for_training(run, steps=1)
    # torchrun's workers share a store of its agent on host 0 (MASTER_PORT, not the
    # rendezvous port): the stray connects to it, as any process that reaches the port can
    found = re.search(rf"; store {re.escape(h0.name)}:(\d+)\)", run.log(0))
    assert found is not None, run.log(0)
    port = int(found.group(1))
    stray_job, _ = write_job(job, tmp_path, "stray")
    stray_env = clean_env(
        RANK="3", WORLD_SIZE="4", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
        MASTER_ADDR=h0.name, MASTER_PORT=str(port), TORCHELASTIC_RESTART_COUNT="0",
    )  # fmt: skip
    stray = cluster.run(h2, [sys.executable, "-m", "shoal", "train", str(stray_job)],
                        timeout=120, env=stray_env)  # fmt: skip
    # (torch's own warnings start with "[W"; shoal's error is one line, no traceback)
    lines = [x for x in stray.stderr.strip().splitlines() if not x.startswith("[W")]
    assert stray.returncode == 2, stray.stderr[-2000:]
    assert lines == [
        f"the job at {h0.name}:{port} refused this process as rank 3: it does not prove "
        "it knows the job's secret; export the job's SHOAL_JOB_SECRET (or set run.secret_file) "
        "alike on every host"
    ], lines
    results = run.wait().check()
    assert results["world_size"] == 4
    refused = (
        f"refused a process that asked to join as rank 3 from host {h2.name} ({h2.address}): "
        "it does not prove it knows the job's secret"
    )
    assert refused in run.log(0)
