"""The local launcher: start N workers on this machine, watch them, stop them all on a failure.

A small torchrun for one machine. The launcher hosts the job's TCP store on a
socket it binds to 127.0.0.1 with a port the OS picks, draws the job's secret
(given to the workers in their environment, never through the store), starts
each worker (`shoal.launch.worker`, forked from a warm server: launch/start.py)
with torchrun's environment variables in a session of its own, and then watches: a worker that exits
non-zero, whose heartbeat stops, or whose process is stopped (state T) ends the
job within seconds, with a message naming the rank, its newest step and its
error, and the other workers are killed. Nothing waits forever.

With `[faults] max_restarts = N` the launcher does not stop there: a failure of
the machinery (not a user's error) is followed by a new set of workers that
resumes from the newest checkpoint. Whether, from where, after how long and with
which ranks is recovery/policy.py's decision; the launcher only supervises. Each
attempt has a store of its own (a fresh port: no value of a dead attempt is read
as a sign of life), the workers
are forked from the same forkserver (multiprocessing starts it again if it
died), and the run's lock stays held by the launcher throughout: no other job
can take the run between two attempts. The launcher keeps `status.json` in the
run directory for `shoal status` (recovery/status.py).

SIGTERM or SIGINT to the launcher is a request to stop: it is forwarded to every
worker, they stop at the same step boundary with a checkpoint, and the launcher
exits with 128 + the signal number. A second signal kills the workers at once.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

import torch.distributed as dist

from shoal.checkpoint.attempt import stage_config
from shoal.config import ShoalConfig
from shoal.errors import (
    EXIT_FAILURE,
    EXIT_HALTED,
    JobFailed,
    RunStopped,
    ShoalError,
    TrainingHalted,
)
from shoal.launch.process_group import LAUNCHER_ENV, loopback_interface
from shoal.launch.reports import read_report
from shoal.launch.start import WorkerProcess, start_worker
from shoal.launch.store_guard import StoreGuard
from shoal.launch.watch import STOPPED_STATES, StoreReader, existing, process_state
from shoal.recovery.policy import RecoveryPolicy
from shoal.recovery.restarts import Failure
from shoal.recovery.snapshots import create_snapshot_dir, remove_snapshot_dir
from shoal.recovery.status import RankStatus, StatusBoard
from shoal.run import RunPaths
from shoal.runtime.auth import SECRET_ENV, Signer, new_secret
from shoal.runtime.heartbeat import Beat
from shoal.runtime.stop import STOP_SIGNALS, describe_stop, signal_name
from shoal.shape.job import JobShape

POLL_S = 0.1
HEARTBEAT_CHECK_S = 0.5
#: how long a worker may sit in state T (stopped) before the job ends naming it
STOPPED_AFTER_S = 1.0
REPORT_GRACE_S = 2.0
KILL_GRACE_S = 5.0
#: exit codes of a worker that stopped on request (128 + signal), or that a stop signal killed
STOP_CODES = {128 + s for s in STOP_SIGNALS} | {-s for s in STOP_SIGNALS}


@dataclass
class _Worker:
    rank: int
    process: WorkerProcess
    output: IO[bytes] | None
    exited_at: float | None = None
    failed: bool = False  # named as the cause of the attempt's failure


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
        """Run the job to completion, restarting it after failures as `[faults]` allows;
        raises JobFailed (or ShoalError, RunStopped) if it does not complete."""
        self._secret = new_secret()
        self._started_wall = time.time()
        self._stop_signal = 0  # a stop signal this launcher received (and forwarded)
        faults = self.config.faults
        self.board = StatusBoard(self.paths, faults.max_restarts)
        self._state = "running"
        self._last_beats: dict[int, Beat | None] = {}
        resume = self.resume_from
        if faults.snapshot_every_steps:
            self._snapshots: Path | None = create_snapshot_dir(self.paths)
        else:
            self._snapshots = None
        self.policy = RecoveryPolicy(self.paths, self.config, self.resume_from, self._snapshots)
        self.restarts = self.policy.restarts  # the restarts' records, for the board and lines
        try:
            with self._signals_forwarded():
                while True:
                    failure = self._attempt(resume)
                    if failure is None:
                        break
                    resume = self._recover(failure)
        except KeyboardInterrupt:  # signals could not be taken over (not the main thread)
            self._kill()
            self._state = "stopped"
            raise JobFailed("interrupted; workers stopped") from None
        except RunStopped:
            self._state = "stopped"
            raise
        except BaseException:
            self._state = "failed"
            raise
        finally:
            self._kill()
            self._update_board()
            if self._snapshots is not None:
                remove_snapshot_dir(self.paths)
        self._state = "done"
        self._update_board()
        if faults.max_restarts:
            self.restarts.add_to_results()

    def _attempt(self, resume: str | None) -> Failure | None:
        """One set of workers on a store of its own: None once every one ended well, the
        failure otherwise (a stop request raises RunStopped)."""
        self._stopped_since: dict[int, float] = {}
        self.workers = []
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))  # loopback only; the OS picks a free port
        listener.listen(128)
        port = self._port = listener.getsockname()[1]
        store = dist.TCPStore(
            "127.0.0.1",
            port,
            is_master=True,
            timeout=datetime.timedelta(seconds=self.config.faults.start_timeout_s),
            wait_for_workers=False,
            master_listen_fd=listener.detach(),
        )
        self.reader = StoreReader(store, Signer(self._secret), _notice)
        self.guard = StoreGuard(f"the job's store at 127.0.0.1:{port}")
        try:
            for rank in range(self.world_size):
                # a resumed run's folder may hold reports of an earlier failure: not this one's
                self.paths.error_file(rank).unlink(missing_ok=True)
                self.workers.append(self._spawn(rank, port, resume))
            return self._watch()
        finally:
            self._kill()
            for worker in self.workers:
                if worker.output is not None:
                    worker.output.close()
            self._update_board()  # the attempt's last word, before its store goes
            del self.reader
            del store

    @property
    def shape(self) -> JobShape:
        """The job's shape, as the recovery policy last left it (a rank given up shrinks it)."""
        return self.policy.shape

    def _recover(self, failure: Failure) -> str | None:
        """After a failed attempt: raise its error, or wait the backoff and return the
        checkpoint the next attempt resumes from (the policy decides; recovery/policy.py)."""
        restart = self.policy.after(failure, stopping=bool(self._stop_signal))
        if restart.shrunk is not None:  # a rank given up: the next attempt goes on without it
            self.config = restart.shrunk.config
            self.world_size = self.shape.world_size
            self.config_file = stage_config(self.paths, self.config)
        for line in restart.notices:
            _notice(line)
        self._state = "restarting"
        self._update_board()
        deadline = time.monotonic() + restart.backoff_s
        while time.monotonic() < deadline and not self._stop_signal:
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        if self._stop_signal:  # a stop request while waiting: nothing runs, nothing to save
            raise RunStopped(
                self._stop_signal,
                f"stopped by {signal_name(self._stop_signal)} while restarting; resume with "
                f"shoal train --resume {self.paths.root}",
            )
        self._state = "running"
        return restart.point.path

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
        env[SECRET_ENV] = self._secret
        threads = self.config.run.threads_per_worker or max(
            1, (os.cpu_count() or 1) // self.world_size
        )
        env.setdefault("OMP_NUM_THREADS", str(threads))
        loopback = loopback_interface()
        if loopback:
            env.setdefault("GLOO_SOCKET_IFNAME", loopback)  # gloo listens on loopback only
        return env

    def _spawn(self, rank: int, port: int, resume: str | None, rejoin: bool = False) -> _Worker:
        cmd = ["--run-dir", str(self.paths.root)]
        if resume:
            cmd += ["--resume", resume]
        if self.restarts.count:
            cmd += ["--restart", str(self.restarts.count)]
        if rejoin:
            cmd.append("--rejoin")
        if self.config_file is not None:
            cmd += ["--config", str(self.config_file)]
        if self.allow_changes:
            cmd.append("--allow-changes")
        output = None
        if rank != 0:  # rank 0 shows progress on this terminal; the others write to files
            output = open(self.paths.output_file(rank), "ab")  # noqa: SIM115
        # in a session of its own: a terminal's Ctrl-C reaches the launcher alone, which
        # forwards it once (as torchrun does)
        keep = (self.lock_fd,) if self.lock_fd is not None else ()
        process = start_worker(cmd, self._environment(rank, port), output, keep)
        return _Worker(rank, process, output)

    # ------------------------------------------------------------ signals
    @contextlib.contextmanager
    def _signals_forwarded(self) -> Any:
        """SIGTERM/SIGINT: forward the first to every worker; a second kills them at once."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handle(signum: int, frame: FrameType | None) -> None:
            if self._stop_signal:
                self._kill()
                raise RunStopped(
                    signum,
                    f"stopped at once by a second {signal_name(signum)}; workers killed "
                    f"(the newest complete checkpoint is intact: shoal train --resume "
                    f"{self.paths.root})",
                )
            self._stop_signal = signum
            _notice(
                f"{signal_name(signum)} received: every worker stops at the next step boundary "
                "with a checkpoint (a second signal stops at once)"
            )
            for worker in self.workers:
                if worker.process.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        worker.process.send_signal(signum)

        previous = {s: signal.signal(s, handle) for s in STOP_SIGNALS}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    # ------------------------------------------------------------ watching
    def _watch(self) -> Failure | None:
        started = time.monotonic()
        next_check = started
        while True:
            now = time.monotonic()
            for worker in self.workers:
                if worker.exited_at is None and worker.process.poll() is not None:
                    worker.exited_at = now
            codes = [w.process.returncode for w in self.workers]
            if all(code == 0 for code in codes):
                return None
            if self.restarts.pending_step is not None:  # a restart's first step, to the poll
                self._recovered()  # (before a failure: the step may have come just before it)
            failed = [w for w in self.workers if w.process.returncode not in (None, 0, *STOP_CODES)]
            if len(failed) == 1 and self._restart_alone(failed[0], None):
                continue
            if failed:
                return self._failure(failed)
            if None not in codes:  # every worker ended, some of them on a stop request
                raise self._stopped()
            if now >= next_check:
                lost = self._lost_worker(now, now - started)
                if lost and self._restart_alone(self.workers[lost[0]], lost[1]):
                    lost = None
                flooded = self.guard.check()
                if flooded:  # not restarted: the next attempt's store would be flooded too
                    self._kill()
                    return Failure(JobFailed(flooded), None, -1, restartable=False)
                if lost:
                    self._recovered()
                    rank, message = lost
                    steps = self.reader.steps([w.rank for w in self.workers])
                    self._kill()
                    self.workers[rank].failed = True
                    step = max(steps.values(), default=-1)
                    return Failure(JobFailed(message), rank, step, restartable=True)
                self._update_board()
                next_check = now + HEARTBEAT_CHECK_S
            time.sleep(POLL_S)

    def _restart_alone(self, worker: _Worker, lost: str | None) -> bool:
        """A rank that died (or, `lost`: hung, stopped) restarted on its own while the others
        run on, when the recovery policy says so (`JobShape.restarts_alone`: a parameter
        server, restarts left, the state intact); False: the whole job fails or restarts."""
        rank = worker.rank
        alone, note = self.shape.restarts_alone(rank)
        if note:
            _notice(note)
        if not alone or self._stop_signal:
            return False
        steps = self.reader.steps([w.rank for w in self.workers])
        step = max(steps.values(), default=-1)
        if lost is not None:
            error: ShoalError = JobFailed(lost)
        else:
            report = read_report(self.paths.error_file(rank)) or self.reader.report(rank)
            if report and report.get("user_error"):
                return False
            error = self._describe(worker, report, steps.get(rank, -1), [])
        failure = Failure(error, rank, step, restartable=True)
        point = self.policy.alone(failure)
        if point is None:
            return False
        if lost is not None:  # hung or stopped: its connections must close for the others
            with contextlib.suppress(ProcessLookupError):
                worker.process.kill()
            worker.process.wait(timeout=KILL_GRACE_S)
        _notice(self.restarts.restarting(failure, point, 0.0, alone=True))
        if worker.output is not None:
            worker.output.close()
        self.paths.error_file(rank).unlink(missing_ok=True)
        self.workers[rank] = self._spawn(rank, self._port, point.path, rejoin=True)
        self._stopped_since.pop(rank, None)
        return True

    def _recovered(self) -> None:
        """Whether a rank's heartbeat shows the first step after the pending restart."""
        beats = [self.reader.heartbeat(w.rank) for w in self.workers]
        past = [b for b in beats if b is not None and b.step > (self.restarts.pending_step or 0)]
        if past:
            first = min(past, key=lambda b: b.wall)
            line = self.restarts.recovered(first.step, first.wall)
            if line:
                _notice(line)

    def _update_board(self) -> None:
        """status.json: each rank as this attempt sees it (recovery/status.py)."""
        reader = getattr(self, "reader", None)
        ranks = []
        for worker in self.workers:
            if reader is not None:
                beat = reader.heartbeat(worker.rank)
                self._last_beats[worker.rank] = beat
            beat = self._last_beats.get(worker.rank)
            code = worker.process.poll()
            if worker.failed:
                state = "failed"
            elif self._state == "restarting":
                state = "restarting"
            elif code == 0:
                state = "done"
            elif code in STOP_CODES:
                state = "stopped"
            elif code is not None:
                state = "failed" if self._state == "failed" else "restarting"
            else:
                state = beat.state if beat is not None else "starting"
            ranks.append(
                RankStatus(
                    rank=worker.rank,
                    role=beat.role if beat is not None else "-",
                    state=state,
                    step=beat.step if beat is not None else -1,
                    beat=beat.wall if beat is not None else None,
                    restarts=self.restarts.count,
                    failures=self.restarts.failures_by_rank.get(worker.rank, 0),
                    pid=worker.process.pid,
                )
            )
        self.board.write(self._state, self.restarts.count, ranks)

    def _see(self, rank: int) -> str:
        """'see LOG' for a rank's log or output file, whichever exists; never a path that
        does not (a worker still starting has written neither)."""
        found = existing(self.paths.log_file(rank), self.paths.output_file(rank))
        return f"see {found}" if found else "it has written no log yet"

    def _lost_worker(self, now: float, running_for: float) -> tuple[int, str] | None:
        """(rank, why) of a worker that is stopped, silent or never started; None if none."""
        faults = self.config.faults
        running = [w for w in self.workers if w.process.returncode is None]
        steps = self.reader.steps([w.rank for w in self.workers])
        for worker in running:
            rank = worker.rank
            last = f"step {steps[rank]}" if steps.get(rank, -1) >= 0 else "no step yet"
            ahead = max(steps.values(), default=-1)
            state = process_state(worker.process.pid)
            if state in STOPPED_STATES:
                since = self._stopped_since.setdefault(rank, now)
                if now - since >= STOPPED_AFTER_S:
                    return rank, (
                        f"{self._who(rank)} is stopped (process {worker.process.pid} in state "
                        f"{state}: SIGSTOP, Ctrl-Z or a debugger) and the job cannot go on "
                        f"without it; it last reported {last}, other ranks up to step {ahead}; "
                        f"{self._see(rank)}"
                    )
                continue
            self._stopped_since.pop(rank, None)
            beat = self.reader.heartbeat(rank)
            if beat is None:
                if running_for > faults.start_timeout_s:
                    return rank, (
                        f"{self._who(rank)} did not start within {faults.start_timeout_s:g} s "
                        f"(faults.start_timeout_s){self.reader.tampering(rank)}; {self._see(rank)}"
                    )
                continue
            silent = time.time() - beat[0]
            if silent > faults.heartbeat_timeout_s:
                return rank, (
                    f"{self._who(rank)} stopped responding: no heartbeat for {silent:.0f} s "
                    f"(faults.heartbeat_timeout_s = {faults.heartbeat_timeout_s:g}); it last "
                    f"reported {last}, other ranks up to step {ahead}"
                    f"{self.reader.tampering(rank)}; {self._see(rank)}"
                )
        return None

    def _stopped(self) -> RunStopped:
        """Every worker ended and some stopped on request: how the run ended, in one line."""
        codes = [w.process.returncode for w in self.workers]
        signum = self._stop_signal or next(abs(c) % 128 for c in codes if c in STOP_CODES)
        results = self._results_of_this_session()
        stop = results.get("stop") if results else None
        if isinstance(stop, dict) and {"signal", "step"} <= stop.keys():
            return RunStopped(signum, describe_stop(stop, str(self.paths.root)))
        steps = self.reader.steps([w.rank for w in self.workers])
        step = max(steps.values(), default=-1)
        where = f"at step {step}" if step >= 0 else "before its first step"
        return RunStopped(
            signum, f"stopped by {signal_name(signum)} {where}; no checkpoint was written"
        )

    def _results_of_this_session(self) -> dict[str, Any] | None:
        """results.json, if this launch wrote it (a resumed run's folder holds older ones)."""
        with contextlib.suppress(OSError, ValueError):
            if self.paths.results.stat().st_mtime >= self._started_wall:
                data = json.loads(self.paths.results.read_text())
                return data if isinstance(data, dict) else None
        return None

    def _failure(self, failed: list[_Worker]) -> Failure:
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
            (w for w in self.workers if w.process.returncode not in (None, 0, *STOP_CODES)),
            key=lambda w: (w not in failed, w.exited_at),
        )
        steps = self.reader.steps([w.rank for w in self.workers])
        silent_peers = [w.rank for w in self.workers if w.process.poll() is None]
        self._kill()
        reports = {
            w.rank: read_report(self.paths.error_file(w.rank)) or self.reader.report(w.rank)
            for w in on_their_own
        }
        causes = [
            w for w in on_their_own if (reports[w.rank] or {}).get("communication_error") is False
        ]
        unreported = [w for w in on_their_own if reports[w.rank] is None]
        culprit = (causes or unreported or on_their_own)[0]
        culprit.failed = True
        report = reports.get(culprit.rank)
        reported = [int(r["step"]) for r in reports.values() if r]
        reached = max([*steps.values(), *reported], default=-1)
        error = self._describe(culprit, report, steps.get(culprit.rank, -1), silent_peers)
        user_error = bool(report and report.get("user_error"))
        return Failure(error, culprit.rank, reached, restartable=not user_error)

    def _describe(
        self,
        culprit: _Worker,
        report: dict[str, Any] | None,
        beat_step: int,
        silent_peers: list[int],
    ) -> ShoalError:
        """The one line that names the rank at fault and what happened to it."""
        found = existing(self.paths.log_file(culprit.rank), self.paths.output_file(culprit.rank))
        log = f"log: {found}" if found else "it wrote no log"
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
        # the newest step known: the report's (taken when it failed) or its last heartbeat's
        step = max(int(report["step"]) if report else -1, beat_step)
        if report and step >= 0:
            where = f" at step {step}"
        elif step >= 0:
            where = f" (last reported step {step})"
        else:
            where = " before reporting its first step"
        code = culprit.process.returncode
        if report:
            what = f"{report['type']}: {report['message']}"
            if report.get("communication_error") and silent_peers:
                listed = ", ".join(map(str, silent_peers))
                what += f"; rank {listed} had not failed but stopped answering"
            return JobFailed(f"{self._who(culprit.rank)} failed{where}: {what} ({log})")
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            return JobFailed(f"{self._who(culprit.rank)} was killed by {name}{where} ({log})")
        return JobFailed(
            f"{self._who(culprit.rank)} exited with code {code} without an error report{where} "
            f"({log})"
        )

    def _who(self, rank: int) -> str:
        """A rank as failure messages name it: with its role where the job's shape has roles
        (a pipeline's stage)."""
        return self.shape.describe_rank(rank)

    def _kill(self) -> None:
        """End every worker still running, at once.

        SIGKILL, not SIGTERM: a worker takes SIGTERM as a request to stop at its next
        step boundary, which a job that already failed may never reach.
        """
        running = [w for w in self.workers if w.process.poll() is None]
        for worker in running:
            with contextlib.suppress(ProcessLookupError):
                worker.process.kill()
        for worker in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.process.wait(timeout=KILL_GRACE_S)


def _notice(message: str) -> None:
    """A warning of the launcher's own, on stderr (errors come once, at the end)."""
    print(f"shoal: warning: {message}", file=sys.stderr, flush=True)
