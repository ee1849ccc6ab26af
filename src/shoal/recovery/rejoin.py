"""Under torchrun, a job started again finds its own run and resumes from it.

torchrun starts every rank of a job again, with the same command line, when a rank
failed (`--max-restarts`, counted) and when its membership changes (a node joins a
running `--nnodes MIN:MAX` job: not counted). `shoal train job.toml` would then
create a new run directory and train from scratch. So rank 0 marks the run
directory it creates with torchrun's run id (`TORCHELASTIC_RUN_ID`: `--rdzv-id`,
"none" when not given) and with the torchrun agents of its ranks (each rank's
parent process: boot id, pid and start time, `agent_identity`). A later rank 0 takes
a run so marked among the config's run names as its own when one of its ranks'
agents is in the mark (the same torchrun job: a new job has new agents) or when
torchrun counted a restart (`TORCHELASTIC_RESTART_COUNT` > 0: the fallback where
/proc is missing). It resumes from the run's newest checkpoint (recovery/restarts.py's
`newest_state`: a damaged one stops the job with its message), or starts again in it
when it has none. The other ranks learn both from rank 0 with the run directory.

A restart may bring fewer workers than the state it resumes from had: torchrun's
elastic `--nnodes MIN:MAX` goes on without a host that is gone (its rendezvous drops
a node whose agent stopped answering). That is the same elastic rule as under
shoal's own launcher (`[faults] min_workers`): the job goes on with fewer, down to
min_workers, with the same global batch (the strategy splits it over the ranks it
has), and the change is logged and appended to metrics.jsonl (`membership`). With
min_workers = 0 a smaller job is refused: the config asked never to shrink.

It grows back the same way when the host returns: its torchrun joins the
rendezvous, the running agents see a node waiting (torch's agent/server/api.py,
`_invoke_run`: `num_nodes_waiting() > 0`) and stop their workers (SIGTERM: shoal
stops at the next step boundary with a checkpoint, so no step is lost) and start
them again in a new round with the larger world; rank 0 finds its run by the agents'
mark (the restart count did not change) and resumes with more workers. Two torch
2.13 facts shape this:

* With the agent's shared TCP store (torch's default) the joining node never
  starts: rendezvous/dynamic_rendezvous.py:1209-1223 (`next_rendezvous`) builds the
  store's address only on a node's first round or on a new rank 0, so the node that
  stays rank 0 does not write the new round's `MASTER_ADDR` and the joiner waits for
  it (api.py:102, `RendezvousStoreInfo.build`) until its store times out, and the
  agents waiting for it in `_assign_worker_ranks` fail the job. Exporting
  `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` on every host (torch's opt-out) makes every
  round write it: the workers' store is then rank 0's own, new each round
  (TORCHELASTIC_USE_AGENT_STORE=False; launch/external.py hosts it).
* The restart count is each agent's own: a node that joins counts from 0 while the
  others may have counted restarts, so ranks of one round disagree on it. Nothing
  that all ranks must agree on (the keys of joining) is derived from it when the
  store is new each round.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Collection
from pathlib import Path

from shoal.checkpoint.atomic import atomic_write_json
from shoal.config.sections import FaultsConfig
from shoal.errors import ShoalError
from shoal.recovery.restarts import append_event
from shoal.run import RunPaths

MARK_FILE = "torchrun.json"


def agent_identity(pid: int | None = None) -> str:
    """Which torchrun agent started this process (its parent, or `pid`): the boot, the pid
    and the process's start time (a pid is reused; the pair is not). "" without /proc."""
    pid = os.getppid() if pid is None else pid
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
        started = stat[stat.rindex(")") + 2 :].split()[19]  # field 22, after "pid (comm) "
    except (OSError, ValueError, IndexError):
        return ""
    return f"{boot}/{pid}/{started}"


def mark_run(paths: RunPaths, run_id: str, agents: Collection[str] = ()) -> None:
    """Rank 0, in a run it created or found again under torchrun: remember which torchrun
    job it is (the run id and the agents of the ranks, those of earlier rounds kept)."""
    if not run_id:
        return
    known = set(_read_mark(paths.root)[1])
    known.update(a for a in agents if a)
    atomic_write_json(paths.root / MARK_FILE, {"run_id": run_id, "agents": sorted(known)})


def _read_mark(root: Path) -> tuple[str | None, list[str]]:
    """A run directory's mark: the torchrun run id and agents (None, [] when unmarked)."""
    try:
        mark = json.loads((root / MARK_FILE).read_text())
    except (OSError, ValueError):
        return None, []
    if not isinstance(mark, dict):
        return None, []
    agents = mark.get("agents", [])
    run_id = mark.get("run_id")
    return (
        run_id if isinstance(run_id, str) else None,
        [a for a in agents if isinstance(a, str)] if isinstance(agents, list) else [],
    )


def marked_run(
    parent: Path, name: str, run_id: str, agents: Collection[str] = (), restarted: bool = False
) -> RunPaths | None:
    """The run directory under `parent` named `name` or `name-N` that this torchrun job
    created (the newest such), or None. This job's: marked with `run_id` and one of
    `agents` (the agents of this round's ranks), or any run marked with `run_id` when
    torchrun counted a restart (`restarted`)."""
    if not run_id or not parent.is_dir():
        return None
    ours = {a for a in agents if a}
    found = []
    for candidate in parent.iterdir():
        if candidate.name != name and not (
            candidate.name.startswith(f"{name}-") and candidate.name[len(name) + 1 :].isdigit()
        ):
            continue
        marked_id, marked_agents = _read_mark(candidate)
        if marked_id == run_id and (restarted or ours & set(marked_agents)):
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
    can_grow: bool = True,
) -> str | None:
    """Rank 0 of a job torchrun started again (`restart`: its restart count so far),
    resuming from a state of `was` workers at `step` with `now`: ShoalError if the job may
    not go on so; else the change's log line (recorded in metrics.jsonl), or None when the
    membership is the same. `elastic`: the strategy trains the same problem on any number
    of workers (Strategy.elastic). `can_grow`: a host that returns can join while the job
    runs (False under the agent's shared store: the line says how to allow it)."""
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
    grow = ""
    if now < was and not can_grow:
        grow = (
            "; it cannot grow back while it runs: torch's shared agent store leaves a host "
            "that returns waiting, export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for torchrun "
            "on every host to allow it"
        )
    return (
        f"torchrun started the job again (restarts {restart}): it {how} {now} "
        f"worker{'' if now == 1 else 's'} from {was}{floor}, resumed at step {step}{same}{grow}"
    )
