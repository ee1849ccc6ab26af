"""Run a shoal job across the hosts of a namespace cluster: under torchrun, or as a Slurm step.

Each host runs what a user would run on it: `torchrun --nnodes N --nproc-per-node P
--rdzv-backend c10d --rdzv-endpoint HOST0:PORT -m shoal train job.toml`, or, for
Slurm, one `python -m shoal train job.toml` per task with the environment srun
gives its tasks. The hosts share this machine's file system, like a cluster
with a shared home: every rank writes its log into the same run directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from tests.cluster.netns import Cluster, Host

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
JOB_TIMEOUT_S = 240.0
SLURM_JOB_ID = 4242  # its store port is 20000 + 4242 % 10000, on host 0's private namespace
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "GLOO_", "SHOAL_", "TORCHELASTIC", "GROUP_")  # fmt: skip


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH_VARS)}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", COLUMNS="200")
    env.update(extra)
    return env


@dataclass
class ClusterRun:
    """The processes of one job across the cluster, and where its run directory is."""

    cluster: Cluster
    run_dir: Path
    folder: Path
    #: torchrun: the rendezvous port on the first host (its workers' MASTER_PORT is another)
    port: int = 0
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    outputs: list[Path] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)
    #: what each host was started with (host name -> command, environment): `start_again`
    started: dict[str, tuple[list[str], dict[str, str]]] = field(default_factory=dict)

    def start(self, host: Host, cmd: list[str], env: dict[str, str], label: str) -> None:
        """Start one of the job's processes on `host`, its output in `<folder>/<label>.out`."""
        output = self.folder / f"{label}.out"
        self.started.setdefault(host.name, (cmd, env))
        self.outputs.append(output)
        self.processes.append(
            self.cluster.popen(host, cmd, env=env, cwd=self.folder, output=output)
        )

    def start_again(self, host: Host, label: str, like: Host | None = None) -> int:
        """Start `host`'s process again, as it (or `like`) was first started: a host that
        came back, or joins. Returns its index in `processes`."""
        cmd, env = self.started[(like or host).name]
        self.start(host, cmd, env, label)
        return len(self.processes) - 1

    def wait(self, timeout: float = JOB_TIMEOUT_S) -> ClusterRun:
        """Wait for every process (killed after `timeout`); their exit codes go to `codes`."""
        self.codes = self.cluster.wait_all(self.processes, timeout)
        return self

    def output(self, index: int) -> str:
        path = self.outputs[index]
        return path.read_text(errors="replace") if path.exists() else ""

    def report(self) -> str:
        tails = [f"--- process {i} (exit {c}):\n{self.output(i)[-3000:]}" for i, c in enumerate(self.codes)]  # fmt: skip
        return "\n".join(tails)

    def check(self) -> dict[str, Any]:
        """Every process exited 0; returns results.json."""
        assert all(code == 0 for code in self.codes), self.report()
        results: dict[str, Any] = json.loads((self.run_dir / "results.json").read_text())
        return results

    def log(self, rank: int) -> str:
        return (self.run_dir / "logs" / f"rank-{rank}.log").read_text()


def _without_none(value: Any) -> Any:
    """TOML has no null: a key set to None means the field's default, so it is left out."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    return value


def write_job(config: dict[str, Any], folder: Path, name: str) -> tuple[Path, Path]:
    """The job file (run name fixed, so its run directory is known) and that run directory."""
    runs = folder / "runs"
    job = folder / f"{name}.toml"
    config = {**config, "run": {**config.get("run", {}), "dir": str(runs), "name": name}}
    job.write_text(tomli_w.dumps(_without_none(config)))
    return job, runs / name


def start_torchrun(
    cluster: Cluster,
    config: dict[str, Any],
    folder: Path,
    name: str,
    nproc_per_node: int = 2,
    hosts: list[Host] | None = None,
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    nnodes: str | None = None,
    torchrun_args: tuple[str, ...] = (),
) -> ClusterRun:
    """One torchrun per host, rendezvous (c10d) on the first host at a port free there.
    `nnodes` (default: every host) may be elastic ("1:2"); `torchrun_args` go to torchrun
    (`--max-restarts`, `--rdzv-conf`), `args` to shoal."""
    hosts = hosts or cluster.hosts
    job, run_dir = write_job(config, folder, name)
    port = cluster.free_port(hosts[0])
    run = ClusterRun(cluster, run_dir, folder, port=port)
    for host in hosts:
        cmd = [
            TORCHRUN, "--nnodes", nnodes or str(len(hosts)), "--nproc-per-node", str(nproc_per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{hosts[0].name}:{port}",
            *torchrun_args, "-m", "shoal", "train", str(job), *args,
        ]  # fmt: skip
        run.start(host, cmd, clean_env(**(env or {})), f"{name}-{host.name}")
    return run


def slurm_env(
    cluster: Cluster, hosts: list[Host], tasks_per_node: int, rank: int, cyclic: bool = False
) -> dict[str, str]:
    """What srun sets for task `rank` of a step of `tasks_per_node` tasks on each of `hosts`
    (`cyclic`: srun --distribution=cyclic, ranks dealt over the nodes in turn)."""
    node = rank % len(hosts) if cyclic else rank // tasks_per_node
    local = rank // len(hosts) if cyclic else rank % tasks_per_node
    first, last = hosts[0].index, hosts[-1].index
    nodelist = f"{cluster.prefix}-h[{first}-{last}]" if len(hosts) > 1 else hosts[0].name
    return {
        "SLURM_JOB_ID": str(SLURM_JOB_ID),
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(local),
        "SLURM_NODEID": str(node),
        "SLURM_NTASKS": str(len(hosts) * tasks_per_node),
        "SLURM_STEP_NUM_TASKS": str(len(hosts) * tasks_per_node),
        "SLURM_STEP_NUM_NODES": str(len(hosts)),
        "SLURM_STEP_TASKS_PER_NODE": f"{tasks_per_node}(x{len(hosts)})",
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_JOB_NODELIST": nodelist,
    }


def start_slurm(
    cluster: Cluster,
    config: dict[str, Any],
    folder: Path,
    name: str,
    tasks_per_node: int = 2,
    hosts: list[Host] | None = None,
    env: dict[str, str] | None = None,
    cyclic: bool = False,
) -> ClusterRun:
    """`srun --ntasks-per-node T shoal train job.toml` over `hosts`: every task started here
    (`cyclic`: `--distribution=cyclic`, task r on node r mod nodes)."""
    hosts = hosts or cluster.hosts
    job, run_dir = write_job(config, folder, name)
    run = ClusterRun(cluster, run_dir, folder)
    for rank in range(len(hosts) * tasks_per_node):
        where = slurm_env(cluster, hosts, tasks_per_node, rank, cyclic)
        task_env = clean_env(**where, **(env or {}))
        cmd = [sys.executable, "-m", "shoal", "train", str(job)]
        run.start(hosts[int(where["SLURM_NODEID"])], cmd, task_env, f"{name}-task{rank}")
    return run
