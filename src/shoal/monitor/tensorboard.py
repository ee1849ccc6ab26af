"""TensorBoard event files with metrics.jsonl's scalars (`[monitor] tensorboard = true`).

One writer per run, in `RUN/tensorboard/`, fed by :class:`~shoal.monitor.metrics.MetricsLog`
with the scalars of every record it writes (`monitor/scalars.py` says which), so
`tensorboard --logdir runs/` shows every run beside the others.
`torch.utils.tensorboard` needs the `tensorboard` package, an optional extra
(`shoal[tensorboard]`); the config refuses `tensorboard = true` without it.
"""

from __future__ import annotations

from pathlib import Path

from shoal.monitor.scalars import Outcome


class ScalarWriter:
    """Writes each record's scalars to one run's event file."""

    def __init__(self, folder: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # the optional extra

        self._writer = SummaryWriter(log_dir=str(folder))

    def write(self, step: int, scalars: dict[str, float]) -> None:
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, value, step)

    def close(self, outcome: Outcome) -> None:
        self._writer.flush()
        self._writer.close()
