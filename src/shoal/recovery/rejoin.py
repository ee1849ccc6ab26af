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
"""

from __future__ import annotations

import json
from pathlib import Path

from shoal.checkpoint.atomic import atomic_write_json
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
