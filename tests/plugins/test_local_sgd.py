"""The example strategy plugin (examples/plugins/shoal-local-sgd), trained through the CLI alone.

Local SGD with k = 1 and plain SGD is data-parallel SGD step for step (the mean of
the replicas' updates is the update of the summed gradient): the loss of every
step matches data_parallel's. With k > 1 the trajectory differs, and right after
each averaging the two replicas hold the same model (spread 0), while just before
it they had drifted apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tomli_w

from shoal.monitor.metrics import read_metrics
from tests.conftest import run_shoal, small_job
from tests.plugins.helpers import LOCAL_SGD, pythonpath, register

STEPS = 12


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    register(
        site,
        "shoal-local-sgd",
        {"shoal.strategies": {"local_sgd": "shoal_local_sgd.config:LocalSGDConfig"}},
    )
    return pythonpath(site, LOCAL_SGD)


def _train(tmp_path: Path, env: dict[str, str], name: str, strategy: dict[str, Any]) -> list:
    config = small_job(
        tmp_path / "runs",
        strategy=strategy,
        train={"max_steps": STEPS, "optimizer": {"kind": "sgd", "lr": 0.2}},
        monitor={"progress": "off", "log_every_steps": 1},
        checkpoint={"every_epochs": 0, "keep_best": False},
        run={"dir": str(tmp_path / "runs"), "name": name},
    )
    (tmp_path / f"{name}.toml").write_text(tomli_w.dumps(config))
    done = run_shoal("train", f"{name}.toml", cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    records = read_metrics(tmp_path / "runs" / name / "metrics.jsonl")
    return [r for r in records if r.get("event") == "train"]


@pytest.mark.slow  # three CLI runs (18 s); the plugin's loading is in make test (dotted path)
def test_local_sgd_with_k1_is_data_parallel_and_k3_averages(
    tmp_path: Path, env: dict[str, str]
) -> None:
    dp = _train(tmp_path, env, "dp", {"type": "data_parallel", "num_replicas": 2})
    k1 = _train(tmp_path, env, "k1", {"type": "local_sgd", "num_replicas": 2, "average_every": 1})
    k3 = _train(tmp_path, env, "k3", {"type": "local_sgd", "num_replicas": 2, "average_every": 3})
    assert [r["step"] for r in k1] == [r["step"] for r in dp] == list(range(1, STEPS + 1))
    for ours, theirs in zip(k1, dp, strict=True):
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5, abs=1e-6)
    assert k1[-1]["averagings"] == STEPS - 1
    differences = [abs(a["loss"] - b["loss"]) for a, b in zip(k3, dp, strict=True)]
    assert max(differences) > 1e-4, "k = 3 must train differently from data_parallel"
    averaged = [r for r in k3 if r["averagings"] > 0]
    assert k3[-1]["averagings"] == (STEPS - 1) // 3
    for record in averaged:
        assert record["replica_spread_after"] == 0.0
        assert record["replica_spread_before"] > 0.0


def test_local_sgd_as_a_dotted_path(tmp_path: Path) -> None:
    """`type = "custom"` needs no entry point: the module on PYTHONPATH is enough."""
    env = pythonpath(LOCAL_SGD)
    strategy = {
        "type": "custom",
        "class": "shoal_local_sgd.strategy:LocalSGDStrategy",
        "config": {"num_replicas": 2, "average_every": 2},
    }
    records = _train(tmp_path, env, "custom", strategy)
    assert records[-1]["averagings"] == (STEPS - 1) // 2
    assert records[-1]["replica_spread_after"] == 0.0
