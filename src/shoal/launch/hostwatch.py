"""Heartbeats across hosts: a job that torchrun or Slurm started names a host it loses.

Under shoal's own launcher, the launcher watches its workers. Under torchrun or
Slurm nobody watches the job as a whole: a host that loses power or its link
leaves the others blocked in a collective until `faults.timeout_s`, or failing
with gloo's "connection closed", which names no one. So every rank of such a
job beats into the job's store (runtime/heartbeat.py, values sealed with a key
of this attempt) and a thread on every rank reads everyone's beats: ranks
silent for `faults.heartbeat_timeout_s` are named, grouped by host ("host node1
(10.1.0.2) lost: ranks 2, 3 ..."), and the rank ends with that line (exit 1),
so every surviving host stops within the timeout and torchrun or srun ends the
job. The store itself lives on one host (torchrun's rendezvous endpoint, or
Slurm's rank 0): when it stops answering for as long, that host is the one named.

Silence is measured on the reader's own monotonic clock from when a rank's
beat last changed, so clocks that differ between hosts do not matter. Once one
rank is past the timeout, the others silent for more than half of it are named
with it: the ranks of a host that went down at once, whose last beats were a
fraction of an interval apart, are named together. A rank
that finished (or failed with its own error) says so under `shoal/done/<rank>`
before it stops beating, and is not taken for lost.

Each rank reads every rank's key once per interval: world_size² small reads per
interval on the store, fine for tens of hosts at a 1 s interval.

On rank 0 the same thread answers late claims to join (launch/admission.py), and
keeps the run's status.json (recovery/status.py) for `shoal status`, as shoal's own
launcher does: it reads every rank's beat anyway, which says each rank's role,
state and step. It cannot see other hosts' processes, so it names no pid but its
own; a rank that finished, failed or was lost is what its done key or silence says.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch.distributed as dist

from shoal.config.sections import FaultsConfig
from shoal.errors import EXIT_FAILURE
from shoal.launch.admission import Doorkeeper
from shoal.launch.process_group import exit_process
from shoal.recovery.status import RankStatus, StatusBoard
from shoal.runtime.auth import BadValue, Opener, Signer
from shoal.runtime.heartbeat import Beat, Heartbeat, heartbeat_key, parse_beat_detail
from shoal.shape.hosts import Hosts


def done_key(signer: Signer, rank: int) -> str:
    return signer.key_name(f"shoal/done/{rank}")


def failed_key(signer: Signer) -> str:
    """A counter of the ranks that failed with an error of their own (not lost)."""
    return signer.key_name("shoal/failed")


@dataclass(frozen=True)
class StoreAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def lost_message(
    hosts: Hosts,
    silent: dict[int, float],
    timeout_s: float,
    store_down: str | None = None,
    ending: str = "the job stops",
) -> str:
    """One line naming what was lost: whole hosts with their ranks, or single ranks; then
    what happens to the job (`ending`)."""
    parts = []
    if store_down is not None:
        parts.append(store_down)
    for host in range(hosts.count):
        ranks = hosts.ranks(host)
        quiet = [r for r in ranks if r in silent]
        if not quiet:
            continue
        gap = max(silent[r] for r in quiet)
        listed = ("rank " if len(quiet) == 1 else "ranks ") + ", ".join(map(str, quiet))
        if len(quiet) == len(ranks):
            parts.append(
                f"host {hosts.label(host)} lost: {listed} sent no heartbeat for {gap:.1f} s"
            )
        else:
            parts.append(
                f"{listed} on host {hosts.label(host)} stopped responding: no heartbeat "
                f"for {gap:.1f} s"
            )
    return "; ".join(parts) + f" (faults.heartbeat_timeout_s = {timeout_s:g}); {ending}"


class HostWatch:
    """This rank's heartbeat, and the thread that watches every rank's."""

    def __init__(
        self,
        store_at: StoreAddress,
        rank: int,
        hosts: Hosts,
        faults: FaultsConfig,
        signer: Signer,
        log: logging.Logger,
        on_lost: Callable[[str], None],
        doors: Doorkeeper | None = None,
        board: StatusBoard | None = None,
        restarts: int = 0,
        max_restarts: int = 0,
    ) -> None:
        self.rank, self.hosts, self.faults, self.log = rank, hosts, faults, log
        self._signer, self._on_lost, self._doors = signer, on_lost, doors
        self._board = board  # rank 0: status.json
        self._restarts, self._max_restarts = restarts, max_restarts  # torchrun's, so far / most
        self._beats: dict[int, Beat] = {}  # every rank's newest authentic beat
        self._ended: dict[int, str] = {}  # rank -> done, failed (its done key) or lost
        self._store_at = store_at
        timeout = faults.heartbeat_timeout_s
        self.heartbeat = Heartbeat(
            store_at.host, store_at.port, rank, faults.heartbeat_interval_s, timeout, signer
        )
        self._store = dist.TCPStore(
            store_at.host,
            store_at.port,
            is_master=False,
            timeout=datetime.timedelta(seconds=timeout),
            wait_for_workers=False,
        )
        self._opener = Opener(signer)
        self.verdict: str | None = None
        self._decided = threading.Event()
        self._stop = threading.Event()
        self._write_status("running", every=None)  # `shoal status` works from the start
        self._thread = threading.Thread(target=self._run, name="shoal-hostwatch", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the thread
    def _run(self) -> None:
        now = time.monotonic()
        last_seen: dict[int, Beat] = {}
        changed = {r: now for r in range(self.hosts.world_size)}
        store_ok = now
        store_error = ""
        finished: set[int] = set()
        while not self._stop.wait(self.faults.heartbeat_interval_s):
            now = time.monotonic()
            try:
                for rank in range(self.hosts.world_size):
                    beat = self._beat(rank)
                    if beat is not None and beat != last_seen.get(rank):
                        last_seen[rank] = self._beats[rank] = beat
                        changed[rank] = now
                if self._store.add(failed_key(self._signer), 0) > 0:
                    self._decided.set()  # a peer failed and says why: nothing to explain
                if self._doors is not None:
                    self._doors.answer(self._store)
                store_ok = time.monotonic()
            except Exception as exc:  # the store's host is gone, or unreachable
                text = str(exc).strip()
                store_error = text.splitlines()[0][:200] if text else type(exc).__name__
            if self._stop.is_set():
                return
            now = time.monotonic()  # a read of an unreachable store blocks up to the timeout
            timeout = self.faults.heartbeat_timeout_s
            silent = {
                r: now - t
                for r, t in changed.items()
                if r != self.rank and now - t > timeout / 2 and r not in finished
            }
            if any(gap > timeout for gap in silent.values()):
                finished |= self._finished(list(silent))
                silent = {r: gap for r, gap in silent.items() if r not in finished}
            if not any(gap > timeout for gap in silent.values()):
                silent = {}
            store_down = None
            if now - store_ok > timeout:
                store_down = self._store_lost(now - store_ok, store_error)
                silent = {}  # nothing read: the beats say nothing
            if silent or store_down:
                self._ended.update(dict.fromkeys(silent, "failed"))
                self._write_status(self._ending(), every=None)
                ending = "the job stops"
                if self._restarts < self._max_restarts:  # torchrun's elastic agent goes on
                    ending = (
                        f"this attempt stops and torchrun starts the job again (restart "
                        f"{self._restarts + 1} of {self._max_restarts}, --max-restarts)"
                    )
                self._decide(lost_message(self.hosts, silent, timeout, store_down, ending))
                return
            self._write_status("running", every=None)

    def _beat(self, rank: int) -> Beat | None:
        key = heartbeat_key(self._signer, rank)
        if not self._store.check([key]):
            return None
        try:
            return parse_beat_detail(self._opener.open(key, self._store.get(key)))
        except BadValue:
            return None  # not authentic: never counts as a sign of life

    def _finished(self, ranks: list[int]) -> set[int]:
        out = set()
        for rank in ranks:
            key = done_key(self._signer, rank)
            try:
                if self._store.check([key]):
                    said = self._opener.open(key, self._store.get(key))
                    self._ended[rank] = "done" if said == b"ok" else "failed"
                    out.add(rank)
            except Exception:  # unreadable, or forged: the rank is not known to be done
                continue
        return out

    def _store_lost(self, gap: float, error: str) -> str:
        """'host X lost: the job's store there ... ; its ranks ...', or the store alone."""
        where = self._store_at.host
        try:
            address = socket.getaddrinfo(where, None)[0][4][0]
        except OSError:
            address = where
        for host in range(self.hosts.count):
            if where == self.hosts.names[host] or address == self.hosts.addresses[host]:
                ranks = ", ".join(map(str, self.hosts.ranks(host)))
                return (
                    f"host {self.hosts.label(host)} lost: the job's store there "
                    f"({self._store_at}) has not answered for {gap:.1f} s ({error}); its "
                    f"ranks {ranks}"
                )
        return f"the job's store at {self._store_at} has not answered for {gap:.1f} s ({error})"

    def _write_status(self, state: str, every: str | None) -> None:
        """Rank 0: status.json as this watch sees the job (`every`: each rank's state)."""
        if self._board is None:
            return
        ranks = []
        for rank in range(self.hosts.world_size):
            beat = self._beats.get(rank)
            ended = every or self._ended.get(rank)
            ranks.append(
                RankStatus(
                    rank=rank,
                    role=beat.role if beat is not None else "-",
                    state=ended or (beat.state if beat is not None else "starting"),
                    step=beat.step if beat is not None else -1,
                    beat=beat.wall if beat is not None else None,
                    restarts=self._restarts,
                    failures=0,  # who caused a failure is torchrun's to know, not this rank's
                    pid=os.getpid() if rank == self.rank else None,
                )
            )
        self._board.write(state, self._restarts, ranks)

    def _ending(self) -> str:
        """The job's state when this attempt fails: torchrun starts another while restarts
        are left (`--max-restarts`), else the job failed."""
        return "restarting" if self._restarts < self._max_restarts else "failed"

    def _decide(self, message: str) -> None:
        self.verdict = message
        self._decided.set()
        self._on_lost(message)

    # ------------------------------------------------------------ the main thread
    def explain(self, within_s: float) -> str | None:
        """After a communication error: the lost host or ranks, if the watch names any within
        `within_s` (it then also ends the process, through `on_lost`); None at once when a
        peer failed with an error of its own (its message says why)."""
        self._decided.wait(within_s)
        return self.verdict

    def finish(self, ok: bool) -> None:
        """This rank is done (`ok`) or failed with its own error: say so, then stop beating.

        The thread stops first (the store client is not shared between threads)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.faults.heartbeat_interval_s + 5.0)
        if self._board is not None:  # rank 0 ends last: the job's end, or this attempt's
            with contextlib.suppress(Exception):  # the newest beats (a short job: the first)
                for rank in range(self.hosts.world_size):
                    beat = self._beat(rank)
                    if beat is not None:
                        self._beats[rank] = beat
            if ok:
                self._write_status("done", every="done")
            else:
                self._ended[self.rank] = "failed"
                self._write_status(self._ending(), every=None)
        key = done_key(self._signer, self.rank)
        with contextlib.suppress(Exception):  # the store is gone: nobody is left to be told
            self._store.set(key, self._signer.seal(key, b"ok" if ok else b"failed").decode())
            if not ok:
                self._store.add(failed_key(self._signer), 1)
        self.heartbeat.close()
        self._store = None  # type: ignore[assignment]


def end_process(log: logging.Logger, message: str) -> None:
    """How a rank leaves when the watch named a lost host: the line in its log and on stderr,
    then exit 1 at once (its main thread may be blocked in a collective)."""
    log.error("%s", message)
    for handler in log.handlers:
        handler.flush()
    print(f"shoal: {message}", file=sys.stderr, flush=True)
    exit_process(EXIT_FAILURE)
