"""Progress of a preparation: a rich bar on a terminal, a log line every few seconds
otherwise, and a heartbeat for the processes waiting on the lock (`lock.py`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Literal

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

PLAIN_EVERY_S = 5.0


class PrepareProgress:
    """Phases (reading each file, by bytes; sorting; checksums) of one preparation."""

    def __init__(
        self,
        mode: Literal["bar", "plain", "off"] = "off",
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.mode = mode
        self.log = log or (lambda line: print(line, file=sys.stderr))
        self.beats: list[Callable[[], None]] = []
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._phase = ""
        self._total: int | None = None
        self._done = 0
        self._last_line = 0.0

    def phase(self, name: str, total: int | None = None) -> None:
        """A new phase; `total` bytes (or None: no measure of how far it is)."""
        self._phase, self._total, self._done = name, total, 0
        self._beat()
        if self.mode == "bar":
            if self._bar is None:
                self._bar = Progress(
                    TextColumn("{task.description}"),
                    BarColumn(),
                    DownloadColumn(),
                    TransferSpeedColumn(),
                    TimeElapsedColumn(),
                    console=Console(file=sys.stderr),
                    transient=True,
                )
                self._bar.start()
            if self._task is not None:
                self._bar.update(self._task, visible=False)
            self._task = self._bar.add_task(name, total=total)
        elif self.mode == "plain":
            self.log(f"preparing graph: {name}")
            self._last_line = time.monotonic()

    def advance_to(self, done: int) -> None:
        """`done` bytes of the phase's total are behind."""
        self._done = done
        self._beat()
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=done)
        elif self.mode == "plain" and time.monotonic() - self._last_line >= PLAIN_EVERY_S:
            share = f" {100 * done / self._total:.0f}%" if self._total else ""
            self.log(f"preparing graph: {self._phase}{share}")
            self._last_line = time.monotonic()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def _beat(self) -> None:
        for beat in self.beats:
            beat()
