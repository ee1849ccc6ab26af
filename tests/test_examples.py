"""Every shipped example config validates and trains a few steps."""

from __future__ import annotations

from pathlib import Path

import pytest

import shoal
from shoal.config import load_config
from tests.conftest import REPO

EXAMPLES = sorted((REPO / "examples").glob("*.toml"))


def test_there_are_examples() -> None:
    names = {p.name for p in EXAMPLES}
    assert {
        "demo.toml",
        "classification-local.toml",
        "classification-csv.toml",
        "classification-custom.toml",
    } <= names


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_validates_and_runs(example: Path, tmp_path: Path) -> None:
    config = load_config(example)
    # three steps, or three rounds for a federated run (whose length is its rounds)
    length = "strategy.rounds=3" if config.strategy.type == "federated" else "train.max_steps=3"
    results = shoal.train(
        example,
        overrides=[
            length,
            f"run.dir={tmp_path}",
            "monitor.progress=off",
            "checkpoint.every_epochs=0",
        ],
    )
    assert results["status"] == "completed"
    assert results["steps"] == 3
    assert "valid" in results and 0.0 <= results["valid"]["accuracy"] <= 1.0
