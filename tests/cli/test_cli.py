"""The command line: schema, validate, show, train, and the run directory it leaves."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from shoal.monitor.metrics import read_metrics
from tests.conftest import REPO, run_shoal

DEMO = REPO / "examples" / "demo.toml"


def test_version_and_help(tmp_path: Path) -> None:
    done = run_shoal("--version", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("shoal ")
    done = run_shoal("train", "--help", cwd=tmp_path)
    assert done.returncode == 0 and "--resume" in done.stdout and "--set" in done.stdout


def test_schema_is_json_schema_with_help(tmp_path: Path) -> None:
    done = run_shoal("config", "schema", cwd=tmp_path)
    assert done.returncode == 0
    schema = json.loads(done.stdout)
    train = schema["$defs"]["TrainConfig"]["properties"]
    assert train["batch_size"]["description"].startswith("Global batch size")
    assert (
        schema["$defs"]["DataParallelStrategyConfig"]["properties"]["num_replicas"]["minimum"] == 1
    )


def test_validate_and_show(tmp_path: Path) -> None:
    done = run_shoal("config", "validate", str(DEMO), cwd=tmp_path)
    assert done.returncode == 0
    assert (
        done.stdout.strip()
        == f"{DEMO}: valid (task classification, strategy data_parallel, 2 workers)"
    )
    done = run_shoal("config", "show", str(DEMO), "--set", "train.epochs=3", cwd=tmp_path)
    assert done.returncode == 0
    shown = tomllib.loads(done.stdout)
    assert shown["train"]["epochs"] == 3
    assert shown["train"]["micro_batches"] == 1, "defaults are filled in"


def test_train_leaves_a_complete_run_directory(tmp_path: Path) -> None:
    args = [
        "train",
        str(DEMO),
        "--set",
        "train.max_steps=60",
        "--set",
        "monitor.log_every_steps=20",
        "--set",
        "task.data.samples=4000",
        "--set",
        f"run.dir={tmp_path / 'runs'}",
    ]
    done = run_shoal(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    run = tmp_path / "runs" / "demo"
    assert f"run directory: {run}" in done.stdout
    assert "final valid: accuracy" in done.stdout
    assert "samples/s" in done.stdout, "plain progress lines when not on a terminal"
    for name in (
        "config.toml",
        "metrics.jsonl",
        "results.json",
        "logs/rank-0.log",
        "logs/rank-1.log",
    ):
        assert (run / name).is_file(), name
    assert tomllib.loads((run / "config.toml").read_text())["strategy"]["num_replicas"] == 2
    records = read_metrics(run / "metrics.jsonl")
    train = [r for r in records if r["event"] == "train"]
    assert [r["step"] for r in train] == [20, 40, 60]
    for record in train:
        assert {"step", "epoch", "loss", "samples_per_s", "compute_s", "comm_s", "lr"} <= set(
            record
        )
        assert record["samples_per_s"] > 0 and record["comm_s"] >= 0
    results = json.loads((run / "results.json").read_text())
    assert results["world_size"] == 2 and results["strategy"] == "data_parallel"
    assert results["steps"] == 60 and results["wall_time_s"] > 0
    assert results["checkpoint"].endswith("step-00000060")
    # the same command again never reuses the directory
    again = run_shoal(*args, cwd=tmp_path)
    assert again.returncode == 0
    assert (tmp_path / "runs" / "demo-2" / "results.json").is_file()


@pytest.mark.slow  # suite budget: `train --resume` on the command line runs in test_run_lock[dp2]
def test_resume_from_the_command_line(tmp_path: Path) -> None:
    base = [
        "--set",
        "task.data.samples=2000",
        "--set",
        f"run.dir={tmp_path / 'runs'}",
        "--set",
        "train.epochs=2",
    ]
    assert run_shoal("train", str(DEMO), *base, cwd=tmp_path).returncode == 0
    done = run_shoal(
        "train",
        "--resume",
        str(tmp_path / "runs" / "demo"),
        "--set",
        "train.epochs=3",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "runs" / "demo" / "results.json").read_text())
    assert results["epochs"] == 3
