"""metrics.jsonl: one JSON object per line, appended as training goes (rank 0 only)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


class MetricsLog:
    """Appends records to metrics.jsonl; each line is flushed so a crash loses at most one."""

    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self._handle = open(path, "a", encoding="utf-8") if enabled else None  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        if self._handle is None:
            return
        self._handle.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl (for tests, benchmarks and users' notebooks)."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
