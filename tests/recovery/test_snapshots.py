"""`[faults] snapshot_every_steps`: a restart resumes from the newest in-memory snapshot, losing
at most that many steps, even when the rank that wrote it is the one killed."""

from __future__ import annotations

import json
from pathlib import Path

import shoal
from shoal.recovery.snapshots import snapshot_dir
from shoal.run import RunPaths
from tests.conftest import final_state
from tests.hostile.jobs import finish, no_worker_left, start, write_job
from tests.recovery.chaos import assert_identical, chaos_job, events, strike


def test_a_restart_from_a_snapshot_loses_at_most_snapshot_every_steps(tmp_path: Path) -> None:
    sections = chaos_job(2)
    sections["checkpoint"] = {"every_steps": 1000}  # disk checkpoints would lose everything
    sections["faults"] = {**sections["faults"], "snapshot_every_steps": 3}
    reference = shoal.train(chaos_job(0) | {"run": {"dir": str(tmp_path / "ref")}})
    config = write_job(tmp_path, **sections)
    run_dir = tmp_path / "runs" / "job"
    launcher = start("train", str(config), cwd=tmp_path)
    strike(launcher, run_dir, 0, 100, rank=0)  # rank 0 writes the snapshots
    code, _, err = finish(launcher, timeout=180)
    assert code == 0, err[-3000:]

    records = events(run_dir)
    restart = next(i for i, e in enumerate(records) if e["event"] == "restart")
    reached = max(int(e["step"]) for e in records[:restart] if e["event"] == "train")
    resumed = records[restart]
    assert str(resumed["resume_from"]).startswith(str(snapshot_dir(RunPaths(run_dir))))
    assert reached - 3 <= int(resumed["resume_step"]) <= reached
    assert not snapshot_dir(RunPaths(run_dir)).exists()  # the launcher removed them

    results = json.loads((run_dir / "results.json").read_text())
    assert results["restarts"] == 1 and results["steps"] == reference["steps"]
    ours, theirs = final_state(results), final_state(reference)
    for part in ("model", "optimizer", "progress"):
        assert_identical(ours[part], theirs[part], part)
    no_worker_left(run_dir)
