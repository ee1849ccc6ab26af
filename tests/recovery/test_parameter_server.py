"""A parameter server killed in sync mode comes back with its shard and row-optimizer state from
the newest checkpoint, and the tables end as those of a run never interrupted.

A dedicated server is restarted alone: the workers keep their processes, reconnect and send
again their pushes since the server's restored clock (strategies/parameter_server/rejoin.py).
A co-located server shares a worker's process: the launcher restarts the whole job."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import shoal
from tests.recovery.chaos import events
from tests.strategies.parameter_server.test_jobs import graph, job, ps, ps_tables

__all__ = ["graph"]  # the module-scoped fixture, shared with the parameter-server tests


@pytest.mark.parametrize(("placement", "rank"), [("dedicated", 3), ("colocated", 1)])
def test_a_server_killed_in_sync_mode_comes_back_and_the_job_ends_exactly(
    runs: Path, graph: dict[str, str], placement: str, rank: int
) -> None:
    lazy_adam = {"kind": "lazy_adam", "lr": 0.01}  # row-optimizer state on the servers
    strategy = ps(optimizer=lazy_adam, placement=placement)
    full = shoal.train(job(runs, graph, f"full-{placement}", strategy=strategy))
    faults = {"max_restarts": 1, "restart_backoff_s": 0.1,
              "inject": {"rank": rank, "step": 5, "kind": "exit"}}  # fmt: skip
    restarted = shoal.train(
        job(runs, graph, f"restarted-{placement}", strategy=strategy,
            checkpoint={"every_steps": 3}, faults=faults)
    )  # fmt: skip
    assert restarted["restarts"] == 1 and restarted["steps"] == full["steps"]
    failure = restarted["failures"][0]
    assert failure["rank"] == rank
    assert re.match(
        rf"rank {rank} \((worker|server) [^)]*\) exited with code 17", failure["reason"]
    )
    assert failure["resume_step"] == 3
    a, b = ps_tables(full), ps_tables(restarted)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    run_dir = Path(restarted["run_dir"])
    kinds = [e["event"] for e in events(run_dir)]
    assert kinds.count("restart") == 1
    assert json.loads((run_dir / "status.json").read_text())["state"] == "done"
    logs = {r: (run_dir / "logs" / f"rank-{r}.log").read_text() for r in range(rank + 1)}
    if placement == "colocated":  # every rank started twice, from checkpoint step 3
        assert failure["alone"] is False and failure["lost_steps"] >= 1
        assert all(log.count(" joined (") == 2 for log in logs.values())
        return
    # only the server's process was started again: each worker joined once, kept its
    # steps (none lost) and sent the server its pushes since the checkpoint of step 3
    assert failure["alone"] is True and failure["lost_steps"] == 0
    assert logs[3].count(" joined (") == 1 and "server 1 restarted alone at clock 3" in logs[3]
    for worker in (0, 1):
        assert logs[worker].count(" joined (") == 1
        assert "server 1 (rank 3) came back at clock 3 (restart 1)" in logs[worker]


def test_a_server_killed_in_async_mode_comes_back_alone_and_the_workers_go_on(
    runs: Path, graph: dict[str, str]
) -> None:
    """Async: the replayed pushes are applied in a new order, so the tables differ from an
    uninterrupted run's (as two async runs differ); the workers keep their processes."""
    faults = {"max_restarts": 1, "restart_backoff_s": 0.1,
              "inject": {"rank": 2, "step": 4, "kind": "exit"}}  # fmt: skip
    restarted = shoal.train(
        job(runs, graph, "restarted-async", strategy=ps(mode="async"),
            checkpoint={"every_steps": 3}, faults=faults)
    )  # fmt: skip
    failure = restarted["failures"][0]
    assert restarted["restarts"] == 1 and failure["alone"] is True and failure["rank"] == 2
    run_dir = Path(restarted["run_dir"])
    for worker in (0, 1):
        log = (run_dir / "logs" / f"rank-{worker}.log").read_text()
        assert log.count(" joined (") == 1 and "server 0 (rank 2) came back at clock" in log
    section = restarted["parameter_server"]
    steps = restarted["steps"]
    # each worker pushed each server once a clock (replays are not counted again)
    assert section["pushes"] == 2 * 2 * steps


def test_a_server_killed_after_the_best_evaluation_still_restores_the_best_model(
    runs: Path, graph: dict[str, str]
) -> None:
    """The best model is a snapshot in the servers' memory: a server restarted alone after
    the best evaluation reads its rows back from best/ (checkpoint.keep_best), so the job
    tests and exports the same best model as a job never interrupted.

    Early stopping with patience 1 makes the best model one evaluation older than the final
    one; the server dies between the two, after no checkpoint but best/'s copies: it comes
    back at clock 0 and the workers send again every push. (Here the best is the first
    evaluation: one best/ copy, which alone never pruned the push logs.)"""
    strategy = ps(optimizer={"kind": "lazy_adam", "lr": 0.01}, placement="dedicated")
    train = {"epochs": 30, "eval_every_epochs": 1, "early_stopping_patience": 1,
             "early_stopping_min_delta": 0.02}  # fmt: skip
    full = shoal.train(job(runs, graph, "best-full", strategy=strategy, train=train))
    best = full["best"]["step"]
    assert full["stopped_early"] and best < full["steps"]  # the final model is not the best
    faults = {"max_restarts": 1, "restart_backoff_s": 0.1,
              "inject": {"rank": 3, "step": best + 2, "kind": "exit"}}  # fmt: skip
    restarted = shoal.train(
        job(runs, graph, "best-restarted", strategy=strategy, train=train, faults=faults)
    )
    assert restarted["restarts"] == 1 and restarted["failures"][0]["alone"] is True
    assert restarted["best"]["step"] == best and restarted["steps"] == full["steps"]
    assert restarted["test"] == full["test"]  # evaluated on the same best model
    for name in ("entity_embeddings.npy", "relation_embeddings.npy"):
        ours, theirs = (Path(r["run_dir"]) / "embeddings" / name for r in (restarted, full))
        assert ours.read_bytes() == theirs.read_bytes(), name
    log = (Path(restarted["run_dir"]) / "logs" / "rank-3.log").read_text()
    assert f"the best model (clock {best}) restored from" in log
