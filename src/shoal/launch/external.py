"""Join a job that another launcher started: torchrun, or the tasks of a Slurm `srun` step.

The same config and command run on many machines:
`torchrun --nnodes 2 --nproc-per-node 4 --rdzv-endpoint HOST:PORT -m shoal train job.toml`
or `srun --ntasks-per-node 4 shoal train job.toml`. Every rank first settles where
its peers reach it (`[run] bind`, see network.py) and joins the process group:
under torchrun through torchrun's store (MASTER_ADDR, MASTER_PORT); under Slurm
rank 0 hosts the store itself, listening only on the address MASTER_ADDR names.
The ranks then learn which of them share a host. Rank 0 creates the run
directory (or takes the resumed one), holds its lock for the whole job
(run/lock.py), and tells the others its name, or why it cannot, over the
process group. Rank 0 writes metrics, results and checkpoints; every rank writes
its log under the same run directory on its own machine.
"""

from __future__ import annotations

import datetime
import json
import socket
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from shoal.checkpoint.atomic import atomic_write_bytes
from shoal.checkpoint.integrity import read_meta
from shoal.config import ShoalConfig, dump_config
from shoal.errors import JobFailed, ShoalError
from shoal.launch.admission import Claim, job_signer, join
from shoal.launch.bootstrap import Arrival, Arrived, placed_context, run_worker
from shoal.launch.environment import ExternalLaunch
from shoal.launch.hostwatch import HostWatch, StoreAddress, end_process
from shoal.launch.network import resolve_bind, use_for_gloo
from shoal.launch.plan import JobPlan, fit_plan
from shoal.launch.process_group import join_process_group
from shoal.launch.reports import is_communication_error, write_report
from shoal.monitor.logs import worker_logger
from shoal.recovery.rejoin import check_membership, mark_run, marked_run
from shoal.recovery.replicas import newest_replica, remove_host_snapshots
from shoal.recovery.restarts import newest_state
from shoal.recovery.status import StatusBoard
from shoal.run import RunPaths, create_run_dir
from shoal.run.lock import RunLock
from shoal.runtime.auth import Signer, new_secret
from shoal.runtime.collectives import World, barrier, broadcast_bytes, gather_bytes
from shoal.runtime.hosts import gather_hosts
from shoal.runtime.stop import stop_on_signals
from shoal.shape.hosts import Hosts


def job_store(launch: ExternalLaunch, config: ShoalConfig) -> dist.Store:
    """The job's store: torchrun's agent's (every rank connects), or one rank 0 hosts (a Slurm
    step's, or torchrun's when its agents share none: recovery/rejoin.py).

    Rank 0 listens on the address MASTER_ADDR resolves to, which must be one of
    its own: never on every interface of the machine.
    """
    timeout = datetime.timedelta(seconds=config.faults.start_timeout_s)
    host, port = launch.master_addr, launch.master_port
    if not launch.hosts_store:
        return dist.TCPStore(host, port, is_master=False, timeout=timeout, wait_for_workers=False)
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(128)
    except OSError as exc:
        fix = (
            "export MASTER_ADDR / MASTER_PORT before srun"
            if launch.launcher == "slurm"
            else "give torchrun --local-addr with an address of this host"
        )
        raise ShoalError(
            f"{launch.launcher}: rank 0 (host {socket.gethostname()}) cannot listen on "
            f"MASTER_ADDR:MASTER_PORT {host}:{port} ({exc.strerror or exc}); MASTER_ADDR must "
            f"name this host (the first node) and the port must be free: {fix}"
        ) from None
    return dist.TCPStore(
        host,
        port,
        is_master=True,
        timeout=timeout,
        wait_for_workers=False,
        master_listen_fd=listener.detach(),
    )


def run_external(plan: JobPlan, launch: ExternalLaunch) -> dict[str, Any]:
    """This rank's part of a job torchrun or a Slurm step started: the one worker bootstrap
    (`bootstrap.py`), arriving as such a launcher's ranks do."""
    return run_worker(ExternalArrival(plan, launch))


class ExternalArrival(Arrival):
    """A rank another launcher started: admitted by the job's secret, placed by host, its
    run directory claimed by rank 0, its host watched by heartbeats."""

    def __init__(self, plan: JobPlan, launch: ExternalLaunch) -> None:
        self.plan, self.launch = plan, launch
        self.watch: HostWatch | None = None
        self.store: dist.Store | None = None
        self.paths: RunPaths | None = None
        self.hosts: Hosts | None = None

    def arrive(self, held: ExitStack) -> Arrived:
        launch = self.launch
        placement = launch.placement
        rank, world_size = placement.rank, placement.world_size
        described = self.plan.shape
        # the roles of the processes started (a host lost or back)
        plan, fitted = fit_plan(self.plan, world_size)
        self.plan = plan
        config = plan.config
        binding = resolve_bind(config.run.bind, launch.master_addr)
        use_for_gloo(binding)
        signer = job_signer(config.run)
        store = self.store = job_store(launch, config)
        where = f"{launch.master_addr}:{launch.master_port}"
        me = Claim(rank, socket.gethostname(), binding.address)
        admission, doors = join(
            store, f"shoal/join/{launch.attempt}", signer, me, world_size,
            config.faults.start_timeout_s, where,
        )  # fmt: skip
        group_store = dist.PrefixStore(admission.prefix, store)
        sealed = (signer, f"the job's store at {where}") if signer is not None else None
        device, backend = join_process_group(config, placement, group_store, sealed)
        peers = World(rank, world_size, device if backend == "nccl" else torch.device("cpu"))
        hosts = self.hosts = gather_hosts(peers, binding.address)
        beats = admission.derived_signer("heartbeats") or _drawn_signer(peers)
        agents = {blob.decode() for blob in gather_bytes(peers, launch.agent.encode())}
        claim: dict[str, str | bool | None] = {}
        if rank == 0:
            try:
                root, resume, again = _claim_run(plan, launch, held, agents)
                claim = {"root": str(root), "resume": resume, "again": again}
            except ShoalError as exc:
                claim = {"error": str(exc)}
        announced = json.loads(broadcast_bytes(peers, json.dumps(claim).encode()).decode())
        if "error" in announced:
            raise ShoalError(announced["error"])
        paths = self.paths = RunPaths(Path(announced["root"]))
        paths.logs.mkdir(parents=True, exist_ok=True)  # other machines may not share the folder
        paths.checkpoints.mkdir(parents=True, exist_ok=True)
        barrier(peers)
        resume_from = announced["resume"]
        again = bool(announced["again"])  # torchrun started this job again (a restart or not)
        if again and config.faults.snapshot_every_steps:  # newer than the checkpoint?
            floor = int(read_meta(Path(resume_from)).get("step", -1)) if resume_from else -1
            snapshot = newest_replica(peers, hosts, paths, floor)
            resume_from = str(snapshot) if snapshot is not None else resume_from
        changed: dict[str, str | None] = {}
        if rank == 0:  # the state resumed from is known everywhere now: its world size
            try:
                line = _membership(plan, launch, again, world_size, paths, resume_from)
                changed = {"line": line}
            except ShoalError as exc:
                changed = {"error": str(exc)}
        changed = json.loads(broadcast_bytes(peers, json.dumps(changed).encode()).decode())
        if changed.get("error"):
            raise ShoalError(str(changed["error"]))
        log = worker_logger(rank, paths.log_file(rank))
        held.enter_context(stop_on_signals(log))
        log.info(
            "rank %d of %d joined (%s, %s on %s; store %s); gloo listens on %s; hosts: %s",
            rank,
            world_size,
            launch.launcher,
            backend,
            device,
            where,
            binding.describe(),
            hosts.describe(),
        )
        if rank == 0 and described.world_size != world_size:
            log.warning(
                "the config describes %d worker processes%s, %s started %d: the job runs on %d%s",
                described.world_size,
                described.describe_members(),
                launch.launcher,
                world_size,
                world_size,
                plan.shape.describe_members() if fitted else "",
            )
        if changed.get("line"):
            log.warning("%s", changed["line"])
        if rank == 0 and config.faults.max_restarts:
            log.warning(
                "faults.max_restarts = %d is shoal's own launcher's: under %s, restarts are "
                "the launcher's (torchrun --max-restarts)",
                config.faults.max_restarts,
                launch.launcher,
            )
        if doors is not None:
            for line in doors.refusals:
                log.warning("%s", line)
            doors.log = log
        watch = self.watch = HostWatch(
            StoreAddress(launch.master_addr, launch.master_port), rank, hosts, config.faults,
            beats, log, on_lost=lambda message: end_process(log, message), doors=doors,
            board=StatusBoard(paths, launch.max_restarts) if rank == 0 else None,
            restarts=launch.restart, max_restarts=launch.max_restarts,
        )  # fmt: skip
        ctx = placed_context(
            placement,
            config=config,
            paths=paths,
            device=device,
            backend=backend,
            launch_mode=launch.launcher,
            log=log,
            hosts=hosts,
            resume_from=resume_from,
            allow_changes=plan.allow_changes,
            heartbeat=watch.heartbeat,
            restart=launch.restart,
        )
        return Arrived(ctx, log)

    def completed(self) -> None:
        """The job is done: the first rank of each host frees its host's snapshots."""
        rank, hosts = self.launch.placement.rank, self.hosts
        if (
            hosts is not None
            and self.paths is not None
            and hosts.ranks(hosts.host_of[rank])[0] == rank
        ):
            remove_host_snapshots(self.paths)

    def report(self, exc: Exception, arrived: Arrived | None) -> Exception | None:
        """A peer gone: the watch may name its host (and is ending this process already);
        else the error in this rank's log and its report beside it."""
        if arrived is None:  # before the run directory was known: nothing to write into
            return None
        watch = self.watch
        if watch is not None and is_communication_error(exc):
            timeout = self.plan.config.faults.heartbeat_timeout_s + 2.0
            lost = watch.explain(within_s=timeout)
            if lost is not None:
                return JobFailed(lost)
        rank = arrived.ctx.rank
        arrived.log.exception("rank %d failed", rank)
        write_report(arrived.ctx.paths.error_file(rank), rank, -1, exc)
        return None

    def finish(self, ok: bool) -> None:
        if self.watch is not None:
            self.watch.finish(ok=ok)
        self.store = None


def _drawn_signer(peers: World) -> Signer:
    """A job without a secret: rank 0 draws one for the heartbeats and sends it over the
    process group (whose members were all admitted), never through the store."""
    drawn = broadcast_bytes(peers, new_secret().encode() if peers.rank == 0 else None)
    return Signer(drawn)


def _membership(
    plan: JobPlan,
    launch: ExternalLaunch,
    again: bool,
    world_size: int,
    paths: RunPaths,
    resume: str | None,
) -> str | None:
    """Rank 0 of a job torchrun started `again`: fewer or more workers than the state it
    resumes from had (a host lost or back), as `[faults] min_workers` allows
    (recovery/rejoin.py)."""
    if not again or resume is None:
        return None
    now = plan.shape.workers  # as the checkpoint counts them (not dedicated servers)
    meta = read_meta(Path(resume))
    was, step = int(meta.get("world_size", now)), int(meta.get("step", -1))
    faults = plan.config.faults
    return check_membership(
        faults,
        was,
        now,
        launch.restart,
        step,
        paths,
        plan.shape.elastic,
        can_grow=not launch.agent_store,
    )


def _claim_run(
    plan: JobPlan, launch: ExternalLaunch, held: ExitStack, agents: set[str]
) -> tuple[Path, str | None, bool]:
    """Rank 0: the run directory, created for a new run (or found again when torchrun
    started the job again: `agents`, the torchrun agents of the ranks, say it is the same
    job, recovery/rejoin.py), locked in `held`; the checkpoint to resume from; whether the
    run was found again."""
    if plan.run_root is not None:
        held.enter_context(RunLock(RunPaths(plan.run_root).lock))
        return plan.run_root, plan.resume_from, bool(launch.restart)
    parent = Path(plan.config.run.dir)
    found = marked_run(parent, plan.run_name, launch.run_id, agents, restarted=launch.restart > 0)
    if found is not None:
        held.enter_context(RunLock(found.lock))
        mark_run(found, launch.run_id, agents)
        return found.root, newest_state(found, None).path, True
    paths = create_run_dir(parent, plan.run_name)
    held.enter_context(RunLock(paths.lock))
    atomic_write_bytes(paths.config, dump_config(plan.config).encode())
    mark_run(paths, launch.run_id, agents)
    return paths.root, None, False
