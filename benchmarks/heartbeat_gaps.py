"""The longest silence between a worker's heartbeats while it evaluates and checkpoints.

A heartbeat timeout must be longer than the longest gap a healthy worker leaves
between two heartbeats, or long evaluations and checkpoint writes of a big model
raise false alarms. This runs a real `shoal train` job (data_parallel, an MLP of
`--hidden` units, Adam: the checkpoint holds the parameters three times) and reads
its workers' heartbeats from the job's store the way the launcher does (the port
and the job's secret from the workers' environment: this process is the same user),
recording every gap between consecutive heartbeats and what rank 0 was doing then
(from its log). Prints the worst gap per phase and the checkpoint size.

    .venv/bin/python benchmarks/heartbeat_gaps.py --hidden 4096 4096 4096
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import tomli_w
import torch.distributed as dist

from shoal.launch.processes import children, environ
from shoal.launch.watch import StoreReader
from shoal.runtime.auth import SECRET_ENV, Signer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, nargs="+", default=[4096, 4096, 4096])
    parser.add_argument("--features", type=int, default=1024)
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hb-gaps-"))
    job = {
        "task": {
            "type": "classification",
            "data": {"samples": args.samples, "features": args.features, "classes": 8},
            "model": {"hidden": args.hidden},
        },
        "strategy": {"type": "data_parallel", "num_replicas": args.workers},
        "train": {"epochs": args.epochs, "batch_size": 256, "optimizer": {"kind": "adam"}},
        "checkpoint": {"every_epochs": 1, "keep_last": 1, "keep_best": True},
        "run": {"dir": str(work / "runs"), "name": "gaps"},
        "monitor": {"progress": "plain", "log_every_steps": 1},
        "faults": {"heartbeat_timeout_s": 3600},  # measure, never fail
    }
    (work / "job.toml").write_text(tomli_w.dumps(job))
    run_dir = work / "runs" / "gaps"
    report = {}
    for name, command in (
        ("train", ["train", str(work / "job.toml"), "--force"]),
        # a resume reads (and verifies) the big checkpoint, then trains one more epoch
        (
            "resume",
            ["train", "--resume", str(run_dir), "--set", f"train.epochs={args.epochs + 1}"],
        ),
    ):
        report[name] = measure(command, args.workers, run_dir)
    size = sum(f.stat().st_size for f in (run_dir / "checkpoints").rglob("state.pt"))
    report["hidden"] = args.hidden
    report["checkpoint_state_bytes"] = size
    report["interval_s"] = 1.0
    report["load_average"] = os.getloadavg()
    print(json.dumps(report, indent=1))


def measure(command: list[str], workers: int, run_dir: Path) -> dict[str, object]:
    """Run `shoal COMMAND` and record its workers' heartbeats as the launcher sees them."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "shoal", *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # exec'd workers: their /proc environ holds the job's secret and port (a forked
        # worker's shows its forkserver's, shoal/launch/start.py)
        env=dict(os.environ, SHOAL_WORKER_START="exec"),
    )
    while len(children(launcher.pid)) < workers and launcher.poll() is None:
        time.sleep(0.05)
    env = environ(children(launcher.pid)[0])
    store = dist.TCPStore(
        "127.0.0.1",
        int(env["MASTER_PORT"]),
        is_master=False,
        timeout=datetime.timedelta(seconds=60),
        wait_for_workers=False,
    )
    reader = StoreReader(store, Signer(env[SECRET_ENV]), print)
    beats: dict[int, list[float]] = {r: [] for r in range(workers)}
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            for rank in beats:
                beat = reader.heartbeat(rank)
                if beat and (not beats[rank] or beat[0] != beats[rank][-1]):
                    beats[rank].append(beat[0])
            time.sleep(0.02)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    code = launcher.wait()
    done.set()
    thread.join()
    log = (run_dir / "logs" / "rank-0.log").read_text().splitlines()
    events = []  # (wall time, what rank 0 started doing)
    for line in log:
        stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        events.append((stamp, line[24:].split(" ", 2)[-1][:60]))
    worst: dict[str, float] = {}
    for times in beats.values():
        for before, after in itertools.pairwise(times):
            doing = [what for at, what in events if at <= after]
            phase = doing[-1] if doing else "starting"
            phase = phase.split(":")[0].split(" step")[0]
            worst[phase] = max(worst.get(phase, 0.0), after - before)
    del store
    return {
        "exit_code": code,
        "heartbeats": {r: len(t) for r, t in beats.items()},
        "worst_gap_s_after_rank0_log_line": dict(sorted(worst.items(), key=lambda kv: -kv[1])[:6]),
        "worst_gap_s": max(worst.values(), default=0.0),
    }


if __name__ == "__main__":
    main()
