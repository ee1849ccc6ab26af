"""A small text and a tiny language-model job, for the lm tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shoal.monitor.metrics import read_metrics
from tests.conftest import small_job

# a few hundred characters that repeat, so a tiny model learns them within a few dozen steps
VERSE = (
    "To be, or not to be, that is the question:\n"
    "Whether 'tis nobler in the mind to suffer\n"
    "The slings and arrows of outrageous fortune,\n"
    "Or to take arms against a sea of troubles\n"
)


def write_text(folder: Path, repeats: int = 12, name: str = "text.txt") -> Path:
    path = folder / name
    path.write_text(VERSE * repeats, encoding="utf-8")
    return path


def lm_job(runs: Path, text: Path, **sections: Any) -> dict[str, Any]:
    """A tiny transformer on `text`: a few seconds of training."""
    task: dict[str, Any] = {
        "type": "lm",
        "data": {"train": str(text), "split": 0.8},
        "model": {"dim": 32, "heads": 4, "layers": 2, "context": 16},
    }
    task.update(sections.pop("task", {}))
    train = {
        "max_steps": 6,
        "batch_size": 8,
        "seed": 5,
        "optimizer": {"kind": "adamw", "lr": 3e-3, "weight_decay": 0.1},
        "grad_clip_norm": 0.5,
    }
    train.update(sections.pop("train", {}))
    return small_job(runs, task=task, train=train, **sections)


def assert_same_norms(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Both runs logged the same global gradient norms (before clipping, at every logged
    step): the sharded layouts fold each rank's share of it into the step's agreement."""

    def norms(results: dict[str, Any]) -> list[float]:
        records = read_metrics(Path(results["run_dir"]) / "metrics.jsonl")
        return [r["grad_norm"] for r in records if r["event"] == "train"]

    expected = norms(a)
    assert expected and all(n > 0.5 for n in expected), "clipping at 0.5 must bite"
    assert norms(b) == pytest.approx(expected, rel=1e-5)
