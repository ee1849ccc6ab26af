"""TensorBoard event files with metrics.jsonl's scalars (`[monitor] tensorboard = true`).

One writer per run, in `RUN/tensorboard/`, fed by :class:`~shoal.monitor.metrics.MetricsLog`
with every record it writes: the scalars are the same as metrics.jsonl's, by
construction, and `tensorboard --logdir runs/` shows every run beside the others.
A scalar's tag is `<event>/<field>` (`train/loss`, `round/update_norm`), an
evaluation's `<event>/<split>/<field>` (`eval/valid/accuracy`); its step is the
record's `step` (a round's, a generation's last step). Records without a step, and
fields that are not numbers (paths, lists, per-client ids), have no scalar.
`torch.utils.tensorboard` needs the `tensorboard` package, an optional extra
(`shoal[tensorboard]`); the config refuses `tensorboard = true` without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: fields that locate a record rather than measure something
POSITION = ("event", "step", "epoch", "split", "round", "generation", "time")


class ScalarWriter:
    """Writes each record's numeric fields as scalars of one run's event file."""

    def __init__(self, folder: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # the optional extra

        self._writer = SummaryWriter(log_dir=str(folder))

    def write(self, record: dict[str, Any]) -> None:
        step = record.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            return
        prefix = str(record.get("event", "record"))
        if "split" in record:
            prefix += f"/{record['split']}"
        for name, value in record.items():
            if name in POSITION or isinstance(value, bool):
                continue
            if isinstance(value, int | float):
                self._writer.add_scalar(f"{prefix}/{name}", value, step)

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()
