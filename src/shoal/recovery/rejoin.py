"""Under `torchrun --max-restarts`, a restarted job finds its own run and resumes from it.

torchrun restarts every rank of a job whose rank failed, with the same command
line: `shoal train job.toml` would then create a new run directory and train from
scratch. So rank 0 marks the run directory it creates with torchrun's run id
(`TORCHELASTIC_RUN_ID`, the same for every restart of one torchrun job: `--rdzv-id`,
or the one `--standalone` draws), and a restarted rank 0
(`TORCHELASTIC_RESTART_COUNT` > 0) looks for the run so marked among the config's
run names and resumes from its newest checkpoint (recovery/restarts.py's
`newest_state`: a damaged one stops the job with its message), or starts again in
it when it has none. The other ranks learn both from rank 0 with the run directory.

A restart may bring fewer workers than the state it resumes from had: torchrun's
elastic `--nnodes MIN:MAX` goes on without a host that is gone (its rendezvous drops
a node whose agent stopped answering). That is the same elastic rule as under
shoal's own launcher (`[faults] min_workers`): the job goes on with fewer, down to
min_workers, with the same global batch (the strategy splits it over the ranks it
has), and the change is logged and appended to metrics.jsonl (`membership`). With
min_workers = 0 a smaller job is refused: the config asked never to shrink. More
workers than before, after a restart, are taken as they come. Growing back when a
host joins a job that is running is not reached: torchrun's agent then starts the
workers again without counting a restart (so a run is not found again), and its
rendezvous (torch 2.13, shared TCP store) leaves the joining node waiting for the
round's MASTER_ADDR, which the node that stays rank 0 does not write again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from shoal.checkpoint.atomic import atomic_write_json
from shoal.config.sections import FaultsConfig
from shoal.errors import ShoalError
from shoal.recovery.restarts import append_event
from shoal.run import RunPaths

MARK_FILE = "torchrun.json"


def mark_run(paths: RunPaths, run_id: str) -> None:
    """Rank 0, in a run it created under torchrun: remember which torchrun job it is."""
    if run_id:
        atomic_write_json(paths.root / MARK_FILE, {"run_id": run_id})


def marked_run(parent: Path, name: str, run_id: str) -> RunPaths | None:
    """The run directory under `parent` named `name` or `name-N` that torchrun job `run_id`
    created (the newest such), or None."""
    if not run_id or not parent.is_dir():
        return None
    found = []
    for candidate in parent.iterdir():
        if candidate.name != name and not (
            candidate.name.startswith(f"{name}-") and candidate.name[len(name) + 1 :].isdigit()
        ):
            continue
        try:
            mark = json.loads((candidate / MARK_FILE).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(mark, dict) and mark.get("run_id") == run_id:
            found.append(candidate)
    if not found:
        return None
    return RunPaths(max(found, key=lambda p: p.stat().st_mtime))


def check_membership(
    faults: FaultsConfig,
    was: int,
    now: int,
    restart: int,
    step: int,
    paths: RunPaths,
    elastic: bool,
) -> str | None:
    """Rank 0 of a job torchrun started again (`restart`: its restart count so far),
    resuming from a state of `was` workers at `step` with `now`: ShoalError if the job may
    not go on so; else the change's log line (recorded in metrics.jsonl), or None when the
    membership is the same. `elastic`: the strategy trains the same problem on any number
    of workers (Strategy.elastic)."""
    if now == was:
        return None
    if now < was and not faults.min_workers:
        raise ShoalError(
            f"torchrun started the job again (restarts {restart}) with {now} workers, its state at "
            f"step {step} has {was}, and faults.min_workers = 0 never shrinks a job: set "
            f"faults.min_workers (at most {now}) to go on with fewer, or bring the lost host back"
        )
    if now < faults.min_workers:
        raise ShoalError(
            f"torchrun started the job again (restarts {restart}) with {now} workers, fewer than "
            f"faults.min_workers = {faults.min_workers} (its state at step {step} has {was}); "
            "the job stops: restart it with more hosts (shoal train --resume RUN_DIR under "
            "torchrun)"
        )
    append_event(
        paths.metrics,
        {"event": "membership", "workers": now, "was": was, "step": step,
         "restart": restart, "time": time.time()},
    )  # fmt: skip
    how = "goes on with" if now < was else "grows back to"
    floor = f" (faults.min_workers = {faults.min_workers})" if now < was else ""
    same = " with the same global batch" if elastic else ""
    return (
        f"torchrun started the job again (restarts {restart}): it {how} {now} workers from "
        f"{was}{floor}, resumed at step {step}{same}"
    )
