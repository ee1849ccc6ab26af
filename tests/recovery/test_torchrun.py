"""Under torchrun: a restarted job resumes its own run by itself; a stopped rank is named
within the heartbeat timeout, not after the collective timeout."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest

import shoal
from shoal.launch.processes import descendants, environ
from tests.conftest import final_state, run_shoal, small_job
from tests.hostile.jobs import TORCHRUN, finish, start_torchrun, wait_for, wait_for_step
from tests.recovery.chaos import assert_identical

pytestmark = pytest.mark.skipif(
    shutil.which("torchrun", path=str(TORCHRUN.parent)) is None,
    reason="torchrun not installed next to this python",
)


@pytest.mark.slow  # 16 s; the shoal launcher's restarts stay in make test (test_restarts.py)
def test_a_job_torchrun_restarts_resumes_its_own_run_exactly(runs: Path, tmp_path: Path) -> None:
    sections = {
        "strategy": {"type": "data_parallel", "num_replicas": 2},
        "train": {"epochs": 3},
        "checkpoint": {"every_steps": 5},
    }
    reference = shoal.train(small_job(runs / "ref", **sections))
    job = small_job(runs, **sections, faults={"inject": {"rank": 1, "step": 27, "kind": "exit"}})
    job["run"] = {"dir": str(runs), "name": "tr"}
    code, _, err = finish(start_torchrun(tmp_path, job, "--max-restarts", "1"), timeout=240)
    assert code == 0, err[-3000:]
    assert sorted(p.name for p in runs.iterdir()) == ["ref", "tr"]  # no second run directory
    results = json.loads((runs / "tr" / "results.json").read_text())
    log = (runs / "tr" / "logs" / "rank-0.log").read_text()
    assert "resumed from" in log and "checkpoints/step-00000025" in log
    assert results["steps"] == reference["steps"]
    ours, theirs = final_state(results), final_state(reference)
    for part in ("model", "optimizer", "progress"):
        assert_identical(ours[part], theirs[part], part)
    # `shoal status` reads what rank 0 wrote under torchrun: the restart, both ranks done
    header, _, *rows = run_shoal("status", str(runs / "tr"), cwd=tmp_path).stdout.splitlines()
    assert header.endswith(": done; restarts 1 of 1 (faults.max_restarts)"), header
    assert [row.split()[:3] for row in rows] == [["0", "worker", "done"], ["1", "worker", "done"]]


@pytest.mark.slow  # 8 s; a SIGSTOPped worker under shoal's launcher: test_hang_detection.py
def test_a_stopped_rank_under_torchrun_is_named_within_the_heartbeat_timeout(
    runs: Path, tmp_path: Path
) -> None:
    job = small_job(
        runs,
        strategy={"type": "data_parallel", "num_replicas": 2},
        train={"epochs": 400},
        monitor={"progress": "off", "log_every_steps": 1},
        faults={"heartbeat_timeout_s": 3, "timeout_s": 300,
                "inject": {"rank": 0, "step": 0, "kind": "slow", "delay_s": 0.05}},
    )  # fmt: skip
    job["run"] = {"dir": str(runs), "name": "hang"}
    torchrun = start_torchrun(tmp_path, job)
    wait_for_step(runs / "hang", 5)

    def rank_1() -> int | None:
        found = [p for p in descendants(torchrun.pid) if environ(p).get("RANK") == "1"]
        return found[0] if found else None

    victim = wait_for(rank_1, 30, "rank 1 under torchrun")
    os.kill(victim, signal.SIGSTOP)
    stopped = time.monotonic()
    log = runs / "hang" / "logs" / "rank-0.log"
    try:  # torchrun would wait 30 s for the stopped process to take its SIGTERM
        wait_for(lambda: "stopped responding" in log.read_text(), 30, "rank 1 named")
        named_after = time.monotonic() - stopped
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    code, _, err = finish(torchrun, timeout=60)
    assert code != 0
    named = [line for line in err.splitlines() if line.startswith("shoal: rank 1 on host")]
    assert named and "stopped responding: no heartbeat for" in named[0], err[-3000:]
    silent = float(re.search(r"no heartbeat for ([\d.]+) s", named[0]).group(1))  # type: ignore[union-attr]
    assert 3 <= silent < 3 + 2  # named at the heartbeat timeout, not the collective's 300 s
    assert named_after < 3 + 5
