"""A worker's heartbeat: liveness and progress, reported to the launcher's store.

A background thread writes `<wall time> <step>` under `shoal/heartbeat/<rank>`
every interval. The launcher reads them: a rank whose heartbeat stops is named
as lost, and the steps tell which rank is behind when a collective times out.
"""

from __future__ import annotations

import datetime
import threading
import time

import torch.distributed as dist

KEY = "shoal/heartbeat/{rank}"


class Heartbeat:
    def __init__(
        self, host: str, port: int, rank: int, interval_s: float, timeout_s: float
    ) -> None:
        self.rank = rank
        self.step = -1
        self._interval = interval_s
        self._store = dist.TCPStore(
            host,
            port,
            is_master=False,
            timeout=datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
        self._stop = threading.Event()
        self._beat()
        self._thread = threading.Thread(
            target=self._run, name=f"shoal-heartbeat-{rank}", daemon=True
        )
        self._thread.start()

    def beat(self, step: int) -> None:
        """Record progress; the thread reports it at its next tick."""
        self.step = step

    def _beat(self) -> None:
        self._store.set(KEY.format(rank=self.rank), f"{time.time():.3f} {self.step}")

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._beat()
            except Exception:  # the launcher is gone; its death signal ends this process
                return

    def stop(self) -> None:
        """Stop reporting (also how an injected 'hang' fault makes a worker look frozen)."""
        self._stop.set()

    def close(self) -> None:
        """Stop, wait for the thread, and release the store connection before the process exits.

        The store client is a C++ object: freeing it from interpreter finalization,
        while the thread may still be inside a call, can abort the process.
        """
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._interval + 5.0)
        self._store = None  # type: ignore[assignment]


def read_heartbeat(store: dist.Store, rank: int) -> tuple[float, int] | None:
    """(wall time, step) of a rank's last heartbeat, or None before its first."""
    key = KEY.format(rank=rank)
    if not store.check([key]):
        return None
    wall, step = store.get(key).decode().split()
    return float(wall), int(step)
