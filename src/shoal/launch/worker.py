"""Entry point of a worker process started by shoal's local launcher.

`python -m shoal.launch.worker --run-dir DIR [--resume CHECKPOINT]`, with the
torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT) set by the launcher, whose TCP store the worker joins, and the
job's secret (SHOAL_JOB_SECRET) that seals what it writes there. It runs the one
worker bootstrap (`bootstrap.py`) with the launcher's way of arriving.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import logging
import os
import signal
from contextlib import ExitStack
from pathlib import Path

import torch.distributed as dist

from shoal.config import load_config
from shoal.errors import EXIT_FAILURE, RunStopped, ShoalError
from shoal.launch.bootstrap import Arrival, Arrived, placed_context, run_worker
from shoal.launch.process_group import (
    LAUNCHER_ENV,
    Placement,
    choose_device,
    exit_process,
    join_process_group,
)
from shoal.launch.reports import write_report
from shoal.monitor.logs import worker_logger
from shoal.run import RunPaths
from shoal.runtime.auth import SECRET_ENV, Signer
from shoal.runtime.heartbeat import Heartbeat
from shoal.runtime.stop import stop_on_signals
from shoal.shape.hosts import Hosts


def _die_with_launcher() -> None:
    """Ask Linux to signal this worker when its launcher dies, so no orphan trains on alone.

    The signal is SIGTERM: the worker stops at the next step boundary, with a checkpoint.
    """
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        return  # not Linux: the heartbeat store going away ends the job instead
    if not _launcher_alive():
        os._exit(EXIT_FAILURE)  # the launcher died before we could ask


def _launcher_alive() -> bool:
    """Whether the launcher is still there: this process's parent, or (a worker forked by
    the launcher's forkserver, launch/start.py) alive, with our parent not yet gone."""
    launcher = os.environ.get(LAUNCHER_ENV, "")
    parent = os.getppid()
    if str(parent) == launcher:
        return True
    if parent == 1 or not launcher.isdigit():
        return False
    try:
        os.kill(int(launcher), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LauncherArrival(Arrival):
    """A rank shoal's launcher started: the launcher's store (its address and the job's
    secret in the environment), heartbeats to it, and a report it reads on failure."""

    def __init__(self, args: argparse.Namespace, signer: Signer) -> None:
        self.args, self.signer = args, signer
        self.placement = Placement.from_env()
        self.paths = RunPaths(Path(args.run_dir))
        self.log = worker_logger(self.placement.rank, self.paths.log_file(self.placement.rank))
        self.heartbeat: Heartbeat | None = None

    def arrive(self, held: ExitStack) -> Arrived:
        args, placement, log = self.args, self.placement, self.log
        held.enter_context(stop_on_signals(log, level=logging.INFO))  # the launcher tells
        rank, world_size = placement.rank, placement.world_size
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        config = load_config(Path(args.config) if args.config else self.paths.config)
        faults = config.faults
        self.heartbeat = Heartbeat(
            host, port, rank, faults.heartbeat_interval_s, faults.start_timeout_s, self.signer
        )
        # joining waits for the slowest worker to start; collectives then use faults.timeout_s
        store = dist.TCPStore(
            host,
            port,
            world_size,
            is_master=False,
            timeout=datetime.timedelta(seconds=faults.start_timeout_s),
            wait_for_workers=False,
        )
        if args.rejoin:  # the job's groups are formed: the strategy connects on its own
            device, backend = choose_device(config, placement)
            log.info("rank %d of %d restarted alone (%s)", rank, world_size, backend)
        else:
            sealed = (self.signer, f"the job's store at {host}:{port}")
            device, backend = join_process_group(config, placement, store, sealed)
            log.info("rank %d of %d joined (%s on %s)", rank, world_size, backend, device)
        ctx = placed_context(
            placement,
            config=config,
            paths=self.paths,
            device=device,
            backend=backend,
            launch_mode="shoal",
            log=log,
            hosts=Hosts.single(world_size),
            resume_from=args.resume,
            allow_changes=args.allow_changes,
            heartbeat=self.heartbeat,
            restart=args.restart,
            store=store,
            rejoin=args.rejoin,
        )
        return Arrived(ctx, log)

    def report(self, exc: Exception, arrived: Arrived | None) -> Exception | None:
        """The error in this rank's log and its report (a file beside the log, and the
        store), with the newest step it reached."""
        rank = self.placement.rank
        if isinstance(exc, ShoalError):
            self.log.error("%s", exc)
        else:
            self.log.exception("rank %d failed", rank)
        step = self.heartbeat.step if self.heartbeat is not None else -1
        report = write_report(self.paths.error_file(rank), rank, step, exc)
        if self.heartbeat is not None:
            self.heartbeat.report(report)
        return None

    def finish(self, ok: bool) -> None:
        if self.heartbeat is not None:
            self.heartbeat.close()
        logging.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shoal-worker")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--resume", default=None, help="checkpoint folder to resume from")
    parser.add_argument("--config", default=None, help="config file (default: the run's)")
    parser.add_argument("--allow-changes", action="store_true", help="see shoal train")
    parser.add_argument("--restart", type=int, default=0, help="restarts before this attempt")
    parser.add_argument(
        "--rejoin", action="store_true", help="replace a dead rank while the others run on"
    )
    args = parser.parse_args(argv)
    _die_with_launcher()
    signer = Signer.from_env()
    if signer is None:
        parser.error(f"{SECRET_ENV} is not set: workers are started by `shoal train`")
    try:
        run_worker(LauncherArrival(args, signer))
        return 0
    except RunStopped as exc:  # a stop request, taken at a step boundary: not a failure
        return exc.exit_code
    except ShoalError as exc:
        return exc.exit_code
    except Exception:
        return EXIT_FAILURE


if __name__ == "__main__":
    exit_process(main())
