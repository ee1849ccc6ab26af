"""metrics.jsonl: one JSON object per line, appended as training goes (rank 0 only).

Every record carries `time`, the Unix time it was written, so figures can be drawn
against wall time (`shoal report`), across a resume's gap too; the launcher's
failure and restart records carry it as well.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from shoal.monitor.scalars import Outcome, ScalarSink, scalars_of


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


class MetricsLog:
    """Appends records to metrics.jsonl; each line is flushed so a crash loses at most one.
    Each record's scalars also go to `sinks` (TensorBoard, W&B, MLflow: `monitor/sinks.py`),
    the same scalars to every one (`monitor/scalars.py`)."""

    def __init__(self, path: Path, enabled: bool, sinks: list[ScalarSink] | None = None) -> None:
        self.path = path
        self._handle = open(path, "a", encoding="utf-8") if enabled else None  # noqa: SIM115
        self._sinks = list(sinks or []) if enabled else []

    def write(self, record: dict[str, Any]) -> None:
        if self._handle is None:
            return
        clean = {k: _clean(v) for k, v in record.items()}
        clean.setdefault("time", round(time.time(), 3))
        self._handle.write(json.dumps(clean) + "\n")
        self._handle.flush()
        scalars = scalars_of(clean) if self._sinks else None
        if scalars is not None:
            for sink in self._sinks:
                sink.write(*scalars)

    def close(self, outcome: Outcome = "completed") -> None:
        """Close the file, and end every sink with how the session ended."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        sinks, self._sinks = self._sinks, []
        failure: Exception | None = None
        for sink in sinks:  # every one is ended, even after another failed to
            try:
                sink.close(outcome)
            except Exception as error:
                failure = failure or error
        if failure is not None:
            raise failure


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl (for tests, benchmarks and users' notebooks)."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
