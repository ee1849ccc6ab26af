"""Device, backend and process-group setup for a worker."""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from shoal.config import ShoalConfig
from shoal.config.sections import RunConfig
from shoal.errors import ShoalError
from shoal.runtime.auth import Signer
from shoal.runtime.sealed_store import SealedStore
from shoal.shape.sizing import shape_of

#: set by shoal's own launcher in its workers' environment
LAUNCHER_ENV = "SHOAL_LAUNCHER"
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def pick_device(
    run: RunConfig, local_rank: int, local_workers: int = 1, shared: bool = False
) -> torch.device:
    """This worker's device: its own GPU, or the CPU.

    "auto" trains on the GPUs only when each of this host's `local_workers` gets one of
    its own (NCCL refuses two ranks on one device), else on the CPU (`check_devices`
    says so once); "cuda" insists, with a one-line error where the GPUs are too few.
    `shared`: the job's workers may share a GPU (`JobShape.shares_gpus`: its collectives
    run on gloo), so any GPU will do: worker `local_rank` takes GPU local_rank mod their
    number.
    """
    if run.device == "cpu":
        return torch.device("cpu")
    gpus = _gpus()
    if shared and gpus:
        return torch.device("cuda", local_rank % gpus)
    if run.device == "auto" and gpus < local_workers:
        return torch.device("cpu")
    if local_rank >= gpus or local_workers > gpus:
        raise ShoalError(_too_few_gpus(local_workers, gpus))
    return torch.device("cuda", local_rank)


def check_devices(run: RunConfig, local_workers: int, shared: bool = False) -> str | None:
    """Before the launcher starts `local_workers` on this host: the one-line error of
    `pick_device` where run.device = "cuda" finds too few GPUs, or the note that says why
    "auto" trains on the CPU of a host that has GPUs (None where there is nothing to say).
    `shared`: the workers may share a GPU (one is enough)."""
    if run.device == "cpu":
        return None
    gpus = _gpus()
    if shared and gpus:
        return None
    if run.device == "cuda" and gpus < local_workers:
        raise ShoalError(_too_few_gpus(local_workers, gpus))
    if 0 < gpus < local_workers:
        return (
            f'run.device = "auto": {local_workers} workers on this host but {gpus} GPU'
            f"{'s' if gpus > 1 else ''}: they train on the CPU (gloo); start at most {gpus} per "
            'host to train on the GPUs, or set run.device = "cpu" to silence this'
        )
    return None


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _too_few_gpus(local_workers: int, gpus: int) -> str:
    if gpus == 0:
        return (
            'run.device: \'cuda\' but CUDA is not available here; set run.device = "cpu" or "auto"'
        )
    return (
        f"run.device: {local_workers} workers on this host need a GPU each but only {gpus} "
        'exist; start at most that many per host, or set run.device = "cpu" or "auto"'
    )


def pick_backend(run: RunConfig, device: torch.device, shared: bool = False) -> str:
    """nccl for GPUs of their own, gloo otherwise; `shared`: ranks that share GPUs talk
    through gloo (NCCL refuses two ranks on one device), which the config checks."""
    if shared:
        return "gloo"
    if run.backend == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if run.backend == "nccl" and device.type != "cuda":
        raise ShoalError('run.backend: \'nccl\' needs CUDA devices; use "gloo" or "auto" on CPU')
    return run.backend


@dataclass(frozen=True)
class Placement:
    """This worker's place in the job, from torchrun-style environment variables."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Placement:
        env = os.environ if env is None else env
        rank, world_size = int(env["RANK"]), int(env["WORLD_SIZE"])
        return cls(
            rank=rank,
            world_size=world_size,
            local_rank=int(env.get("LOCAL_RANK", rank)),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", world_size)),
        )


def choose_device(config: ShoalConfig, placement: Placement) -> tuple[torch.device, str]:
    """Pick device and backend and share the CPU cores; returns (device, backend).
    Where the job's workers share GPUs, a rank that is no worker (a dedicated parameter
    server) stays on the CPU, and every rank shares the cores: the workers' own CPU work
    (batches, messages, a co-located server) runs beside the others'."""
    shape = shape_of(config)
    shared = shape.shares_gpus
    if shared and placement.rank not in shape.roles.workers:
        device = torch.device("cpu")
    else:
        device = pick_device(config.run, placement.local_rank, placement.local_world_size, shared)
    backend = pick_backend(config.run, device, shared)
    if device.type == "cpu" or shared:
        set_cpu_threads(config.run, placement.local_world_size)
    return device, backend


def join_process_group(
    config: ShoalConfig,
    placement: Placement,
    store: dist.Store | None = None,
    sealed: tuple[Signer, str] | None = None,
) -> tuple[torch.device, str]:
    """Pick device and backend, share the CPU cores, join the group; returns (device, backend).
    `sealed`: the job's signer and the store's name: every group of the job then meets
    through a SealedStore (runtime/sealed_store.py), so that a process without the job's
    secret cannot feed the backend a rendezvous value."""
    device, backend = choose_device(config, placement)
    if store is not None and sealed is not None:
        store = SealedStore(store, *sealed)
    init_process_group(
        backend, placement.rank, placement.world_size, config.faults.timeout_s, store, device
    )
    return device, backend


def loopback_interface() -> str | None:
    """Name of the loopback interface ('lo' on Linux, 'lo0' on macOS), if any."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)


def init_process_group(
    backend: str,
    rank: int,
    world_size: int,
    timeout_s: float,
    store: dist.Store | None = None,
    device: torch.device | None = None,
) -> None:
    """Join the job's process group; every collective then times out after `timeout_s`."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if device is not None and device.type == "cuda":
        torch.cuda.set_device(device)
    if store is not None:
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=timeout
        )
    else:
        dist.init_process_group(
            backend, init_method="env://", rank=rank, world_size=world_size, timeout=timeout
        )


def shutdown_process_group(graceful: bool = True) -> None:
    """Leave the process group; `graceful` first waits until every rank is done.

    The barrier makes sure no collective is still in flight in the backend's
    threads when the group is destroyed. After a failure peers may be gone, so
    nothing is waited for then.
    """
    if dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):
            if graceful:
                dist.barrier()
            dist.destroy_process_group()


def exit_process(code: int) -> None:
    """End a worker process without running interpreter finalization.

    gloo's worker threads can still be releasing a finished collective's tensors
    when the interpreter shuts down; they then need the GIL, CPython ends them,
    and the process aborts (std::terminate) although training succeeded. A
    dedicated worker has nothing left to finalize once its files are closed, so it
    leaves like a `multiprocessing` child does: flush, then `os._exit`.
    """
    import sys

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def set_cpu_threads(run: RunConfig, local_world_size: int) -> int:
    """Give each worker its share of the cores, so N workers do not fight over them."""
    threads = run.threads_per_worker or max(1, (os.cpu_count() or 1) // max(1, local_world_size))
    torch.set_num_threads(threads)
    return threads
