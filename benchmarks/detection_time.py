"""How long the launcher takes to name a stopped or frozen worker, with the default settings.

Two faults, each `--repeats` times, on a 2-worker data-parallel job (default
`[faults]`): `sigstop` (SIGSTOP to rank 1 while it trains; the launcher reads
its process state) and `hang` (`[faults.inject] kind = "hang"` at step 20: the
process runs on but its heartbeat stops). Detection time: from the fault to the
launcher's exit, read from the clock of this process (`sigstop`) or from the
fault's log line in rank 1's log (`hang`). Prints the figures and their median.

    .venv/bin/python benchmarks/detection_time.py --repeats 5
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

from shoal.launch.processes import descendants, rank_of

JOB = {
    "task": {"type": "classification", "data": {"samples": 4000}},
    "strategy": {"type": "data_parallel", "num_replicas": 2},
    "train": {"epochs": 50, "batch_size": 64},
    "monitor": {"progress": "off"},
}


def once(kind: str, work: Path, index: int) -> float:
    job = json.loads(json.dumps(JOB))
    job["run"] = {"dir": str(work / "runs"), "name": f"{kind}-{index}"}
    if kind == "hang":
        job["faults"] = {"inject": {"rank": 1, "step": 20, "kind": "hang"}}
    path = work / f"{kind}-{index}.toml"
    path.write_text(tomli_w.dumps(job))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "shoal", "train", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = work / "runs" / f"{kind}-{index}" / "logs" / "rank-1.log"
    while not (log.is_file() and "training classification" in log.read_text()):
        time.sleep(0.05)
    if kind == "sigstop":
        time.sleep(1.0)
        rank1 = next(p for p in descendants(launcher.pid) if rank_of(p) == 1)
        os.kill(rank1, signal.SIGSTOP)
        fault_at = time.time()
    _, err = launcher.communicate(timeout=300)
    ended = time.time()
    if kind == "hang":
        line = next(x for x in log.read_text().splitlines() if "fault injection: hang" in x)
        fault_at = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    print(f"{kind} #{index}: {ended - fault_at:.2f} s: {err.strip().splitlines()[-1][:110]}")
    return ended - fault_at


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="detection-"))
    figures = {
        kind: [once(kind, work, i) for i in range(args.repeats)] for kind in ("sigstop", "hang")
    }
    for kind, seconds in figures.items():
        shown = ", ".join(f"{s:.2f}" for s in seconds)
        print(
            f"{kind}: median {statistics.median(seconds):.2f} s (max {max(seconds):.2f}): {shown}"
        )
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
