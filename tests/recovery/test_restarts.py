"""`[faults] max_restarts`: a job whose workers are killed comes back by itself, exactly."""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path

import pytest

import shoal
from shoal.errors import ShoalError
from shoal.recovery.status import read_status
from shoal.run import RunPaths
from shoal.run.lock import RunInUse, RunLock
from tests.conftest import final_state, run_shoal, small_job
from tests.hostile.jobs import finish, no_worker_left, start, wait_for, write_job
from tests.recovery.chaos import assert_identical, chaos_job, current_step, events, strike


# 16 s; make test keeps a restart that resumes exactly (tests/hostile/test_signals.py
# test_a_stopped_run_resumes_exactly, tests/checkpoint/test_resume.py, test_snapshots.py)
@pytest.mark.slow
def test_a_data_parallel_job_killed_twice_ends_bit_identical(tmp_path: Path) -> None:
    # 15 epochs (930 steps): after the first restart the job must outlive the checks below
    # (a `shoal status` process among them) before the second strike; at 5 epochs it could
    # end in 1.6 s, before the strike's step was seen
    reference = shoal.train(chaos_job(0, epochs=15) | {"run": {"dir": str(tmp_path / "ref")}})
    config = write_job(tmp_path, **chaos_job(3, epochs=15))
    run_dir = tmp_path / "runs" / "job"
    rng = random.Random(13)
    launcher = start("train", str(config), cwd=tmp_path)
    first = strike(launcher, run_dir, 0, rng.randint(10, 60), rank=rng.randint(0, 1))
    with pytest.raises(RunInUse):  # the launcher keeps the run between attempts
        RunLock(RunPaths(run_dir).lock).acquire()
    wait_for(lambda: current_step(run_dir, 1), 60, "a step after the first restart")
    # status.json is rewritten twice a second from the heartbeats: a restarted rank's role
    # shows once its first heartbeat was read, which may come after rank 0's first step
    wait_for(lambda: board_knows_every_role(run_dir), 30, "status.json to show both roles")
    live = run_shoal("status", str(run_dir), cwd=tmp_path)
    second = strike(launcher, run_dir, 1, rng.randint(70, 120), rank=rng.randint(0, 1))
    code, _, err = finish(launcher, timeout=180)
    assert code == 0, err[-3000:]
    assert second > first

    results = json.loads((run_dir / "results.json").read_text())
    assert results["restarts"] == 2 and len(results["failures"]) == 2
    assert all(r["reason"].startswith("rank ") for r in results["failures"])
    assert results["lost_steps"] == sum(r["lost_steps"] for r in results["failures"])
    assert all(0 <= r["lost_steps"] <= 7 + 10 for r in results["failures"])  # every 7 steps
    assert all(s is not None and s > 0 for s in results["recovery_s"])
    assert results["steps"] == reference["steps"]
    ours, theirs = final_state(results), final_state(reference)
    for part in ("model", "optimizer", "progress"):
        assert_identical(ours[part], theirs[part], part)
    assert results["valid"] == reference["valid"]

    kinds = [e["event"] for e in events(run_dir)]
    assert kinds.count("failure") == 2 and kinds.count("restart") == 2
    assert kinds.count("recovered") == 2
    assert err.count("shoal: warning: rank ") == 2 and "Traceback" not in err

    assert live.returncode == 0, live.stderr
    header, _, *rows = live.stdout.splitlines()
    assert ": running (updated " in header and header.endswith(
        "restarts 1 of 3 (faults.max_restarts)"
    )
    for row in rows:  # rank, role, state, step, heartbeat age, restarts, failures
        _, role, state, *_, restarts, _failures = row.split()
        assert role == "worker" and restarts == "1"
        assert state in ("starting", "training", "evaluating", "checkpointing"), row
    ended = run_shoal("status", str(run_dir), cwd=tmp_path)
    header, _, *rows = ended.stdout.splitlines()
    assert header.endswith("done; restarts 2 of 3 (faults.max_restarts)")
    assert [row.split()[:3] for row in rows] == [["0", "worker", "done"], ["1", "worker", "done"]]
    assert [int(row.split()[2 + 1]) for row in rows] == [reference["steps"]] * 2
    no_worker_left(run_dir)


def board_knows_every_role(run_dir: Path) -> bool:
    try:
        ranks = read_status(RunPaths(run_dir))["ranks"]
    except ShoalError:  # not written yet
        return False
    return all(rank["role"] == "worker" for rank in ranks)


def test_a_users_error_is_not_restarted(tmp_path: Path) -> None:
    """Non-finite gradients would come back at the same step: the job halts, exit 3."""
    sections = chaos_job(2)
    sections["faults"] = {**sections["faults"], "inject": {"rank": 1, "step": 3, "kind": "nan"}}
    config = write_job(tmp_path, **sections)
    done = run_shoal("train", str(config), cwd=tmp_path, timeout=120)
    assert done.returncode == 3, done.stderr
    assert "restart" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    failures = [e for e in events(tmp_path / "runs" / "job") if e["event"] == "failure"]
    assert [f["restartable"] for f in failures] == [False]
    status = run_shoal("status", str(tmp_path / "runs" / "job"), cwd=tmp_path)
    assert status.stdout.splitlines()[0].endswith("failed; restarts 0 of 2 (faults.max_restarts)")


def test_restarts_stop_at_max_restarts(tmp_path: Path) -> None:
    config = write_job(tmp_path, **chaos_job(1))
    run_dir = tmp_path / "runs" / "job"
    launcher = start("train", str(config), cwd=tmp_path)
    strike(launcher, run_dir, 0, 10, rank=1)
    strike(launcher, run_dir, 1, 20, rank=0, sig=signal.SIGSTOP)
    code, _, err = finish(launcher, timeout=120)
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("rank 0 is stopped (process ") and last.endswith(
        "(after 1 restarts: faults.max_restarts = 1)"
    )
    no_worker_left(run_dir)


def test_a_job_inside_this_process_says_in_one_line_that_it_cannot_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    faults = {"max_restarts": 3}
    results = shoal.train(small_job(tmp_path, faults=faults))
    assert results["steps"] > 0  # it trains all the same
    warnings = [x for x in capsys.readouterr().err.splitlines() if x.startswith("shoal: warning")]
    assert warnings == [
        "shoal: warning: faults.max_restarts = 3 does nothing here: strategy 'local' trains "
        "inside this process, which cannot restart itself; for automatic restarts run it in one "
        'worker process: [strategy] type = "data_parallel", num_replicas = 1 (the same training)'
    ]
    shoal.train(small_job(tmp_path, faults={"max_restarts": 0}))  # the default: no warning
    assert "shoal: warning" not in capsys.readouterr().err
