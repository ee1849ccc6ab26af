"""Model selection in the shared trainer: best checkpoint, early stopping (any task)."""

from __future__ import annotations

import json
from pathlib import Path

import shoal
from shoal.checkpoint.manager import list_checkpoints
from tests.conftest import small_job

TRAIN = {"epochs": 6, "optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9}}


def _evals(results: dict) -> list[dict]:
    lines = (Path(results["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == "eval" and r["split"] == "valid"]


def test_the_best_validation_is_kept_in_best(runs: Path) -> None:
    results = shoal.train(small_job(runs, train=TRAIN))
    evals = _evals(results)
    best = max(evals, key=lambda r: r["accuracy"])  # max() keeps the first of equal values
    assert results["best"]["metric"] == "accuracy"
    assert results["best"]["value"] == best["accuracy"]
    assert results["best"]["step"] == best["step"]
    kept = list_checkpoints(Path(results["run_dir"]) / "best")
    assert [p.name for p in kept] == [f"step-{best['step']:08d}"]
    assert results["stopped_early"] is False and results["epochs"] == 6


def test_early_stopping_after_patience_evaluations(runs: Path) -> None:
    """min_delta 1.0: no accuracy can improve by that much, so every evaluation after the
    first counts towards patience and training stops after 1 + 2 evaluations."""
    train = {**TRAIN, "early_stopping_patience": 2, "early_stopping_min_delta": 1.0}
    results = shoal.train(small_job(runs, train=train))
    assert results["stopped_early"] is True
    assert results["epochs"] == 3 and len(_evals(results)) == 3
    assert results["best"]["step"] == _evals(results)[0]["step"]


def test_keep_best_off_writes_no_best_folder(runs: Path) -> None:
    results = shoal.train(small_job(runs, train=TRAIN, checkpoint={"keep_best": False}))
    assert not (Path(results["run_dir"]) / "best").exists()
    assert results["best"]["checkpoint"] is None
