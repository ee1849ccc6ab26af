"""The pieces of recovery without processes: where a restart resumes, the backoff, the status."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from shoal.config.sections import FaultsConfig
from shoal.errors import JobFailed, ShoalError
from shoal.recovery.restarts import Failure, RestartLog, newest_state
from shoal.recovery.status import RankStatus, StatusBoard, status_lines
from shoal.run import RunPaths, create_run_dir


def _fake_checkpoint(folder: Path, step: int) -> Path:
    """A folder that read_meta accepts (sealed meta.json, a checksum per file)."""
    from shoal.checkpoint.integrity import FORMAT_VERSION, seal, sha256_file

    path = folder / f"step-{step:08d}"
    path.mkdir(parents=True)
    (path / "state.pt").write_bytes(b"state")
    meta = {
        "format": FORMAT_VERSION,
        "step": step,
        "sha256": {"state.pt": sha256_file(path / "state.pt")},
    }
    (path / "meta.json").write_text(json.dumps(seal(meta)))
    return path


def test_a_restart_resumes_from_the_newest_of_checkpoints_and_snapshots(tmp_path: Path) -> None:
    paths = create_run_dir(tmp_path, "run")
    assert newest_state(paths, None).path is None  # nothing yet: the job's start
    _fake_checkpoint(paths.checkpoints, 10)
    newest = _fake_checkpoint(paths.checkpoints, 20)
    (paths.checkpoints / ".step-00000030.tmp").mkdir()  # a killed attempt's half-written one
    snapshots = tmp_path / "shm"
    _fake_checkpoint(snapshots, 18)
    assert newest_state(paths, None, snapshots).path == str(newest)
    snapshot = _fake_checkpoint(snapshots, 23)
    point = newest_state(paths, None, snapshots)
    assert (point.path, point.step) == (str(snapshot), 23)
    (paths.checkpoints / "step-00000040").mkdir()  # damaged: never passed over silently
    with pytest.raises(ShoalError, match="step-00000040: not a checkpoint"):
        newest_state(paths, None, snapshots)


def test_backoff_doubles_while_attempts_make_no_progress(tmp_path: Path) -> None:
    faults = FaultsConfig(max_restarts=5, restart_backoff_s=1.0, restart_backoff_max_s=3.0)
    log = RestartLog(RunPaths(tmp_path), faults)
    assert [log.backoff_s(False) for _ in range(4)] == [1.0, 2.0, 3.0, 3.0]
    assert log.backoff_s(True) == 1.0
    crash = Failure(JobFailed("rank 1 was killed by SIGKILL"), 1, 5, restartable=True)
    user = Failure(ShoalError("task.data: bad"), 0, 5, restartable=False)
    assert log.allows(crash) and not log.allows(user)


def test_status_lines_name_every_rank_and_a_launcher_that_is_gone(tmp_path: Path) -> None:
    paths = create_run_dir(tmp_path, "run")
    board = StatusBoard(paths, max_restarts=3)
    now = time.time()
    ranks = [
        RankStatus(0, "worker", "training", 41, now - 0.5, 1, 0, os.getpid()),
        RankStatus(1, "server", "starting", -1, None, 1, 1, None),
    ]
    board.write("running", 1, ranks)
    header, columns, *rows = status_lines(paths, now)
    assert ": running (updated " in header and header.endswith(
        "restarts 1 of 3 (faults.max_restarts)"
    )
    assert columns.split() == ["rank", "role", "state", "step", "heartbeat", "restarts", "failures"]
    assert rows[0].split() == ["0", "worker", "training", "41", "0.5", "s", "ago", "1", "0"]
    assert rows[1].split() == ["1", "server", "starting", "-", "-", "1", "1"]
    data = json.loads((paths.root / "status.json").read_text())
    data["launcher"]["pid"] = 2**22 + 1  # no such process
    (paths.root / "status.json").write_text(json.dumps(data))
    assert "its launcher is gone" in status_lines(paths)[0]
    with pytest.raises(ShoalError, match=r"status\.json: missing"):
        status_lines(create_run_dir(tmp_path, "other"))


def test_a_torchrun_restart_with_fewer_workers_goes_on_only_down_to_min_workers(
    tmp_path: Path,
) -> None:
    from shoal.recovery.rejoin import check_membership

    paths = create_run_dir(tmp_path, "run")
    elastic = FaultsConfig(min_workers=2)
    assert check_membership(elastic, 4, 4, 1, 21, paths, elastic=True) is None
    assert check_membership(elastic, 4, 2, 1, 21, paths, elastic=True) == (
        "torchrun started the job again (restarts 1): it goes on with 2 workers from 4 "
        "(faults.min_workers = 2), resumed at step 21 with the same global batch"
    )
    with pytest.raises(ShoalError, match=r"with 1 workers, fewer than faults.min_workers = 2"):
        check_membership(elastic, 2, 1, 2, 28, paths, elastic=True)
    with pytest.raises(ShoalError, match=r"faults.min_workers = 0 never shrinks a job"):
        check_membership(FaultsConfig(), 4, 2, 1, 21, paths, elastic=True)
    assert check_membership(elastic, 2, 4, 3, 35, paths, elastic=True) == (
        "torchrun started the job again (restarts 3): it grows back to 4 workers from 2, "
        "resumed at step 35 with the same global batch"
    )
    records = [json.loads(x) for x in paths.metrics.read_text().splitlines()]
    assert [(r["event"], r["was"], r["workers"], r["step"]) for r in records] == [
        ("membership", 4, 2, 21),
        ("membership", 2, 4, 35),
    ]


def test_a_run_is_found_again_by_its_torchrun_agents_or_a_counted_restart(tmp_path: Path) -> None:
    from shoal.recovery.rejoin import agent_identity, mark_run, marked_run

    mine = agent_identity()
    assert mine and mine == agent_identity(os.getppid()) and mine != agent_identity(os.getpid())
    assert agent_identity(2**22 + 1) == ""  # no such process
    paths = create_run_dir(tmp_path, "job")
    mark_run(paths, "none", {"h0-agent", "h1-agent"})
    create_run_dir(tmp_path, "job")  # job-1: another run of the config, unmarked
    assert marked_run(tmp_path, "job", "none", {"h0-agent", "h1-again"}) == paths  # a round
    assert marked_run(tmp_path, "job", "none", {"other-agent"}) is None  # a new torchrun job
    assert marked_run(tmp_path, "job", "none", {"other-agent"}, restarted=True) == paths
    assert marked_run(tmp_path, "job", "other-id", {"h0-agent"}) is None
    mark_run(paths, "none", {"h1-again", ""})  # the agents of earlier rounds are kept
    mark = json.loads((paths.root / "torchrun.json").read_text())
    assert mark == {"run_id": "none", "agents": ["h0-agent", "h1-again", "h1-agent"]}


def test_a_job_that_shrinks_under_the_agent_s_shared_store_says_how_to_grow_back(
    tmp_path: Path,
) -> None:
    from shoal.recovery.rejoin import check_membership

    paths = create_run_dir(tmp_path, "run")
    faults = FaultsConfig(min_workers=2)
    line = check_membership(faults, 4, 2, 1, 21, paths, elastic=True, can_grow=False)
    assert line is not None and line.endswith(
        "; it cannot grow back while it runs: torch's shared agent store leaves a host that "
        "returns waiting, export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for torchrun on every "
        "host to allow it"
    )
    grown = check_membership(faults, 2, 4, 1, 28, paths, elastic=True, can_grow=False)
    assert grown is not None and "TORCH_DISABLE" not in grown


def test_a_snapshot_replica_travels_as_plain_bytes_and_refuses_a_path(tmp_path: Path) -> None:
    from shoal.recovery.replicas import pack, replica_peer, unpack_into
    from shoal.shape.hosts import Hosts

    snapshot = _fake_checkpoint(tmp_path / "rank0", 12)
    kept = tmp_path / "peer"
    _fake_checkpoint(kept, 9)  # an older replica: replaced
    copy = unpack_into(pack(snapshot), kept, snapshot.name)
    assert [p.name for p in kept.iterdir()] == [snapshot.name]
    assert newest_state(create_run_dir(tmp_path, "run"), None, kept).path == str(copy)
    with pytest.raises(ShoalError, match=r"a bad file entry '../x'"):
        unpack_into(b"\x04\x00../x" + (0).to_bytes(8, "little"), kept, "step-00000013")
    assert replica_peer(Hosts.consecutive(4, 2)) == 2  # rank 0's host -> the next host's first
    assert replica_peer(Hosts.single(4)) is None  # one host: the launcher's tmpfs (snapshots.py)


def test_status_prints_no_terminal_control_characters(tmp_path: Path) -> None:
    """status.json is a file in the run directory: whatever it holds, `shoal status` prints
    no escape sequence (the terminal would act on it) and no traceback."""
    paths = create_run_dir(tmp_path, "run")
    hostile = {
        "state": "running\x1b[2J\x1b]0;pwned\x07",
        "launcher": {"pid": 2**80, "host": os.uname().nodename},
        "updated": "soon\x9b",
        "restarts": "\x1b[31m1",
        "max_restarts": 3,
        "ranks": [
            {
                "rank": "0\r\x1b[K",
                "role": "worker\x1b]52;c;ZXZpbA==\x07",
                "state": "tra\u202eining",
                "step": 7,
                "beat": float("nan"),
                "restarts": 0,
                "failures": "\x00",
            },
            "not a rank",
        ],
    }
    (paths.root / "status.json").write_text(json.dumps(hostile))
    lines = status_lines(paths, time.time())
    text = "\n".join(lines)
    assert not [c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F], text
    assert "\u202e" not in text
    assert "\\x1b[2J" in lines[0] and "\\x1b]52;c;ZXZpbA==\\x07" in text
    assert lines[2].split()[3] == "7"
