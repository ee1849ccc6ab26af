"""Red team: resumes that ask for the wrong thing must fail without touching the run.

The invariant: after ANY failed resume, config.toml, checkpoints/, best/ and
results.json are byte-identical to before. Changes are checked against what the
checkpoint holds: safe ones pass, those that change the problem need
--allow-changes (and are then applied, logged and recorded), incompatible ones
are always refused with one line naming the field, the checkpoint's value and
the one asked for.
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shoal
from shoal.checkpoint.changes import CHANGES_PROBLEM, INCOMPATIBLE, SAFE, classify, resume_rules
from shoal.checkpoint.manager import list_checkpoints
from shoal.config import load_config
from shoal.errors import ConfigError, ShoalError
from shoal.launch.plan import plan_job
from shoal.monitor.metrics import read_metrics
from tests.conftest import data_parallel, final_state, run_shoal, small_job
from tests.hostile.tamper import flip_bytes, snapshot


def _rules(config: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(safe, incompatible) patterns of `config`, as its fields' marks give them."""
    rules = resume_rules(config)
    return rules.safe, rules.incompatible


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished local run, only ever planned against (never resumed) by the tests using it."""
    runs = tmp_path_factory.mktemp("finished")
    return Path(shoal.train(small_job(runs, run={"name": "done"}))["run_dir"])


def test_the_issue_case_on_the_command_line(runs: Path, tmp_path: Path) -> None:
    """`--set task.model.hidden=[64,64]` used to be written into config.toml before it failed,
    and every later plain --resume failed too."""
    run = Path(shoal.train(small_job(runs))["run_dir"])
    before = snapshot(run)
    done = run_shoal(
        "train", "--resume", str(run), "--set", "task.model.hidden=[64,64]", cwd=tmp_path
    )
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("task.model.hidden: cannot change when resuming from ")
    assert "the checkpoint holds [16, 16], asked [64, 64]" in line
    assert snapshot(run) == before
    again = run_shoal("train", "--resume", str(run), "--set", "train.epochs=3", cwd=tmp_path)
    assert again.returncode == 0, again.stderr


#: override -> its class: "safe" passes, "allow" needs --allow-changes, "never" is refused
OVERRIDES = {
    "train.epochs=3": "safe",
    "train.max_steps=30": "safe",
    "checkpoint.keep_last=5": "safe",
    "monitor.log_every_steps=3": "safe",
    "faults.timeout_s=100.0": "safe",
    "run.threads_per_worker=1": "safe",
    "train.optimizer.lr=0.05": "allow",
    "train.optimizer={kind='adam', lr=0.01}": "allow",
    "train.seed=4": "allow",
    "train.batch_size=20": "allow",
    "task.data.samples=600": "allow",
    "task.model.dropout=0.1": "allow",
    "task.model.activation=gelu": "allow",
    "task.model.hidden=[64,64]": "never",
    "task.data.features=12": "never",
    "task.data.classes=4": "never",
    # local and data_parallel keep one learner's parts by parameter name (issue 12: a
    # checkpoint resumes under another strategy of that family; the change is logged)
    "strategy={type='data_parallel', num_replicas=2}": "safe",
}


@pytest.mark.parametrize("override", list(OVERRIDES))
def test_each_change_is_classified_before_anything_runs(finished: Path, override: str) -> None:
    before = snapshot(finished)
    kind = OVERRIDES[override]
    field = override.partition("=")[0]
    if kind == "safe":
        plan_job(None, [override], resume=finished)
    else:
        with pytest.raises(ConfigError, match=rf"^{field}(\.\w+)?: ") as refused:
            plan_job(None, [override], resume=finished)
        assert "the checkpoint holds" in str(refused.value)
        assert len(refused.value.lines) == 1
    if kind == "never":
        with pytest.raises(ConfigError, match="cannot change when resuming"):
            plan_job(None, [override], resume=finished, allow_changes=True)
    else:
        plan_job(None, [override], resume=finished, allow_changes=True)
    assert snapshot(finished) == before


def test_a_field_no_rule_names_changes_the_problem(finished: Path) -> None:
    """The safe fields are an allow-list: a new field is refused until someone classifies it."""
    config = load_config(finished / "config.toml")
    safe, incompatible = _rules(config)
    assert classify("train.some_field_added_later", safe, incompatible) == CHANGES_PROBLEM
    assert classify("task.model.new_knob", safe, incompatible) == CHANGES_PROBLEM
    assert classify("checkpoint.new_setting", safe, incompatible) == SAFE


@pytest.mark.parametrize(
    ("strategy", "field", "kind"),
    [
        (
            {"type": "parameter_server", "optimizer": {"kind": "sgd"}},
            "strategy.optimizer.kind",
            INCOMPATIBLE,
        ),
        ({"type": "parameter_server"}, "strategy.optimizer.lr", CHANGES_PROBLEM),
        ({"type": "parameter_server"}, "strategy.num_servers", SAFE),
        ({"type": "parameter_server"}, "strategy.num_workers", SAFE),
        ({"type": "parameter_server"}, "strategy.mode", CHANGES_PROBLEM),
        ({"type": "local"}, "task.data.train", INCOMPATIBLE),
        ({"type": "local"}, "task.dim", INCOMPATIBLE),
        ({"type": "local"}, "task.data.valid", CHANGES_PROBLEM),
        ({"type": "local"}, "task.evaluation.batch_size", SAFE),
    ],
)
def test_kge_and_parameter_server_rules(strategy: dict[str, Any], field: str, kind: str) -> None:
    config = load_config(
        {
            "task": {"type": "kge", "data": {"name": "nations"}, "model": "transe"},
            "strategy": strategy,
            "train": {"epochs": 1, "batch_size": 8},
        }
    )
    assert classify(field, *_rules(config)) == kind


def test_an_allowed_change_is_applied_logged_and_recorded(runs: Path) -> None:
    run = Path(shoal.train(small_job(runs))["run_dir"])
    shoal.train(
        resume=run, overrides=["train.optimizer.lr=0.05", "train.epochs=3"], allow_changes=True
    )
    (record,) = [r for r in read_metrics(run / "metrics.jsonl") if r["event"] == "config_change"]
    assert record["step"] == 26
    assert {c["field"]: c["class"] for c in record["changes"]} == {
        "train.optimizer.lr": CHANGES_PROBLEM,
        "train.epochs": SAFE,
    }
    assert "lr = 0.05" in (run / "config.toml").read_text()
    # torch's load_state_dict would have brought back the saved learning rate silently
    optimizer = final_state(json.loads((run / "results.json").read_text()))["optimizer"]
    assert optimizer["param_groups"][0]["lr"] == pytest.approx(0.05)
    log = (run / "logs" / "rank-0.log").read_text()
    assert "resuming with a change of train.optimizer.lr" in log


@pytest.mark.parametrize("strategy", [{"type": "local"}, data_parallel(2)], ids=["local", "dp2"])
def test_a_resume_that_fails_in_the_workers_changes_nothing(runs: Path, strategy: dict) -> None:
    """The change passes the plan (it is allowed) but the checkpoint is corrupt: the workers
    fail on it, and config.toml still holds the run's old config."""
    run = Path(shoal.train(small_job(runs, strategy=strategy))["run_dir"])
    flip_bytes(list_checkpoints(run / "checkpoints")[-1] / "state.pt")
    before = snapshot(run)
    with pytest.raises(ShoalError, match="checkpoint is corrupt"):
        shoal.train(resume=run, overrides=["train.optimizer.lr=0.05"], allow_changes=True)
    assert snapshot(run) == before
    assert not (run / ".config.attempt.toml").exists()


def _write_csv(path: Path, rows: int, features: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, features))
    y = (x[:, 0] > 0).astype(int)
    header = ",".join([f"f{i}" for i in range(features)] + ["label"])
    lines = [
        ",".join(f"{v:.5f}" for v in row) + f",{label}" for row, label in zip(x, y, strict=True)
    ]
    path.write_text(header + "\n" + "\n".join(lines) + "\n")


def test_a_data_file_changed_behind_its_path(runs: Path, tmp_path: Path) -> None:
    """Same path, other content: a change of the field that names the file. With other
    features the model no longer fits: one line naming the parameter and the likely field."""
    data = tmp_path / "data.csv"
    _write_csv(data, 200, 4)
    task = {"type": "classification", "data": {"source": "file", "path": str(data)}}
    first = shoal.train(small_job(runs, task=task))
    run = Path(first["run_dir"])
    before = snapshot(run)
    _write_csv(data, 260, 4)
    with pytest.raises(ConfigError, match=r"^task\.data\.path: .*a file of \d+ bytes"):
        shoal.train(resume=run)
    _write_csv(data, 200, 6)
    with pytest.raises(ShoalError) as refused:
        shoal.train(resume=run, overrides=["train.epochs=3"], allow_changes=True)
    (line,) = refused.value.lines
    assert "the checkpoint does not fit the model: " in line
    assert ".weight is (16, 4) in the checkpoint, (16, 6) in the model" in line
    assert "likely cause: task.data.path" in line
    assert snapshot(run) == before
    _write_csv(data, 260, 4)
    resumed = shoal.train(resume=run, overrides=["train.epochs=3"], allow_changes=True)
    assert resumed["steps"] == first["steps"] + math.ceil(208 / 31)  # 260 samples, 20% held out


FACTORY = """
import json
import pathlib

import torch


def make():
    n = json.loads((pathlib.Path(__file__).parent / "size.json").read_text())["n"]
    x = torch.randn(n, 6, generator=torch.Generator().manual_seed(0))
    return {"train": (x, (x[:, 0] > 0).long()), "valid": (x[:20], (x[:20, 0] > 0).long())}
"""


def test_the_training_size_is_checked_by_the_workers(runs: Path, tmp_path: Path) -> None:
    """Data from a user's factory: the config cannot tell it changed, the training size can."""
    (tmp_path / "hostile_size_factory.py").write_text(textwrap.dedent(FACTORY))
    (tmp_path / "size.json").write_text('{"n": 200}')
    factory = {"source": "python", "factory": "hostile_size_factory:make"}
    task = {"type": "classification", "data": {**factory, "import_dir": str(tmp_path)}}
    first = shoal.train(small_job(runs, task=task))
    run = Path(first["run_dir"])
    before = snapshot(run)
    (tmp_path / "size.json").write_text('{"n": 240}')
    with pytest.raises(ConfigError) as refused:
        shoal.train(resume=run)
    (line,) = refused.value.lines
    assert line.startswith("task.data: resuming from ")
    assert "the checkpoint holds 200 training samples, asked 240 training samples" in line
    assert snapshot(run) == before
    resumed = shoal.train(resume=run, overrides=["train.epochs=3"], allow_changes=True)
    assert resumed["steps"] == first["steps"] + math.ceil(240 / 31)
