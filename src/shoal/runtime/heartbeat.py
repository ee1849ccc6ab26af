"""A worker's heartbeat: liveness and progress, reported to the launcher's store.

A background thread writes `<wall time> <step> <state> <role>` under
`shoal/heartbeat/<rank>/<tag>` every interval, sealed with the job's secret
(`runtime/auth.py`): anyone can connect to the store, so the launcher believes
only values it can authenticate.
The launcher reads them: a rank whose heartbeat stops is named as lost, and the
steps tell which rank is behind when a collective times out; the state (training,
evaluating, checkpointing...) and the rank's role feed `shoal status`
(recovery/status.py). A worker that fails also leaves its one-line error report
under `shoal/report/<rank>/<tag>`: the store needs no disk, so the report arrives
even when the run's disk is full.

The thread beats while the main thread computes, evaluates or writes a
checkpoint (those release the GIL, or hold it for well under a second at a
time), so the launcher can use a short timeout without false alarms.
"""

from __future__ import annotations

import abc
import contextlib
import datetime
import json
import math
import re
import threading
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch.distributed as dist

from shoal.runtime.auth import BadValue, Signer


def heartbeat_key(signer: Signer, rank: int) -> str:
    """The store key of a rank's heartbeat (tagged with the job's secret)."""
    return signer.key_name(f"shoal/heartbeat/{rank}")


def report_key(signer: Signer, rank: int) -> str:
    """The store key of a rank's error report (tagged with the job's secret)."""
    return signer.key_name(f"shoal/report/{rank}")


#: the fields of a report sent through the store, with their types
REPORT_FIELDS: dict[str, type | tuple[type, ...]] = {
    "rank": int,
    "step": int,
    "type": str,
    "message": str,
    "lines": list,
    "user_error": bool,
    "exit_code": int,
    "communication_error": bool,
}
_MAX_TEXT = 2000

#: a step newer than the last beat is sent within this many seconds (not at the next tick)
FRESH_S = 0.2

#: what a worker can say it is doing (the launcher adds failed, restarting, done, stopped)
WORKER_STATES = ("starting", "training", "evaluating", "checkpointing")
_ROLE = re.compile(r"[a-z][a-z+]{0,31}")


class Beat(NamedTuple):
    """An authenticated heartbeat: when, at which step, doing what, in which role."""

    wall: float
    step: int
    state: str = "training"
    role: str = "worker"


class Beats(abc.ABC):
    """A rank's progress, reported by a background thread every interval: the step it
    reached and what it is doing. Where the beats go is the subclass's (`_send`): the
    launcher's store (`Heartbeat`), or status.json for a job inside the calling process
    (recovery/status.py)."""

    def __init__(self, rank: int, interval_s: float) -> None:
        self.rank = rank
        self.step = -1
        self.state = "starting"
        self.role = "worker"  # set once the strategy's roles are known (launch/job.py)
        self._interval = interval_s
        self._lock = threading.Lock()  # one send at a time: the thread and the caller
        self._stop = threading.Event()
        self._wake = threading.Event()  # a new step to send before the interval is up
        self._sent = 0.0  # monotonic time of the newest send
        self._thread = threading.Thread(
            target=self._run, name=f"shoal-heartbeat-{rank}", daemon=True
        )

    def _start(self) -> None:
        self._beat()
        self._thread.start()

    @abc.abstractmethod
    def _send(self, beat: Beat) -> None:
        """Deliver one beat (to the launcher's store, or to an in-process status board)."""

    def beat(self, step: int, now: bool = False) -> None:
        """Record progress; the thread reports it at its next tick, or within FRESH_S when
        the step moved (so a failure message names the step a rank reached, not one a second
        older); `now`: at once, from this thread (e.g. the step a run resumed at)."""
        self.step = step
        if not now and time.monotonic() - self._sent >= FRESH_S:
            self._wake.set()  # the thread sends it: this one never waits on the store
        if now:
            try:
                self._beat()
            except Exception:  # the launcher is gone; its death signal ends this process
                return

    @contextlib.contextmanager
    def doing(self, state: str) -> Iterator[None]:
        """Report `state` (evaluating, checkpointing) for the block, then what came before."""
        before, self.state = self.state, state
        try:
            yield
        finally:
            self.state = before

    def _beat(self) -> None:
        beat = Beat(time.time(), self.step, self.state, self.role)
        with self._lock:
            self._sent = time.monotonic()
            self._send(beat)

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._beat()
            except Exception:  # the launcher is gone; its death signal ends this process
                return

    def stop(self) -> None:
        """Stop reporting (also how an injected 'hang' fault makes a worker look frozen)."""
        self._stop.set()
        self._wake.set()

    def close(self) -> None:
        """Stop, wait for the thread, then release what the beats went through.

        A last beat first (unless the beats were stopped on purpose) leaves the final step
        for `shoal status`."""
        if not self._stop.is_set():
            with contextlib.suppress(Exception):
                self._beat()
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._interval + 5.0)
        self._release()

    def _release(self) -> None:  # noqa: B027 (optional: most subclasses hold nothing)
        """Free what `_send` wrote through (after the thread has ended)."""


class Heartbeat(Beats):
    """Beats sealed into the launcher's store, where the launcher reads them."""

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        interval_s: float,
        timeout_s: float,
        signer: Signer,
    ) -> None:
        super().__init__(rank, interval_s)
        self._signer = signer
        self._store = dist.TCPStore(
            host,
            port,
            is_master=False,
            timeout=datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
        self._start()

    def _send(self, beat: Beat) -> None:
        key = heartbeat_key(self._signer, self.rank)
        text = f"{beat.wall:.3f} {beat.step} {beat.state} {beat.role}"
        value = self._signer.seal(key, text.encode())
        self._store.set(key, value.decode())  # ASCII: the stub takes str

    def report(self, report: dict[str, Any]) -> None:
        """Leave this rank's error report (the fields of REPORT_FIELDS) in the store."""
        fields = {name: report[name] for name in REPORT_FIELDS}
        fields["lines"] = [str(line)[:_MAX_TEXT] for line in fields["lines"][:8]]
        fields["message"] = str(fields["message"])[:_MAX_TEXT]
        key = report_key(self._signer, self.rank)
        value = self._signer.seal(key, json.dumps(fields).encode())
        try:
            with self._lock:
                self._store.set(key, value.decode())  # ASCII: the stub takes str
        except Exception:  # the launcher is gone: nobody is left to read it
            return

    def _release(self) -> None:
        """The store client is a C++ object: freeing it from interpreter finalization, while
        the thread may still be inside a call, can abort the process."""
        self._store = None  # type: ignore[assignment]


def parse_beat(payload: bytes) -> tuple[float, int]:
    """(wall time, step) of an authenticated heartbeat payload; BadValue if malformed."""
    beat = parse_beat_detail(payload)
    return beat.wall, beat.step


def parse_beat_detail(payload: bytes) -> Beat:
    """The whole of an authenticated heartbeat payload (`<wall> <step>` alone, as older
    workers sent it, reads as training in the role of a worker); BadValue if malformed."""
    try:
        fields = payload.decode("ascii").split()
        if len(fields) not in (2, 4):
            raise ValueError
        wall, step = float(fields[0]), int(fields[1])
    except (UnicodeDecodeError, ValueError):
        raise BadValue("not '<wall time> <step> <state> <role>'") from None
    if not math.isfinite(wall) or step < -1:
        raise BadValue("a time or step out of range")
    if len(fields) == 2:
        return Beat(wall, step)
    state, role = fields[2], fields[3]
    if state not in WORKER_STATES or not _ROLE.fullmatch(role):
        raise BadValue("an unknown state or role")
    return Beat(wall, step, state, role)


def parse_report(payload: bytes) -> dict[str, Any]:
    """An authenticated report payload, checked field by field; BadValue if malformed."""
    try:
        report = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise BadValue("not JSON") from None
    if not isinstance(report, dict):
        raise BadValue("not a JSON object")
    for name, kind in REPORT_FIELDS.items():
        value = report.get(name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise BadValue(f"field {name!r} missing or not {getattr(kind, '__name__', kind)}")
    if not all(isinstance(line, str) for line in report["lines"]):
        raise BadValue("field 'lines' holds a non-string")
    return {name: report[name] for name in REPORT_FIELDS}
