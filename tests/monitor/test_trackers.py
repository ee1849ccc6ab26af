"""`[monitor] wandb` and `[monitor] mlflow`: a real job logs to each library, read back with
the library's own reader (W&B: `wandb leet inspect` of the offline run's .wandb file;
MLflow: `MlflowClient` on a file store) and compared with TensorBoard's event files and
metrics.jsonl. W&B never goes online here: mode offline, and WANDB_MODE=offline besides."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shoal
from shoal.monitor.metrics import read_metrics
from tests.conftest import data_parallel, run_shoal, small_job
from tests.hostile.jobs import finish, slow_data_parallel, start, wait_for_step, write_job

HAS_WANDB = importlib.util.find_spec("wandb") is not None
HAS_MLFLOW = importlib.util.find_spec("mlflow") is not None
needs_wandb = pytest.mark.skipif(not HAS_WANDB, reason="wandb is not installed (shoal[wandb])")
needs_mlflow = pytest.mark.skipif(not HAS_MLFLOW, reason="mlflow is not installed (shoal[mlflow])")
EXPERIMENT = "shoal-test"


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """W&B offline, its own folders in a temporary directory (not the user's home); MLflow's
    file store allowed for the test's own reader."""
    home = tmp_path_factory.mktemp("trackers-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_SILENT", "true")
        for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
            patch.setenv(name, str(home / name.lower()))
        patch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        yield home


def trackers(store: Path) -> dict[str, Any]:
    """`[monitor]` with every tracker installed here, and TensorBoard to compare with."""
    monitor: dict[str, Any] = {"progress": "off", "log_every_steps": 2, "tensorboard": True}
    if HAS_WANDB:
        monitor["wandb"] = {"project": EXPERIMENT, "mode": "offline", "tags": ["test"]}
    if HAS_MLFLOW:
        monitor["mlflow"] = {"tracking_uri": store.as_uri(), "experiment": EXPERIMENT}
    return monitor


@pytest.fixture(scope="module")
def finished(offline: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 2-worker data-parallel job with evaluation every epoch: its run directory and the
    MLflow store."""
    if not (HAS_WANDB or HAS_MLFLOW):
        pytest.skip("neither wandb nor mlflow is installed (shoal[wandb], shoal[mlflow])")
    runs = tmp_path_factory.mktemp("runs")
    store = runs / "mlruns"
    job = small_job(
        runs, strategy=data_parallel(2), monitor=trackers(store), run={"name": "tracked"}
    )
    job["run"]["dir"] = str(runs)
    results = shoal.train(job)
    return Path(results["run_dir"]), store


# ------------------------------------------------------------------ readers
Scalar = tuple[str, int, float]


def tensorboard_scalars(run_dir: Path) -> list[Scalar]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return sorted(
        (tag, e.step, e.value) for tag in events.Tags()["scalars"] for e in events.Scalars(tag)
    )


def wandb_records(run_dir: Path) -> list[dict[str, Any]]:
    """The records of the run's one offline W&B run, as W&B's own reader prints them."""
    folders = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(folders) == 1, f"one W&B run per session, from rank 0 only: {folders}"
    shown = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(folders[0])],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [json.loads(line) for line in shown.stdout.splitlines() if line.strip()]


def wandb_scalars(records: list[dict[str, Any]]) -> list[Scalar]:
    rows = [r["history"]["item"] for r in records if r["type"] == "history"]
    return sorted(
        (key, row["step"], value)
        for row in rows
        for key, value in row.items()
        if not key.startswith("_") and key != "step"
    )


def wandb_exit_code(records: list[dict[str, Any]]) -> int:
    exits = [r["exit"].get("exit_code", 0) for r in records if r["type"] == "exit"]
    assert len(exits) == 1, "the W&B run was finished once"
    return int(exits[0])


def mlflow_run(store: Path) -> Any:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store.as_uri())
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None
    found = client.search_runs([experiment.experiment_id])
    assert len(found) == 1, "one MLflow run per session, from rank 0 only"
    return client, found[0]


def assert_same(got: list[Scalar], expected: list[Scalar]) -> None:
    """Same tags at the same steps; the values as close as TensorBoard's float32 keeps them."""
    assert [s[:2] for s in got] == [s[:2] for s in expected]
    for (tag, step, value), (_, _, wanted) in zip(got, expected, strict=True):
        assert value == pytest.approx(wanted, rel=1e-6), (tag, step)


def logged(run_dir: Path, event: str, field: str, split: str | None = None) -> dict[int, float]:
    return {
        r["step"]: r[field]
        for r in read_metrics(run_dir / "metrics.jsonl")
        if r["event"] == event and r.get("split") == split
    }


def config_leaves(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    leaves: dict[str, str] = {}
    for name, value in config.items():
        if isinstance(value, dict) and value:
            leaves.update(config_leaves(value, f"{prefix}{name}."))
        else:
            leaves[f"{prefix}{name}"] = value if isinstance(value, str) else json.dumps(value)
    return leaves


# ------------------------------------------------------------------ W&B
@needs_wandb
def test_wandb_run_holds_tensorboards_scalars_and_the_config(finished: tuple[Path, Path]) -> None:
    run_dir, _ = finished
    records = wandb_records(run_dir)
    scalars = wandb_scalars(records)
    assert_same(scalars, tensorboard_scalars(run_dir))
    by_tag: dict[str, dict[int, float]] = {}
    for tag, step, value in scalars:
        by_tag.setdefault(tag, {})[step] = value
    assert by_tag["train/loss"] == logged(run_dir, "train", "loss")
    assert by_tag["eval/valid/accuracy"] == logged(run_dir, "eval", "accuracy", "valid")
    config: dict[str, Any] = {}
    for record in records:
        if record["type"] == "run":
            config.update(record["run"]["config"]["update"])
        elif record["type"] == "config":
            config.update(record["config"]["update"])
    config.pop("_wandb", None)
    assert config == tomllib.loads((run_dir / "config.toml").read_text())
    run = next(r["run"] for r in records if r["type"] == "run")
    assert run["project"] == EXPERIMENT and run["tags"] == ["test"]
    assert run.get("display_name", run_dir.name) == run_dir.name
    assert wandb_exit_code(records) == 0


# ------------------------------------------------------------------ MLflow
@needs_mlflow
def test_mlflow_run_holds_tensorboards_scalars_and_the_config(
    finished: tuple[Path, Path], tmp_path: Path
) -> None:
    run_dir, store = finished
    client, run = mlflow_run(store)
    expected = tensorboard_scalars(run_dir)
    tags = sorted({tag for tag, _, _ in expected})
    assert sorted(run.data.metrics) == tags
    scalars = sorted(
        (tag, m.step, m.value)
        for tag in tags
        for m in client.get_metric_history(run.info.run_id, tag)
    )
    assert_same(scalars, expected)
    loss = {step: value for tag, step, value in scalars if tag == "train/loss"}
    assert loss == logged(run_dir, "train", "loss")
    config_text = (run_dir / "config.toml").read_text()
    assert run.data.params == config_leaves(tomllib.loads(config_text))
    assert run.data.params["strategy.num_replicas"] == "2"
    saved = client.download_artifacts(run.info.run_id, "config.toml", str(tmp_path))
    assert Path(saved).read_text() == config_text
    assert run.info.run_name == run_dir.name and run.data.tags["shoal.run_dir"] == str(run_dir)
    assert run.info.status == "FINISHED"


# ------------------------------------------------------------------ how a session ends
@pytest.mark.skipif(not (HAS_WANDB or HAS_MLFLOW), reason="neither wandb nor mlflow is installed")
def test_a_failed_run_ends_its_tracker_runs_as_failed(offline: Path, tmp_path: Path) -> None:
    store = tmp_path / "mlruns"
    job = small_job(
        tmp_path / "runs",
        monitor=trackers(store),
        run={"dir": str(tmp_path / "runs"), "name": "failing"},
        faults={"inject": {"rank": 0, "step": 5, "kind": "raise"}},
    )
    with pytest.raises(Exception, match=r"injected fault at step 5|failed at step 5"):
        shoal.train(job)  # one process, in this one: the fault itself comes out
    run_dir = tmp_path / "runs" / "failing"
    if HAS_WANDB:
        assert wandb_exit_code(wandb_records(run_dir)) == 1
    if HAS_MLFLOW:
        assert mlflow_run(store)[1].info.status == "FAILED"


@pytest.mark.skipif(not (HAS_WANDB or HAS_MLFLOW), reason="neither wandb nor mlflow is installed")
def test_sigterm_stops_the_run_and_ends_its_tracker_runs_as_killed(
    offline: Path, tmp_path: Path
) -> None:
    store = tmp_path / "mlruns"
    sections = slow_data_parallel(workers=2)
    sections["monitor"] = {**trackers(store), "log_every_steps": 1}
    job = write_job(tmp_path, **sections)
    run_dir = tmp_path / "runs" / "job"
    launcher = start("train", str(job), cwd=tmp_path)
    wait_for_step(run_dir, 2)
    launcher.send_signal(signal.SIGTERM)
    code, _, err = finish(launcher, timeout=60)
    assert code == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    stopped = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["event"] == "stopped"]
    assert len(stopped) == 1
    if HAS_WANDB:
        records = wandb_records(run_dir)
        assert wandb_exit_code(records) == 128 + signal.SIGTERM
        loss = {step: value for tag, step, value in wandb_scalars(records) if tag == "train/loss"}
        assert loss == logged(run_dir, "train", "loss")  # every line up to the stop
    if HAS_MLFLOW:
        assert mlflow_run(store)[1].info.status == "KILLED"


# ------------------------------------------------------------------ the config
@pytest.mark.parametrize(
    ("tracker", "table"),
    [("wandb", {"project": "p", "mode": "offline"}), ("mlflow", {"tracking_uri": "file:mlruns"})],
)
def test_a_missing_library_is_one_line_naming_the_extra(
    tmp_path: Path, tracker: str, table: dict[str, str]
) -> None:
    """The library made impossible to import (None in sys.modules, as for a package that is
    not installed): `shoal config validate` says which extra to install, exit code 2."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(f"import sys\nsys.modules[{tracker!r}] = None\n")
    job = write_job(tmp_path, monitor={"progress": "off", tracker: table})
    done = run_shoal("config", "validate", str(job), cwd=tmp_path, env={"PYTHONPATH": str(hide)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr
    assert f"monitor.{tracker}" in done.stderr
    assert f"pip install 'shoal[{tracker}]'" in done.stderr


@needs_mlflow
def test_a_relative_file_store_is_next_to_the_config(tmp_path: Path) -> None:
    from shoal.config import load_config

    job = write_job(
        tmp_path, monitor={"progress": "off", "mlflow": {"tracking_uri": "file:mlruns"}}
    )
    config = load_config(job)
    assert config.monitor.mlflow is not None
    assert config.monitor.mlflow.tracking_uri == (tmp_path / "mlruns").resolve().as_uri()
