"""`[faults] min_workers`: a data-parallel job that loses a worker for good goes on with fewer,
the same global batch, and ends as a job that had 3 workers up to that step and 2 after."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import shoal
from tests.conftest import final_state, run_shoal
from tests.hostile.jobs import finish, no_worker_left, start, write_job
from tests.recovery.chaos import assert_identical, chaos_job, events, strike


def elastic_job(faults: dict[str, Any], workers: int = 3) -> dict[str, Any]:
    """The chaos job on `workers` data-parallel workers, every checkpoint kept."""
    sections = chaos_job(0)
    sections["strategy"] = {"type": "data_parallel", "num_replicas": workers}
    sections["checkpoint"] = {"every_steps": 7, "keep_last": 1000}
    sections["faults"] = faults
    return sections


def test_a_worker_lost_for_good_leaves_the_job_on_two_with_the_same_problem(
    tmp_path: Path,
) -> None:
    faults = {"max_restarts": 2, "restart_backoff_s": 0.1, "min_workers": 2,
              "max_rank_failures": 1}  # fmt: skip
    config = write_job(tmp_path, **elastic_job(faults))
    run_dir = tmp_path / "runs" / "job"
    launcher = start("train", str(config), cwd=tmp_path)
    strike(launcher, run_dir, 0, 40, rank=2)
    code, _, err = finish(launcher, timeout=180)
    assert code == 0, err[-3000:]
    assert "the job goes on with 2 workers (faults.min_workers = 2)" in err

    records = events(run_dir)
    membership = [e for e in records if e["event"] == "membership"]
    assert [(e["lost_rank"], e["workers"]) for e in membership] == [(2, 2)]
    resumed = next(e for e in records if e["event"] == "restart")
    step = int(resumed["resume_step"])
    results = json.loads((run_dir / "results.json").read_text())
    assert results["world_size"] == 2 and results["restarts"] == 1

    # the same path taken by hand: 3 workers up to that checkpoint, then 2 from it
    ref = tmp_path / "ref"
    shoal.train(elastic_job({}) | {"run": {"dir": str(ref), "name": "ref"}})
    checkpoint = ref / "ref" / "checkpoints" / f"step-{step:08d}"
    reference = shoal.train(resume=checkpoint, workers=2)
    assert results["steps"] == reference["steps"]
    ours, theirs = final_state(results), final_state(reference)
    for part in ("model", "optimizer", "progress"):
        assert_identical(ours[part], theirs[part], part)
    status = run_shoal("status", str(run_dir), cwd=tmp_path).stdout.splitlines()
    assert len(status) == 2 + 2  # header, columns, the two ranks left
    no_worker_left(run_dir)


def test_a_lost_federated_worker_s_clients_move_to_the_others(tmp_path: Path) -> None:
    """Clients 2 and 5 lived on worker 2 (client c on worker c mod 3); once it is given up
    they live on workers 0 and 1, and every round from the resumed one equals that round
    of a run resumed by hand with 2 workers (the same fixed order of aggregation)."""
    sections = chaos_job(0)
    sections["strategy"] = {"type": "federated", "workers": 3, "num_clients": 6, "rounds": 8,
                            "local_epochs": 1}  # fmt: skip
    sections["train"] = {**sections["train"], "epochs": None}  # the length is strategy.rounds
    sections["checkpoint"] = {"every_steps": 2, "keep_last": 100}
    faults = {"max_restarts": 1, "restart_backoff_s": 0.1, "min_workers": 2,
              "max_rank_failures": 1, "inject": {"rank": 2, "step": 5, "kind": "exit"}}  # fmt: skip
    run_dir = tmp_path / "runs" / "fed"
    results = shoal.train(sections | {"faults": faults, "run": {"dir": str(run_dir.parent),
                                                                 "name": "fed"}})  # fmt: skip
    assert results["world_size"] == 2 and results["restarts"] == 1
    records = events(run_dir)
    membership = [e for e in records if e["event"] == "membership"]
    assert [(e["lost_rank"], e["workers"]) for e in membership] == [(2, 2)]
    step = int(next(e for e in records if e["event"] == "restart")["resume_step"])
    assert step == 4  # the newest checkpoint before round 5
    assert "clients [0, 2, 4] hosted here" in (run_dir / "logs" / "rank-0.log").read_text()

    ref = tmp_path / "ref"
    shoal.train(sections | {"run": {"dir": str(ref), "name": "ref"}})
    reference = shoal.train(resume=ref / "ref" / "checkpoints" / f"step-{step:08d}", workers=2)
    assert results["rounds"] == reference["rounds"] == 8
    ours, theirs = final_state(results), final_state(reference)
    for part in ("model", "server", "federated", "progress"):
        assert_identical(ours[part], theirs[part], part)


def test_min_workers_is_refused_for_a_strategy_that_cannot_shrink(tmp_path: Path) -> None:
    sections = chaos_job(2)
    sections["strategy"] = {"type": "population_based", "workers": 2,
                            "search_space": {"lr": {"kind": "log", "low": 0.01, "high": 0.1}}}  # fmt: skip
    sections["faults"] = {"max_restarts": 2, "min_workers": 1}
    done = run_shoal("train", str(write_job(tmp_path, **sections)), cwd=tmp_path)
    assert done.returncode == 2
    # refused by the config's validation, at the field's line (`shoal config validate` too)
    assert re.fullmatch(
        r"\S*job\.toml:\d+: faults\.min_workers: strategy 'population_based' cannot go on with "
        r"fewer workers than it started with; remove min_workers \(restarts keep every worker\)",
        done.stderr.strip(),
    ), done.stderr
