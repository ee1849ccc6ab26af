"""In-memory snapshots: the job's state every `faults.snapshot_every_steps` steps, in RAM.

A restart used to lose everything since the last disk checkpoint, and disk
checkpoints are too slow to take every few steps. A snapshot is the same
verified checkpoint folder (the driver's parts, checkpoint/manager.py: atomic,
sealed, every byte checksummed), written into a memory-backed folder
(`/dev/shm`, tmpfs: no disk write, fsync costs nothing) and pruned to the newest.

Where it lives, and why not on a peer rank: torch.distributed cannot hand a dead
rank's state to its replacement without a new process group, so a ring of
replicas held by the workers would need the survivors kept alive across the
restart and a second group to pass the state on. Under shoal's own launcher
every worker runs on the launcher's machine, and the machine's memory outlives
every worker: a snapshot in tmpfs survives any worker's death (SIGKILL
included), and the restarted workers read it like a checkpoint, verified byte by
byte. What it does not survive is the machine itself; disk checkpoints remain for
that. The launcher owns the folder: it creates it (mode 0700) before the first
attempt and removes it when the job ends, however it ends.

This is the ring of replicas (each rank's state also kept by a peer) in the case
of one host. A replica is worth what its holder survives that the original does
not; on one machine every possible holder, worker or launcher, lives in the same
memory, so a copy on a peer rank there survives exactly what the tmpfs copy
survives (any worker's death) and dies with it (the machine's). The ring has one
member: the machine's memory, held by the one process that outlives the
workers. Across hosts (torchrun, Slurm) the ring's members are on different
hosts: recovery/replicas.py.

Rank 0 writes (as for checkpoints); the snapshot costs one gather of the
per-rank parts and one serialization of the state into memory per
`snapshot_every_steps` steps (benchmarks/chaos.py measures it).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from shoal.run import RunPaths

SHM = Path("/dev/shm")


def snapshot_dir(paths: RunPaths) -> Path:
    """The run's snapshot folder: in tmpfs when the machine has one, else beside the run."""
    key = hashlib.sha256(str(paths.root.resolve()).encode()).hexdigest()[:16]
    if SHM.is_dir() and os.access(SHM, os.W_OK):
        return SHM / f"shoal-{os.getuid()}-{key}"
    return Path(tempfile.gettempdir()) / f"shoal-{os.getuid()}-{key}"


def create_snapshot_dir(paths: RunPaths) -> Path:
    """The launcher: an empty, private snapshot folder for this job."""
    folder = snapshot_dir(paths)
    shutil.rmtree(folder, ignore_errors=True)  # a crashed launcher's: not this job's state
    folder.mkdir(mode=0o700, parents=True)
    return folder


def remove_snapshot_dir(paths: RunPaths) -> None:
    shutil.rmtree(snapshot_dir(paths), ignore_errors=True)
