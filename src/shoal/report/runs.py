"""A run directory as the report reads it: config, results (when the run ended), records.

Everything is read from the files a run writes (config.toml, results.json,
metrics.jsonl, population.svg), never from a live process, so the report of a
run still going is the report of what is on disk now: results.json is then
absent and metrics.jsonl may end in a line still being written (it is skipped).
"""

from __future__ import annotations

import json
import re
import tomllib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal.errors import ShoalError

#: per-rank fields of a record: `rank<r>_<name>` (the step loop's phases and peak memory,
#: the pipeline's compute and idle seconds)
RANK_FIELD = re.compile(r"^rank(\d+)_(.+)$")
#: the records with a unit's training figures and per-rank phases: a step of the step
#: loop, a federated round, a population generation (`training/meter.py`'s RankPhases)
UNIT_EVENTS = ("train", "round", "generation")


@dataclass
class RunData:
    """One run's files, read once."""

    root: Path
    config_text: str
    config: dict[str, Any]
    results: dict[str, Any] | None
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def status(self) -> str:
        return (
            str(self.results.get("status", "?"))
            if self.results
            else "running (no results.json yet)"
        )

    @property
    def strategy(self) -> str:
        return str(self.config.get("strategy", {}).get("type", "?"))

    @property
    def start_time(self) -> float | None:
        """The time of the first record (the wall-time axis starts there)."""
        times = [r["time"] for rs in self.events.values() for r in rs[:1] if "time" in r]
        return min(times) if times else None

    def records(self, *events: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for event in events:
            out.extend(self.events.get(event, []))
        return out

    def unit_records(self) -> list[dict[str, Any]]:
        """The records of the run's units (steps, rounds or generations)."""
        return self.records(*UNIT_EVENTS)

    def per_rank(self, name: str) -> list[float]:
        """`rank<r>_<name>` of the newest unit record that has it, by rank."""
        for record in reversed(self.unit_records()):
            found = {
                int(m.group(1)): float(v)
                for k, v in record.items()
                if (m := RANK_FIELD.match(k)) and m.group(2) == name and v is not None
            }
            if found:
                return [found.get(r, 0.0) for r in range(max(found) + 1)]
        return []


def load_run(root: Path) -> RunData:
    """Read a run directory; a user's mistake (not a run directory) is a one-line error."""
    metrics = root / "metrics.jsonl"
    if not root.is_dir():
        raise ShoalError(f"shoal report: {root}: no such directory (give a run directory)")
    if not metrics.is_file():
        raise ShoalError(
            f"shoal report: {root}: no metrics.jsonl, not a shoal run directory "
            "(give runs/NAME, the folder a run writes)"
        )
    config_text = _read_text(root / "config.toml")
    try:
        config = tomllib.loads(config_text) if config_text else {}
    except (tomllib.TOMLDecodeError, RecursionError):
        config = {}
    results = None
    results_text = _read_text(root / "results.json")
    if results_text:
        try:
            results = json.loads(results_text)
        except (ValueError, RecursionError):
            results = None  # being replaced (it is written atomically, so only if damaged)
    run = RunData(root, config_text, config, results if isinstance(results, dict) else None)
    run.events = read_events(metrics)
    return run


def read_events(path: Path) -> dict[str, list[dict[str, Any]]]:
    """metrics.jsonl grouped by `event`, in file order. A line that does not parse (the
    one a running job is writing) is skipped."""
    events: dict[str, list[dict[str, Any]]] = defaultdict(list)
    decode = json.JSONDecoder().decode
    # a byte that is not UTF-8 makes its line unparsable (it has a U+FFFD in it, or its
    # JSON still parses with one in a string), never the whole file unreadable
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    record = decode(line)
                except (ValueError, RecursionError):
                    continue
                if isinstance(record, dict):
                    events[str(record.get("event", "?"))].append(record)
    except OSError as exc:
        raise ShoalError(f"shoal report: {path}: cannot read: {exc.strerror}") from None
    return dict(events)


def _read_text(path: Path) -> str:
    """The file's text ("" when it is missing or unreadable); bytes that are not UTF-8
    are shown as U+FFFD, and the text is then not parsed (see `load_run`)."""
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return ""
