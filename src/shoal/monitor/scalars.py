"""The scalars of a metrics.jsonl record, as every scalar sink receives them.

TensorBoard, Weights & Biases and MLflow are fed the same scalars, by construction:
:class:`~shoal.monitor.metrics.MetricsLog` turns each record it writes into them here
once, and hands them to every sink. A scalar's tag is `<event>/<field>` (`train/loss`,
`round/update_norm`), an evaluation's `<event>/<split>/<field>` (`eval/valid/accuracy`); its
step is the record's `step` (a round's, a generation's last step). Records without a step,
and fields that are not numbers (paths, lists, per-client ids, NaN written as null), have no
scalar.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

#: fields that locate a record rather than measure something
POSITION = ("event", "step", "epoch", "split", "round", "generation", "time")

#: how a training session ended, as a tracker records it
Outcome = Literal["completed", "failed", "stopped"]


def scalars_of(record: dict[str, Any]) -> tuple[int, dict[str, float]] | None:
    """The record's step and its numeric fields by tag; None when it has no step."""
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    prefix = str(record.get("event", "record"))
    if "split" in record:
        prefix += f"/{record['split']}"
    scalars = {
        f"{prefix}/{name}": value
        for name, value in record.items()
        if name not in POSITION and isinstance(value, int | float) and not isinstance(value, bool)
    }
    return step, scalars


class ScalarSink(Protocol):
    """Where a run's scalars go besides metrics.jsonl (rank 0 opens it, `sinks.py`)."""

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """One record's scalars, at its step (several records may share a step)."""

    def close(self, outcome: Outcome) -> None:
        """Flush and end: the run `completed`, `failed` (an exception) or was `stopped` (a
        stop signal)."""
