"""`[faults] min_workers` for the parameter server: a rank given up leaves the job on one
worker or one server fewer, and the job ends as a run resumed by hand from the same checkpoint
with that membership.

Tables are compared with torch.equal: in sync mode a row's update is its own row-optimizer
step on the sum of the workers' pushes of that clock, in worker order, whichever server holds
it, so moving a row to another server (re-sharding) changes no bit; and the elastic job and
the reference both resume from the same checkpoint with the same config. A re-shard that
lost a row's optimizer state or a push would show.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import tomli_w
import torch

import shoal
from tests.conftest import run_shoal
from tests.recovery.chaos import events
from tests.strategies.parameter_server.test_jobs import graph, job, ps, ps_tables

__all__ = ["graph"]  # the module-scoped fixture, shared with the parameter-server tests

LAZY_ADAM = {"kind": "lazy_adam", "lr": 0.01}  # row-optimizer state on the servers
KEEP = {"every_steps": 3, "keep_last": 100}


def _given_up(rank: int) -> dict[str, Any]:
    return {"max_restarts": 1, "restart_backoff_s": 0.1, "min_workers": 2,
            "max_rank_failures": 1, "inject": {"rank": rank, "step": 5, "kind": "exit"}}  # fmt: skip


def _same_as_resumed_by_hand(
    runs: Path,
    graph: dict[str, str],
    name: str,
    strategy: dict[str, Any],
    results: dict[str, Any],
    overrides: list[str],
    exact: bool,
    task: dict[str, Any] | None = None,
) -> None:
    """`results` ends as a run resumed by hand, with `overrides`, from the checkpoint the
    elastic job resumed from (the reference trains the same job uninterrupted up to it)."""
    run_dir = Path(results["run_dir"])
    step = int(next(e for e in events(run_dir) if e["event"] == "restart")["resume_step"])
    assert step == 3  # the newest checkpoint before the failure at step 5
    reference = shoal.train(
        job(runs, graph, name, strategy=strategy, checkpoint=KEEP, task=task or {})
    )
    never = ps_tables(reference)  # read now: the resume below writes its checkpoints anew
    checkpoint = Path(reference["run_dir"]) / "checkpoints" / f"step-{step:08d}"
    resumed = shoal.train(resume=checkpoint, overrides=overrides)
    assert results["steps"] == resumed["steps"] == reference["steps"]
    ours, theirs = ps_tables(results), ps_tables(resumed)
    for table in ours:
        assert torch.equal(ours[table], theirs[table]), table
        # and as the maths says, as the job never interrupted: `exact` for a server fewer
        # (a row's update does not depend on its server), a float tolerance for a worker
        # fewer (the global batch's gradient summed from other shares, in another order)
        if exact:
            assert torch.equal(ours[table], never[table]), table
        else:
            torch.testing.assert_close(ours[table], never[table], rtol=1e-6, atol=1e-6)


def test_a_server_given_up_leaves_its_rows_to_the_others(
    runs: Path, graph: dict[str, str], capfd: pytest.CaptureFixture[str]
) -> None:
    strategy = ps(num_workers=2, num_servers=2, optimizer=LAZY_ADAM)  # servers: ranks 2, 3
    results = shoal.train(
        job(runs, graph, "elastic-server", strategy=strategy, checkpoint=KEEP,
            faults=_given_up(3))
    )  # fmt: skip
    assert results["restarts"] == 1
    assert results["failures"][0]["alone"] is False  # given up, not restarted alone
    assert [(m["lost_rank"], m["workers"], m["servers"]) for m in
            results["membership_changes"]] == [(3, 2, 1)]  # fmt: skip
    run_dir = Path(results["run_dir"])
    assert (
        "rank 3 failed 1 times (faults.max_rank_failures): the job goes on with 2 workers and "
        "1 server (strategy.min_servers = 1), the same global batch"
    ) in capfd.readouterr().err
    membership = [e for e in events(run_dir) if e["event"] == "membership"]
    assert [(e["lost_rank"], e["servers"]) for e in membership] == [(3, 1)]
    log = (run_dir / "logs" / "rank-2.log").read_text()  # the one server left
    assert "re-sharded from 2 servers to 1" in log
    _same_as_resumed_by_hand(
        runs, graph, "ref-server", strategy, results, ["strategy.num_servers=1"], exact=True
    )


@pytest.mark.parametrize(
    ("placement", "servers", "rank", "left", "overrides"),
    [
        ("dedicated", 2, 2, 2, ["strategy.num_workers=2"]),
        # co-located: rank 1 runs worker 1 and server 1; 2 workers hold 2 servers at most
        ("colocated", 3, 1, 2, ["strategy.num_workers=2", "strategy.num_servers=2"]),
    ],
)
def test_a_worker_given_up_leaves_the_job_on_fewer_with_the_same_batch(
    runs: Path,
    graph: dict[str, str],
    placement: str,
    servers: int,
    rank: int,
    left: int,
    overrides: list[str],
) -> None:
    """Batches of 32 in chunks of 4 sharing negatives: 3 workers take 3, 3 and 2 chunks of
    each, 2 workers 4 and 4 (learner.py: whole chunks, so the same negatives)."""
    strategy = ps(num_workers=3, num_servers=servers, placement=placement, optimizer=LAZY_ADAM)
    task = {"negatives": {"num_negatives": 16, "chunk_size": 4}}
    results = shoal.train(
        job(runs, graph, f"elastic-{placement}", strategy=strategy, checkpoint=KEEP, task=task,
            faults=_given_up(rank))
    )  # fmt: skip
    assert results["restarts"] == 1 and results["world_size"] == 2  # the workers' world
    assert [(m["lost_rank"], m["workers"], m["servers"]) for m in
            results["membership_changes"]] == [(rank, 2, left)]  # fmt: skip
    _same_as_resumed_by_hand(
        runs, graph, f"ref-{placement}", strategy, results, overrides, exact=False, task=task
    )


def test_min_workers_above_the_workers_is_refused_in_one_line(
    tmp_path: Path, graph: dict[str, str]
) -> None:
    runs = tmp_path / "runs"
    sections = job(runs, graph, "bad", strategy=ps(num_workers=2, num_servers=2),
                   faults={"max_restarts": 1, "min_workers": 3})  # fmt: skip
    config = tmp_path / "job.toml"
    config.write_text(tomli_w.dumps(sections))
    done = run_shoal("train", str(config), cwd=tmp_path)
    assert done.returncode == 2
    # refused by the config's validation, at the field's line (`shoal config validate` too)
    assert re.fullmatch(
        r"\S*job\.toml:\d+: faults\.min_workers: 3 is more than the job's 2 workers; set it to "
        r"at most 2 \(0: never shrink\)",
        done.stderr.strip(),
    ), done.stderr
    sections["strategy"] = ps(num_workers=2, num_servers=2, min_servers=3)
    config.write_text(tomli_w.dumps(sections))
    done = run_shoal("train", str(config), cwd=tmp_path)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "min_servers: must be <= num_servers (2), got 3" in done.stderr
