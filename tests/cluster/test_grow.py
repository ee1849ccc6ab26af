"""A host that comes back: the job that went on without it grows back while it runs.

2 hosts x 2 ranks of data_parallel under torchrun's elastic rendezvous
(`--nnodes 1:2 --max-restarts 1`, `[faults] min_workers = 2`). Host 1 loses power:
the job goes on with 2 workers on host 0 (test_elastic.py). Then host 1's torchrun
is started again, as its operator would: its agent asks to join, host 0's agent
sees a node waiting and starts its workers again in a new round (torchrun does not
count that as a restart), and shoal finds its run, resumes the newest checkpoint
with 4 workers and the same global batch, and logs the change. The job must end
bit-identical to that checkpoint resumed by hand with 4 workers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cluster.jobs import start_torchrun
from tests.cluster.netns import Cluster
from tests.cluster.test_elastic import HEARTBEAT_TIMEOUT_S, RDZV_CONF, assert_resumed_by_hand
from tests.cluster.test_failures import wait_for_training
from tests.recovery.chaos import events
from tests.recovery.test_elastic import elastic_job


def _wait_for(
    run_dir: Path, found: Callable[[list[dict]], bool], limit_s: float, what: str
) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if found(events(run_dir)):
            return
        time.sleep(0.2)
    pytest.fail(f"{what} within {limit_s:g} s")


def _membership(records: list[dict]) -> list[tuple[int, int]]:
    return [(e["was"], e["workers"]) for e in records if e.get("event") == "membership"]


#: torch's shared agent store leaves a joining host waiting (recovery/rejoin.py)
OWN_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@pytest.mark.slow
def test_a_host_that_comes_back_grows_the_job_back_at_the_next_checkpoint(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster(2)
    h1 = cluster.hosts[1]
    faults = {"heartbeat_interval_s": 0.5, "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S,
              "min_workers": 2}  # fmt: skip
    job = elastic_job(faults, workers=4)
    job["train"]["epochs"] = 12  # long enough for host 1 to come back while it runs
    run = start_torchrun(
        cluster, job, tmp_path, "grow", nnodes="1:2", env=OWN_STORE,
        torchrun_args=("--max-restarts", "1", "--rdzv-conf", RDZV_CONF),
    )  # fmt: skip
    wait_for_training(run, steps=40)
    cluster.kill_host(h1)

    _wait_for(run.run_dir, lambda r: _membership(r) == [(4, 2)], 60, "no shrink to 2 workers")
    shrunk = len(events(run.run_dir))
    _wait_for(run.run_dir, lambda r: len(r) > shrunk + 20, 60, "no training on 2 workers")
    again = run.start_again(h1, "grow-h1-again")
    _wait_for(run.run_dir, lambda r: _membership(r) == [(4, 2), (2, 4)], 90, "no growth to 4")
    run.wait()
    assert run.codes[0] == 0 and run.codes[again] == 0, run.report()

    results = json.loads((run.run_dir / "results.json").read_text())
    assert results["world_size"] == 4
    shrunk_at, grown_at = [
        int(e["step"]) for e in events(run.run_dir) if e.get("event") == "membership"
    ]
    assert grown_at > shrunk_at + 20  # the 2 workers' newest state, lost no step (SIGTERM)
    assert "it grows back to 4 workers from 2" in run.log(0)
    mark = json.loads((run.run_dir / "torchrun.json").read_text())
    assert len(mark["agents"]) == 3  # host 0's agent, host 1's first and second
    assert_resumed_by_hand(results, run.run_dir, grown_at, workers=4, folder=tmp_path)


@pytest.mark.slow
def test_a_host_that_joins_a_running_job_grows_it_though_torchrun_counts_no_restart(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """No failure: the job starts on host 0 alone, host 1 joins later. No restart is
    counted anywhere (`--max-restarts 0`): rank 0 finds its run by host 0's agent."""
    cluster = make_cluster(2)
    h0, h1 = cluster.hosts
    job = elastic_job({}, workers=4)
    job["train"]["epochs"] = 30  # ~1900 steps: host 1's torchrun starts well before the end
    run = start_torchrun(
        cluster, job, tmp_path, "join", hosts=[h0], nnodes="1:2", env=OWN_STORE,
        torchrun_args=("--rdzv-conf", RDZV_CONF),
    )  # fmt: skip
    wait_for_training(run, steps=20)
    joined = run.start_again(h1, "join-h1", like=h0)
    _wait_for(run.run_dir, lambda r: _membership(r) == [(2, 4)], 90, "no growth to 4")
    run.wait()
    assert run.codes == [0, 0], run.report()
    results = json.loads((run.run_dir / "results.json").read_text())
    assert results["world_size"] == 4 and joined == 1
    (grown,) = [e for e in events(run.run_dir) if e.get("event") == "membership"]
    assert grown["restart"] == 0
    assert_resumed_by_hand(results, run.run_dir, int(grown["step"]), workers=4, folder=tmp_path)
