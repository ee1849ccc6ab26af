"""Heartbeats across hosts: silent ranks are named by host, a finished rank is not lost,
and a store that stops answering names the host it lives on.

The ranks are threads with their own store clients of one real TCP store on
127.0.0.1 (port chosen by the OS); `on_lost` records the verdict instead of
ending the process.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from shoal.config.sections import FaultsConfig
from shoal.launch.hostwatch import HostWatch, StoreAddress, lost_message
from shoal.recovery.status import StatusBoard, read_status, status_lines
from shoal.run import create_run_dir
from shoal.runtime.auth import Signer
from shoal.shape.hosts import Hosts

FAULTS = FaultsConfig(heartbeat_interval_s=0.1, heartbeat_timeout_s=1.0)
HOSTS = Hosts.from_ranks([("h0", "127.0.0.1"), ("h1", "10.213.0.2")])


def test_the_message_names_whole_hosts_with_their_ranks_and_single_ranks() -> None:
    hosts = Hosts.from_ranks([("n0", "10.1.0.1")] * 2 + [("n1", "10.1.0.2")] * 2 + [("n2", "10.1.0.3")] * 2)  # fmt: skip
    assert lost_message(hosts, {2: 5.2, 3: 5.31, 4: 6.0}, 5.0) == (
        "host n1 (10.1.0.2) lost: ranks 2, 3 sent no heartbeat for 5.3 s; rank 4 on host n2 "
        "(10.1.0.3) stopped responding: no heartbeat for 6.0 s "
        "(faults.heartbeat_timeout_s = 5); the job stops"
    )


def watches(
    master: dist.TCPStore, verdicts: dict[int, str], key: str, board: StatusBoard | None = None
) -> list[HostWatch]:
    """Ranks 0 and 1 on hosts h0 and h1; `key`: the attempt's key (every attempt has its own);
    `board`: rank 0 keeps status.json there, in the job's first restart."""
    signer = Signer(key * 32)
    log = logging.getLogger("test-hostwatch")
    return [
        HostWatch(
            StoreAddress("127.0.0.1", master.port),
            rank,
            HOSTS,
            FAULTS,
            signer,
            log,
            on_lost=lambda message, rank=rank: verdicts.__setitem__(rank, message),
            board=board if rank == 0 else None,
            restarts=1,
            max_restarts=2,
        )
        for rank in range(2)
    ]


def wait_for(verdicts: dict[int, str], rank: int, limit_s: float) -> float:
    started = time.monotonic()
    while rank not in verdicts and time.monotonic() - started < limit_s:
        time.sleep(0.05)
    return time.monotonic() - started


def test_a_silent_host_is_named_within_the_timeout_and_a_finished_one_is_not() -> None:
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    verdicts: dict[int, str] = {}
    first = watches(master, verdicts, "a")
    first[1].finish(ok=True)
    time.sleep(2 * FAULTS.heartbeat_timeout_s)
    assert verdicts == {}  # rank 1 said it was done before it stopped beating
    first[0].finish(ok=True)

    verdicts.clear()
    lost: list[Any] = watches(master, verdicts, "b")
    try:
        lost[1]._stop.set()  # host h1 goes silent without a word: as if it lost power
        lost[1].heartbeat.stop()
        took = wait_for(verdicts, 0, 5.0)
        assert verdicts[0].startswith(
            "host h1 (10.213.0.2) lost: rank 1 sent no heartbeat for 1."
        ), verdicts
        assert took < FAULTS.heartbeat_timeout_s + 3 * FAULTS.heartbeat_interval_s + 0.5
        assert lost[0].explain(within_s=0) == verdicts[0]
    finally:
        for watch in lost:
            watch.finish(ok=False)
    del master


def test_a_store_that_stops_answering_names_its_host() -> None:
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    verdicts: dict[int, str] = {}
    running = watches(master, verdicts, "c")
    try:
        time.sleep(0.3)
        del master  # the store's host (h0, 127.0.0.1) is gone
        wait_for(verdicts, 1, 8.0)
        assert verdicts.get(1, "").startswith("host h0 lost: the job's store there (127.0.0.1:"), (
            verdicts
        )
        assert "its ranks 0" in verdicts[1]
    finally:
        for watch in running:
            watch.finish(ok=False)


def _ranks(paths: Any) -> list[tuple[Any, ...]]:
    data = read_status(paths)
    return [(r["rank"], r["role"], r["state"], r["step"]) for r in data["ranks"]]


def test_rank_0_keeps_status_json_from_every_rank_s_heartbeat(tmp_path: Path) -> None:
    """Under torchrun or Slurm `shoal status` reads what rank 0's watch saw: every rank's
    role, state and step while the job runs, done at its end, a lost rank as failed."""
    paths = create_run_dir(tmp_path, "run")
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    verdicts: dict[int, str] = {}
    board = StatusBoard(paths, max_restarts=2)
    running: list[Any] = watches(master, verdicts, "d", board)
    running[1].heartbeat.role = "server"
    running[1].heartbeat.beat(7)
    with running[1].heartbeat.doing("evaluating"):
        deadline = time.monotonic() + 5.0
        while (1, "server", "evaluating", 7) not in _ranks(paths) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _ranks(paths) == [(0, "worker", "starting", -1), (1, "server", "evaluating", 7)]
    assert read_status(paths)["state"] == "running"
    running[1].finish(ok=True)
    running[0].finish(ok=True)
    data = read_status(paths)
    assert (data["state"], data["restarts"], data["max_restarts"]) == ("done", 1, 2)
    assert [r["state"] for r in data["ranks"]] == ["done", "done"]
    header, _, *rows = status_lines(paths)
    assert header.endswith(": done; restarts 1 of 2 (faults.max_restarts)") and len(rows) == 2

    lost: list[Any] = watches(master, verdicts, "e", board)
    try:
        lost[1]._stop.set()  # rank 1's host goes silent
        lost[1].heartbeat.stop()
        wait_for(verdicts, 0, 5.0)
        data = read_status(paths)
        # torchrun has restarts left (1 of 2 used): it starts the job again
        assert data["state"] == "restarting"
        assert [r["state"] for r in data["ranks"]] == ["starting", "failed"]
    finally:
        for watch in lost:
            watch.finish(ok=False)
    del master
