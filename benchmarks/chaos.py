"""Chaos: kill or stop random workers of running jobs; count exact endings, time recoveries.

Each trial runs one 2-worker data-parallel job with `[faults] max_restarts = 25`
while this process, the chaos, strikes 1-5 times (drawn per trial): SIGKILL or
SIGSTOP to a random rank, at a random step of the current attempt. Per trial it
records whether the job ended bit-identical (model, optimizer, progress) to the
same job run without faults, each recovery time (from the signal to the first
step after the restart, the restarted job's heartbeat time), the steps lost
(the newest step logged before the restart minus the step resumed from), and
the worker processes left once the job ended.

`shoal --mode disk` resumes from disk checkpoints (every 25 steps), `shoal
--mode snapshot` from in-memory snapshots (every 3 steps, recovery/snapshots.py),
`ps --target server` strikes the dedicated servers of a sync parameter-server job
(2 workers, 2 servers: a server is restarted alone, strategies/parameter_server/
rejoin.py, and the workers lose no step) and `ps --target any` any of its 4 ranks
(a worker's failure restarts the whole job from its newest checkpoint),
and `torchrun` runs the same chaos (SIGKILL only: torchrun does not notice a
stopped worker before the collective timeout) against chaos_ddp.py, plain DDP
under `torchrun --max-restarts 25`. Trials append to a JSON-lines file, so they
run in short chunks through the CPU lock; `report` prints the table.

    one-at-a-time .venv/bin/python benchmarks/chaos.py shoal --mode disk --trials 0:5
    one-at-a-time .venv/bin/python benchmarks/chaos.py ps --target server --trials 0:5
    one-at-a-time .venv/bin/python benchmarks/chaos.py torchrun --trials 0:5
    .venv/bin/python benchmarks/chaos.py report
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomli_w
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.hostile.jobs import finish, start, wait_for  # noqa: E402
from tests.recovery.chaos import assert_identical, chaos_job, events, strike  # noqa: E402
from tests.tasks.kge.planted import write_planted_graph  # noqa: E402

from shoal.launch.processes import descendants, environ  # noqa: E402
from shoal.strategies.parameter_server.shards import SHARD_GLOB  # noqa: E402

OUT = ROOT / "benchmarks" / "chaos.jsonl"
STEPS = 310  # 5 epochs of 62 steps
JOB: dict[str, Any] = chaos_job(25)  # the restart tests' job: 2 workers, 310 steps
JOB["checkpoint"] = {"every_steps": 25}


def _job(folder: Path, name: str, mode: str | None) -> Path:
    job = json.loads(json.dumps(JOB))
    job["run"] = {"dir": str(folder / "runs"), "name": name}
    if mode is None:
        job["faults"] = {}
    elif mode == "snapshot":
        job["faults"]["snapshot_every_steps"] = 3
    path = folder / f"{name}.toml"
    path.write_text(tomli_w.dumps(job))
    return path


def _ps_job(folder: Path, name: str, chaos: bool) -> Path:
    """A sync parameter-server job: TransE on the planted graph, 2 workers and 2 dedicated
    servers (ranks 2, 3), lazy Adam (row-optimizer state on the servers), 40 epochs of 6
    steps, a validation every 10 epochs (the best model is the servers'), checkpoints every
    25 steps."""
    graph = folder / "graph"
    if not graph.exists():
        graph.mkdir()
        write_planted_graph(graph)
    job: dict[str, Any] = {
        "task": {"type": "kge", "dim": 32, "model": {"type": "transe", "p": 2},
                 "loss": {"kind": "margin_ranking"},
                 "negatives": {"num_negatives": 16, "chunk_size": 16},
                 "data": {s: str(graph / f"{s}.txt") for s in ("train", "valid", "test")}},
        "strategy": {"type": "parameter_server", "num_workers": 2, "num_servers": 2,
                     "placement": "dedicated", "mode": "sync", "barrier_timeout_s": 60.0,
                     "optimizer": {"kind": "lazy_adam", "lr": 0.01}},
        "train": {"epochs": 40, "batch_size": 32, "seed": 3, "eval_every_epochs": 10,
                  "optimizer": {"kind": "sgd", "lr": 0.5}},
        "checkpoint": {"every_steps": 25, "every_epochs": 0},
        "monitor": {"progress": "off", "log_every_steps": 1},
        "run": {"dir": str(folder / "runs"), "name": name},
        "faults": {"max_restarts": 25, "restart_backoff_s": 0.1} if chaos else {},
    }  # fmt: skip
    path = folder / f"{name}.toml"
    path.write_text(tomli_w.dumps(job))
    return path


def _state(run_dir: Path) -> dict[str, Any]:
    """What must end bit-identical: model, optimizer and progress of the final checkpoint
    (a parameter-server job: its progress, every server's shard file, and the test figures
    of the best model)."""
    results = json.loads((run_dir / "results.json").read_text())
    folder = Path(results["checkpoint"])
    state: dict[str, Any] = torch.load(folder / "state.pt", weights_only=True)
    shards = sorted(folder.glob(SHARD_GLOB))
    if not shards:
        return {part: state[part] for part in ("model", "optimizer", "progress")}
    return {
        "progress": state["progress"],
        "test": results.get("test"),
        **{f.name: torch.load(f, weights_only=True) for f in shards},
    }


def _identical(ours: dict[str, Any], theirs: dict[str, Any]) -> bool:
    try:
        assert_identical(ours, theirs, "state")
    except AssertionError:
        return False
    return True


def _leftovers(marker: str) -> int:
    time.sleep(1.0)
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    return len(found.split())


def shoal_trial(index: int, mode: str, folder: Path, reference: dict[str, Any]) -> dict[str, Any]:
    config = _job(folder, f"t{index}", mode)
    return _trial(f"shoal-{mode}", index, config, folder / "runs" / f"t{index}", [0, 1], reference)


#: the ranks `ps --target` strikes: the dedicated servers (2, 3), or any rank
PS_TARGETS = {"server": [2, 3], "any": [0, 1, 2, 3]}


def ps_trial(index: int, target: str, folder: Path, reference: dict[str, Any]) -> dict[str, Any]:
    config = _ps_job(folder, f"ps{index}", chaos=True)
    run_dir = folder / "runs" / f"ps{index}"
    return _trial(f"ps-{target}", index, config, run_dir, PS_TARGETS[target], reference, 1, 3)


def _trial(
    kind: str,
    index: int,
    config: Path,
    run_dir: Path,
    ranks: list[int],
    reference: dict[str, Any],
    fewest: int = 1,
    most: int = 5,
) -> dict[str, Any]:
    """One job under chaos: `fewest`..`most` strikes at random `ranks`, each at a random step
    of the attempt after the previous restart (a rank restarted alone: after the step the
    job had reached)."""
    rng = random.Random(f"{kind.removeprefix('shoal-')}-{index}")
    launcher = start("train", str(config), cwd=config.parent)
    strikes: list[dict[str, Any]] = []
    for k in range(rng.randint(fewest, most)):
        sig = rng.choice([signal.SIGKILL, signal.SIGSTOP])
        rank = rng.choice(ranks)
        if k == 0:
            target = rng.randint(5, 60)
        else:
            resumed = wait_for(lambda k=k: _restart(run_dir, k), 60, f"restart {k}")
            target = max(int(resumed["awaits_step"]), 0) + rng.randint(3, 40)
        try:
            at = strike(launcher, run_dir, k, target, rank, sig, timeout=120)
        except AssertionError:  # the job ended (or its attempt went past the end) first
            break
        strikes.append({"signal": signal.Signals(sig).name, "rank": rank, "step": target, "at": at})
    code, _, err = finish(launcher, timeout=300)
    records = events(run_dir)
    restarts = [e for e in records if e["event"] == "restart"]
    recovered = {e["restart"]: e["time"] for e in records if e["event"] == "recovered"}
    recovery, lost = [], []
    replayed = []  # a rank restarted alone: the clocks its peers sent it again
    for n, (hit, restart) in enumerate(zip(strikes, restarts, strict=False), start=1):
        if n in recovered:
            recovery.append(round(recovered[n] - hit["at"], 3))
        redone = current_reached(records, n) - max(int(restart["resume_step"]), 0)
        lost.append(0 if restart.get("alone") else redone)
        if restart.get("alone"):
            replayed.append(redone)
    identical = code == 0 and _identical(_state(run_dir), reference)
    return {
        "kind": kind, "trial": index, "code": code, "faults": len(strikes),
        "restarts": len(restarts), "alone": sum(bool(r.get("alone")) for r in restarts),
        "identical": identical, "recovery_s": recovery, "lost_steps": lost,
        "replayed_clocks": replayed, "strikes": strikes,
        "leftover": _leftovers(f"--run-dir {run_dir}"),
        "error": err.strip().splitlines()[-1] if code else "",
    }  # fmt: skip


def _restart(run_dir: Path, n: int) -> dict[str, Any] | None:
    found = [e for e in events(run_dir) if e["event"] == "restart"]
    return found[n - 1] if len(found) >= n else None


def current_reached(records: list[dict[str, Any]], restart: int) -> int:
    """The newest train step logged before the `restart`-th restart event."""
    seen, reached = 0, -1
    for record in records:
        if record["event"] == "restart":
            seen += 1
            if seen == restart:
                return reached
        elif record["event"] == "train":
            reached = int(record["step"])
    return reached


def _ddp(folder: Path, restarts: int) -> subprocess.Popen[str]:
    torchrun = str(Path(sys.executable).parent / "torchrun")
    folder.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "MASTER_"))}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.Popen(
        [torchrun, "--standalone", "--nproc-per-node", "2", "--max-restarts", str(restarts),
         str(ROOT / "benchmarks" / "chaos_ddp.py"), str(folder), "--steps", str(STEPS),
         "--checkpoint-every", "25"],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _ddp_steps(folder: Path) -> list[tuple[float, int, int]]:
    try:
        lines = (folder / "steps.log").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 3:
            out.append((float(parts[0]), int(parts[1]), int(parts[2])))
    return out


def torchrun_trial(index: int, folder: Path, reference: dict[str, Any]) -> dict[str, Any]:
    rng = random.Random(f"torchrun-{index}")
    trial = folder / f"ddp{index}"
    job = _ddp(trial, 25)
    strikes: list[dict[str, Any]] = []
    for k in range(rng.randint(1, 5)):
        rank = rng.randint(0, 1)
        if k == 0:
            target = rng.randint(5, 60)
        else:
            first = wait_for(
                lambda k=k: [s for s in _ddp_steps(trial) if s[2] == k], 120, f"restart {k}"
            )
            target = first[0][1] - 1 + rng.randint(3, 40)

        def ready(k: int = k, target: int = target, rank: int = rank) -> int | None:
            if job.poll() is not None:
                return -1
            if not [s for s in _ddp_steps(trial) if s[2] == k and s[1] >= target]:
                return None
            pids = [p for p in descendants(job.pid) if environ(p).get("RANK") == str(rank)]
            return pids[0] if pids else None

        pid = wait_for(ready, 120, f"step {target} of attempt {k}")
        if pid < 0:
            break
        os.kill(pid, signal.SIGKILL)
        strikes.append({"signal": "SIGKILL", "rank": rank, "step": target, "at": time.time()})
    code, _, err = finish(job, timeout=300)
    steps = _ddp_steps(trial)
    recovery, lost = [], []
    for n, hit in enumerate(strikes, start=1):
        before = [s[1] for s in steps if s[2] == n - 1]
        after = [s for s in steps if s[2] == n]
        if after:
            recovery.append(round(after[0][0] - hit["at"], 3))
            lost.append(max(before, default=0) - (after[0][1] - 1))
    identical = False
    if code == 0:
        ours = torch.load(trial / "final.pt", weights_only=True)["model"]
        identical = _identical(ours, reference)
    return {
        "kind": "torchrun-ddp", "trial": index, "code": code, "faults": len(strikes),
        "restarts": max((s[2] for s in steps), default=0), "identical": identical,
        "recovery_s": recovery, "lost_steps": lost, "strikes": strikes,
        "leftover": _leftovers(f"chaos_ddp.py {trial}"),
        "error": err.strip().splitlines()[-1] if code else "",
    }  # fmt: skip


def _reference(folder: Path, kind: str) -> dict[str, Any]:
    if kind == "ps":
        config = _ps_job(folder, "ps-reference", chaos=False)
        code, _, err = finish(start("train", str(config), cwd=folder), timeout=300)
        assert code == 0, err[-2000:]
        return _state(folder / "runs" / "ps-reference")
    if kind == "torchrun":
        trial = folder / "ddp-reference"
        code, _, err = finish(_ddp(trial, 0), timeout=300)
        assert code == 0, err[-2000:]
        model: dict[str, Any] = torch.load(trial / "final.pt", weights_only=True)["model"]
        return model
    config = _job(folder, "reference", None)
    code, _, err = finish(start("train", str(config), cwd=folder), timeout=300)
    assert code == 0, err[-2000:]
    return _state(folder / "runs" / "reference")


def report(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    print("| run | trials | bit-identical | faults | restarted alone | median recovery | "
          "worst recovery | median lost steps | worst lost | leftover processes |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kind in sorted({r["kind"] for r in rows}):
        mine = [r for r in rows if r["kind"] == kind]
        rec = [s for r in mine for s in r["recovery_s"]]
        lost = [s for r in mine for s in r["lost_steps"]]
        alone = sum(r.get("alone", 0) for r in mine)
        print(
            f"| {kind} | {len(mine)} | {sum(r['identical'] for r in mine)}/{len(mine)} | "
            f"{sum(r['faults'] for r in mine)} | {alone} | "
            f"{statistics.median(rec):.2f} s | {max(rec):.2f} s | "
            f"{statistics.median(lost):g} | {max(lost)} | {sum(r['leftover'] for r in mine)} |"
            if rec and lost
            else f"| {kind} | {len(mine)} | - | - | - | - | - | - | - | - |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["shoal", "ps", "torchrun", "report"])
    parser.add_argument("--mode", choices=["disk", "snapshot"], default="disk")
    parser.add_argument("--target", choices=sorted(PS_TARGETS), default="server", help="ps")
    parser.add_argument("--trials", default="0:20", help="START:END of the trial numbers")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.what == "report":
        report(args.out)
        return
    first, last = map(int, args.trials.split(":"))
    with tempfile.TemporaryDirectory(prefix="shoal-chaos-") as tmp:
        folder = Path(tmp)
        reference = _reference(folder, args.what)
        for index in range(first, last):
            if args.what == "shoal":
                row = shoal_trial(index, args.mode, folder, reference)
            elif args.what == "ps":
                row = ps_trial(index, args.target, folder, reference)
            else:
                row = torchrun_trial(index, folder, reference)
            print(json.dumps({k: v for k, v in row.items() if k != "strikes"}), flush=True)
            with open(args.out, "a") as handle:
                handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
