"""metrics.jsonl's writer hands each record's scalars to every sink and ends every sink."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.monitor.metrics import MetricsLog, read_metrics
from shoal.monitor.scalars import Outcome


class Recording:
    """A sink that keeps what it was given (and may fail to close)."""

    def __init__(self, fail_close: bool = False) -> None:
        self.written: list[tuple[int, dict[str, float]]] = []
        self.closed: list[Outcome] = []
        self.fail_close = fail_close

    def write(self, step: int, scalars: dict[str, float]) -> None:
        self.written.append((step, scalars))

    def close(self, outcome: Outcome) -> None:
        self.closed.append(outcome)
        if self.fail_close:
            raise OSError("disk gone")


def test_every_sink_gets_the_records_scalars(tmp_path: Path) -> None:
    sinks = [Recording(), Recording()]
    log = MetricsLog(tmp_path / "metrics.jsonl", enabled=True, sinks=list(sinks))
    log.write({"event": "train", "step": 4, "epoch": 0, "loss": 0.5, "path": "x", "ok": True})
    log.write({"event": "eval", "step": 4, "split": "valid", "accuracy": 0.75})
    log.write({"event": "best", "path": "x"})  # no step: no scalars
    log.close("completed")
    expected = [(4, {"train/loss": 0.5}), (4, {"eval/valid/accuracy": 0.75})]
    assert [s.written for s in sinks] == [expected, expected]
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 3


def test_a_sink_that_fails_to_close_does_not_leave_the_others_open(tmp_path: Path) -> None:
    first, second = Recording(fail_close=True), Recording()
    log = MetricsLog(tmp_path / "metrics.jsonl", enabled=True, sinks=[first, second])
    with pytest.raises(OSError, match="disk gone"):
        log.close("failed")
    assert first.closed == ["failed"] and second.closed == ["failed"]
    log.close("failed")  # closing again does nothing
    assert second.closed == ["failed"]


def test_other_ranks_open_no_sink(tmp_path: Path) -> None:
    sink = Recording()
    log = MetricsLog(tmp_path / "metrics.jsonl", enabled=False, sinks=[sink])
    log.write({"event": "train", "step": 1, "loss": 1.0})
    log.close("completed")
    assert sink.written == [] and sink.closed == []
