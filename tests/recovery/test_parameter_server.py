"""A parameter server killed in sync mode: the launcher restarts the job, the server comes back
with its shard and row-optimizer state from the newest checkpoint, and the tables end as those
of a run never interrupted."""

from __future__ import annotations

import json
from pathlib import Path

import torch

import shoal
from tests.recovery.chaos import events
from tests.strategies.parameter_server.test_jobs import graph, job, ps, ps_tables

__all__ = ["graph"]  # the module-scoped fixture, shared with the parameter-server tests


def test_a_server_killed_in_sync_mode_comes_back_and_the_job_ends_exactly(
    runs: Path, graph: dict[str, str]
) -> None:
    lazy_adam = {"kind": "lazy_adam", "lr": 0.01}  # row-optimizer state on the servers
    strategy = ps(optimizer=lazy_adam)
    full = shoal.train(job(runs, graph, "full", strategy=strategy))
    faults = {"max_restarts": 1, "restart_backoff_s": 0.1,
              "inject": {"rank": 3, "step": 5, "kind": "exit"}}  # fmt: skip
    restarted = shoal.train(
        job(runs, graph, "restarted", strategy=strategy, checkpoint={"every_steps": 3},
            faults=faults)
    )  # fmt: skip
    assert restarted["restarts"] == 1 and restarted["steps"] == full["steps"]
    failure = restarted["failures"][0]
    assert failure["rank"] == 3 and failure["reason"].startswith("rank 3 exited with code 17")
    assert failure["resume_step"] == 3
    a, b = ps_tables(full), ps_tables(restarted)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    kinds = [e["event"] for e in events(Path(restarted["run_dir"]))]
    assert kinds.count("restart") == 1
    assert json.loads((Path(restarted["run_dir"]) / "status.json").read_text())["state"] == "done"
