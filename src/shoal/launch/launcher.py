"""The local launcher: start N workers on this machine, watch them, stop them all on a failure.

A small torchrun for one machine. The launcher hosts the job's TCP store on a
socket it binds to 127.0.0.1 with a port the OS picks, starts each worker as
`python -m shoal.launch.worker` with torchrun's environment variables, and then
watches: a worker that exits non-zero, or whose heartbeat stops, ends the job
within seconds, with a message naming the rank, its step and its error, and the
other workers are terminated. Nothing waits forever.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import torch.distributed as dist

from shoal.config import ShoalConfig
from shoal.errors import EXIT_FAILURE, EXIT_HALTED, JobFailed, ShoalError, TrainingHalted
from shoal.launch.process_group import LAUNCHER_ENV, loopback_interface
from shoal.launch.reports import read_report
from shoal.run import RunPaths
from shoal.runtime.heartbeat import read_heartbeat

POLL_S = 0.1
HEARTBEAT_CHECK_S = 0.5
REPORT_GRACE_S = 2.0
TERMINATE_GRACE_S = 5.0


@dataclass
class _Worker:
    rank: int
    process: subprocess.Popen[bytes]
    output: IO[bytes] | None
    exited_at: float | None = None


@dataclass
class LocalLauncher:
    paths: RunPaths
    config: ShoalConfig
    world_size: int
    resume_from: str | None = None
    config_file: Path | None = None  # what the workers read (default: the run's config.toml)
    allow_changes: bool = False
    lock_fd: int | None = None  # the run's lock, held by every worker too (run/lock.py)
    workers: list[_Worker] = field(default_factory=list)

    def run(self) -> None:
        """Run the job to completion; raises JobFailed (or ShoalError) if any worker fails."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))  # loopback only; the OS picks a free port
        listener.listen(128)
        port = listener.getsockname()[1]
        store = dist.TCPStore(
            "127.0.0.1",
            port,
            is_master=True,
            timeout=datetime.timedelta(seconds=self.config.faults.start_timeout_s),
            wait_for_workers=False,
            master_listen_fd=listener.detach(),
        )
        try:
            for rank in range(self.world_size):
                self.workers.append(self._spawn(rank, port))
            self._watch(store)
        except KeyboardInterrupt:
            self._terminate()
            raise JobFailed("interrupted; workers stopped") from None
        finally:
            self._terminate()
            for worker in self.workers:
                if worker.output is not None:
                    worker.output.close()
            del store

    def _environment(self, rank: int, port: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_WORLD_SIZE=str(self.world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            PYTHONUNBUFFERED="1",
        )
        env[LAUNCHER_ENV] = str(os.getpid())
        threads = self.config.run.threads_per_worker or max(
            1, (os.cpu_count() or 1) // self.world_size
        )
        env.setdefault("OMP_NUM_THREADS", str(threads))
        loopback = loopback_interface()
        if loopback:
            env.setdefault("GLOO_SOCKET_IFNAME", loopback)  # gloo listens on loopback only
        return env

    def _spawn(self, rank: int, port: int) -> _Worker:
        cmd = [sys.executable, "-m", "shoal.launch.worker", "--run-dir", str(self.paths.root)]
        if self.resume_from:
            cmd += ["--resume", self.resume_from]
        if self.config_file is not None:
            cmd += ["--config", str(self.config_file)]
        if self.allow_changes:
            cmd.append("--allow-changes")
        output = None
        if rank != 0:  # rank 0 shows progress on this terminal; the others write to files
            output = open(self.paths.output_file(rank), "ab")  # noqa: SIM115
        process = subprocess.Popen(
            cmd,
            env=self._environment(rank, port),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT if output else None,
            pass_fds=(self.lock_fd,) if self.lock_fd is not None else (),
        )
        return _Worker(rank, process, output)

    # ------------------------------------------------------------ watching
    def _watch(self, store: dist.Store) -> None:
        started = time.monotonic()
        next_heartbeat_check = started
        while True:
            now = time.monotonic()
            for worker in self.workers:
                if worker.exited_at is None and worker.process.poll() is not None:
                    worker.exited_at = now
            if all(w.process.returncode == 0 for w in self.workers):
                return
            failed = [w for w in self.workers if w.process.returncode not in (None, 0)]
            if failed:
                raise self._failure(store, failed)
            if now >= next_heartbeat_check:
                lost = self._lost_worker(store, now - started)
                if lost:
                    self._terminate()
                    raise JobFailed(lost)
                next_heartbeat_check = now + HEARTBEAT_CHECK_S
            time.sleep(POLL_S)

    def _steps(self, store: dist.Store) -> dict[int, int]:
        steps = {}
        for worker in self.workers:
            with contextlib.suppress(Exception):
                beat = read_heartbeat(store, worker.rank)
                if beat is not None:
                    steps[worker.rank] = beat[1]
        return steps

    def _lost_worker(self, store: dist.Store, running_for: float) -> str | None:
        faults = self.config.faults
        steps = self._steps(store)
        for worker in self.workers:
            if worker.process.returncode is not None:
                continue
            beat = read_heartbeat(store, worker.rank)
            if beat is None:
                if running_for > faults.start_timeout_s:
                    return (
                        f"rank {worker.rank} did not start within {faults.start_timeout_s:g} s "
                        f"(faults.start_timeout_s); see {self.paths.log_file(worker.rank)}"
                    )
                continue
            silent = time.time() - beat[0]
            if silent > faults.heartbeat_timeout_s:
                ahead = max(steps.values(), default=beat[1])
                last = f"step {beat[1]}" if beat[1] >= 0 else "no step yet"
                return (
                    f"rank {worker.rank} stopped responding: no heartbeat for {silent:.0f} s "
                    f"(faults.heartbeat_timeout_s = {faults.heartbeat_timeout_s:g}); it last "
                    f"reported {last}, other ranks up to step {ahead}; "
                    f"see {self.paths.log_file(worker.rank)}"
                )
        return None

    def _failure(self, store: dist.Store, failed: list[_Worker]) -> ShoalError:
        """Name the rank that caused the failure, then stop every worker.

        When one rank dies its peers soon fail too (a broken connection, a timed-out
        collective). Their reports say so (`communication_error`), which is how the
        rank that really failed is told apart from those that only lost it.
        """
        deadline = time.monotonic() + REPORT_GRACE_S
        while time.monotonic() < deadline and any(w.process.poll() is None for w in self.workers):
            time.sleep(POLL_S)
        now = time.monotonic()
        for worker in self.workers:
            if worker.exited_at is None and worker.process.poll() is not None:
                worker.exited_at = now
        on_their_own = sorted(
            (w for w in self.workers if w.process.returncode not in (None, 0)),
            key=lambda w: (w not in failed, w.exited_at),
        )
        steps = self._steps(store)
        silent_peers = [w.rank for w in self.workers if w.process.poll() is None]
        self._terminate()
        reports = {w.rank: read_report(self.paths.error_file(w.rank)) for w in on_their_own}
        causes = [
            w for w in on_their_own if (reports[w.rank] or {}).get("communication_error") is False
        ]
        unreported = [w for w in on_their_own if reports[w.rank] is None]
        culprit = (causes or unreported or on_their_own)[0]
        report = reports.get(culprit.rank)
        log = self.paths.log_file(culprit.rank)
        if report and report.get("user_error"):
            lines = report.get("lines") or [report.get("message", "")]
            # a ShoalError raised at run time keeps its exit code: JobFailed (e.g. a federated
            # round without enough clients), TrainingHalted (non-finite gradients)
            code = report.get("exit_code")
            if code == EXIT_FAILURE:
                return JobFailed(*lines)
            if code == EXIT_HALTED:
                return TrainingHalted(*lines)
            return ShoalError(*lines)
        if report and report.get("step", -1) >= 0:
            where = f" at step {report['step']}"
        elif culprit.rank in steps and steps[culprit.rank] >= 0:
            where = f" (last reported step {steps[culprit.rank]})"
        else:
            where = " before reporting its first step"
        code = culprit.process.returncode
        if report:
            what = f"{report['type']}: {report['message']}"
            if report.get("communication_error") and silent_peers:
                listed = ", ".join(map(str, silent_peers))
                what += f"; rank {listed} had not failed but stopped answering"
            return JobFailed(f"rank {culprit.rank} failed{where}: {what} (log: {log})")
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            return JobFailed(f"rank {culprit.rank} was killed by {name}{where} (log: {log})")
        return JobFailed(
            f"rank {culprit.rank} exited with code {code} without an error report{where} "
            f"(log: {log})"
        )

    def _terminate(self) -> None:
        running = [w for w in self.workers if w.process.poll() is None]
        for worker in running:
            with contextlib.suppress(ProcessLookupError):
                worker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + TERMINATE_GRACE_S
        for worker in running:
            try:
                worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
