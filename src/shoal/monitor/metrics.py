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

from shoal.monitor.tensorboard import ScalarWriter


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


class MetricsLog:
    """Appends records to metrics.jsonl; each line is flushed so a crash loses at most one.
    With `tensorboard` (a folder), the same records' scalars also go to TensorBoard event
    files there (`monitor/tensorboard.py`)."""

    def __init__(self, path: Path, enabled: bool, tensorboard: Path | None = None) -> None:
        self.path = path
        self._handle = open(path, "a", encoding="utf-8") if enabled else None  # noqa: SIM115
        self._scalars: ScalarWriter | None = None
        if enabled and tensorboard is not None:
            self._scalars = ScalarWriter(tensorboard)

    def write(self, record: dict[str, Any]) -> None:
        if self._handle is None:
            return
        clean = {k: _clean(v) for k, v in record.items()}
        clean.setdefault("time", round(time.time(), 3))
        self._handle.write(json.dumps(clean) + "\n")
        self._handle.flush()
        if self._scalars is not None:
            self._scalars.write(clean)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self._scalars is not None:
            self._scalars.close()
            self._scalars = None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl (for tests, benchmarks and users' notebooks)."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
