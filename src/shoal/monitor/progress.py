"""Progress on rank 0: a live rich bar on a terminal, plain periodic lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def _fmt_eta(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressReporter:
    """Shows steps, epoch, loss, samples/s and ETA. `mode`: auto | bar | plain | off."""

    def __init__(
        self, mode: str, enabled: bool, total_steps: int, total_epochs: int | None
    ) -> None:
        self.total_steps = total_steps
        self.total_epochs = total_epochs
        self.console = Console(file=sys.stdout)
        if not enabled or mode == "off":
            self.mode = "off"
        elif mode == "auto":
            self.mode = "bar" if self.console.is_terminal else "plain"
        else:
            self.mode = mode
        self._bar: Progress | None = None
        self._task: Any = None
        self._started = time.perf_counter()
        self._start_step = 0

    def start(self, step: int) -> None:
        self._started = time.perf_counter()
        self._start_step = step
        if self.mode == "bar":
            self._bar = Progress(
                TextColumn("[bold]epoch {task.fields[epoch]}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}"),
                TextColumn("{task.fields[speed]} samples/s"),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=self.console,
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(
                "train", total=self.total_steps, completed=step, epoch="-", loss="-", speed="-"
            )

    def epoch_text(self, epoch: int) -> str:
        """A 0-based epoch as the bar shows it: "2/8" (1-based, of the total)."""
        return f"{epoch + 1}/{self.total_epochs}" if self.total_epochs else f"{epoch + 1}"

    def update(self, step: int, epoch: int, metrics: dict[str, Any] | None = None) -> None:
        """Called every step (cheap) and with `metrics` at every logging interval."""
        if self.mode == "bar" and self._bar is not None:
            fields: dict[str, Any] = {"epoch": self.epoch_text(epoch)}
            if metrics:
                fields["loss"] = f"{metrics['loss']:.4f}"
                fields["speed"] = f"{metrics['samples_per_s']:,.0f}"
            self._bar.update(self._task, completed=step, **fields)
        elif self.mode == "plain" and metrics:
            done = step - self._start_step
            elapsed = time.perf_counter() - self._started
            eta = elapsed / done * (self.total_steps - step) if done else 0.0
            extra = "".join(
                f" {k} {v:.4f}"
                for k, v in metrics.items()
                if k.startswith("train_") and v is not None
            )
            print(
                f"step {step}/{self.total_steps} epoch {self.epoch_text(epoch)} "
                f"loss {metrics['loss']:.4f}{extra} {metrics['samples_per_s']:,.0f} samples/s "
                f"lr {metrics['lr']:.3g} eta {_fmt_eta(eta)}",
                flush=True,
            )

    def note(self, text: str) -> None:
        """A line such as an evaluation result, printed above the bar."""
        if self.mode == "bar" and self._bar is not None:
            self._bar.console.print(text)
        elif self.mode == "plain":
            print(text, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
