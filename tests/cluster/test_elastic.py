"""A host lost for good: the job names it, then goes on on the host that is left.

2 hosts x 2 ranks of data_parallel under torchrun's elastic rendezvous
(`--nnodes 1:2 --max-restarts 1`) with `[faults] min_workers = 2`. Every process of
host 1 is killed at once (power lost): host 0's ranks name the host and its ranks
within the heartbeat timeout and end their attempt; torchrun's agent on host 0
starts the job again, its rendezvous drops the dead host's agent (its keep-alive
stopped) and completes with host 0 alone; shoal resumes its own run from the
newest checkpoint with 2 workers and the same global batch. The job must end
bit-identical to a person resuming that checkpoint with 2 workers by hand.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import shoal
from shoal.recovery.replicas import host_snapshot_dir
from shoal.run import RunPaths
from tests.cluster.jobs import start_torchrun
from tests.cluster.netns import Cluster
from tests.cluster.test_failures import wait_for_training
from tests.conftest import final_state, run_shoal
from tests.recovery.chaos import assert_identical, events
from tests.recovery.test_elastic import elastic_job

HEARTBEAT_TIMEOUT_S = 5.0
#: torchrun's rendezvous: a node whose agent is silent for 1 s x 3 is dropped; a round
#: completes 10 s after its first node joined (both hosts start well within that)
RDZV_CONF = "keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=10"


def assert_resumed_by_hand(
    results: dict[str, Any], run_dir: Path, step: int, workers: int, folder: Path
) -> None:
    """The run's checkpoint of `step` resumed by hand with `workers` of shoal's own launcher
    (in a run directory of its own) ends bit-identical to the run."""
    by_hand = folder / "by-hand" / "run"
    checkpoint = by_hand / "checkpoints" / f"step-{step:08d}"
    shutil.copytree(run_dir / "checkpoints" / checkpoint.name, checkpoint)
    shutil.copy(run_dir / "config.toml", by_hand / "config.toml")
    (by_hand / "logs").mkdir()
    reference = shoal.train(resume=checkpoint, workers=workers)
    assert results["steps"] == reference["steps"]
    ours, theirs = final_state(results), final_state(reference)
    for part in ("model", "optimizer", "progress"):
        assert_identical(ours[part], theirs[part], part)


@pytest.mark.slow
def test_a_lost_host_leaves_the_job_on_the_other_with_the_same_problem(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster(2)
    h1 = cluster.hosts[1]
    faults = {"heartbeat_interval_s": 0.5, "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S,
              "min_workers": 2}  # fmt: skip
    run = start_torchrun(
        cluster, elastic_job(faults, workers=4), tmp_path, "elastic", nnodes="1:2",
        torchrun_args=("--max-restarts", "1", "--rdzv-conf", RDZV_CONF),
    )  # fmt: skip
    wait_for_training(run, steps=40)
    cluster.kill_host(h1)
    killed = time.monotonic()
    named = f"host {h1.name} ({h1.address}) lost: ranks 2, 3 sent no heartbeat for "
    while named not in run.output(0) and time.monotonic() - killed < HEARTBEAT_TIMEOUT_S + 30:
        time.sleep(0.1)
    took = time.monotonic() - killed
    run.wait()
    output = run.output(0)
    assert named in output, run.report()
    assert took < HEARTBEAT_TIMEOUT_S + 3, (took, output[-3000:])
    assert "this attempt stops and torchrun starts the job again (restart 1 of 1" in output
    assert run.codes[0] == 0, run.report()  # host 0 finished the job

    results = json.loads((run.run_dir / "results.json").read_text())
    assert results["world_size"] == 2
    membership = [e for e in events(run.run_dir) if e.get("event") == "membership"]
    assert [(e["was"], e["workers"], e["restart"]) for e in membership] == [(4, 2, 1)]
    step = int(membership[0]["step"])
    assert step >= 35 and step % 7 == 0  # the newest checkpoint before host 1 went
    assert "it goes on with 2 workers from 4 (faults.min_workers = 2)" in run.log(0)

    assert_resumed_by_hand(results, run.run_dir, step, workers=2, folder=tmp_path)

    header, _, *rows = run_shoal("status", str(run.run_dir), cwd=tmp_path).stdout.splitlines()
    assert header.endswith(": done; restarts 1 of 1 (faults.max_restarts)"), header
    assert [row.split()[:3] for row in rows] == [["0", "worker", "done"], ["1", "worker", "done"]]


@pytest.mark.slow
def test_a_lost_host_s_snapshot_comes_from_its_replica_on_the_other_host(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """Snapshots every 3 steps, disk checkpoints every 100: host 0 (rank 0, which writes
    the snapshots) is killed and its memory lost; the job goes on on host 1 (the store's
    host) from the replica host 1 kept, losing at most 3 steps."""
    cluster = make_cluster(2)
    h0, h1 = cluster.hosts
    faults = {"heartbeat_interval_s": 0.5, "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S,
              "min_workers": 2, "snapshot_every_steps": 3}  # fmt: skip
    job = elastic_job(faults, workers=4)
    job["checkpoint"] = {"every_steps": 100}
    run = start_torchrun(
        cluster, job, tmp_path, "ring", hosts=[h1, h0], nnodes="1:2",
        torchrun_args=("--max-restarts", "1", "--rdzv-conf", RDZV_CONF),
    )  # fmt: skip
    wait_for_training(run, steps=40)
    assert f"{h0.name} ({h0.address}): ranks 0, 1" in run.log(0), run.log(0)[-2000:]
    cluster.kill_host(h0)
    reached = max(int(e["step"]) for e in events(run.run_dir) if e.get("event") == "train")
    shutil.rmtree(host_snapshot_dir(RunPaths(run.run_dir), host=h0.name), ignore_errors=True)
    run.wait()
    assert run.codes[0] == 0, run.report()  # host 1 finished the job
    results = json.loads((run.run_dir / "results.json").read_text())
    assert results["world_size"] == 2
    found = re.findall(r"resumed from (\S*)/step-(\d+)", run.log(0))
    assert found, run.log(0)[-3000:]
    folder, step = Path(found[-1][0]), int(found[-1][1])
    assert folder == host_snapshot_dir(RunPaths(run.run_dir), host=h1.name)  # the replica
    assert reached - 3 <= step <= reached + 3 and step % 3 == 0, (reached, step)
    membership = [e for e in events(run.run_dir) if e.get("event") == "membership"]
    assert [(e["was"], e["workers"], e["step"]) for e in membership] == [(4, 2, step)]
    assert not host_snapshot_dir(RunPaths(run.run_dir), host=h1.name).exists()  # freed
