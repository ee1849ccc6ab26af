"""The example task plugin (examples/plugins/shoal-regression), trained through the CLI alone.

The CSV file holds a planted target, y = 3 x0 - 2 x1 + sin(2 x2) + 0.5 x0 x3 plus
noise of variance 0.01: a model that learned it reaches a validation MSE close
to the noise, far below the target's variance (about 14).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch

from tests.conftest import run_shoal
from tests.plugins.helpers import REGRESSION, pythonpath, register

NOISE = 0.1


def _csv(path: Path, rows: int = 1500) -> float:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 4, generator=g)
    y = 3 * x[:, 0] - 2 * x[:, 1] + torch.sin(2 * x[:, 2]) + 0.5 * x[:, 0] * x[:, 3]
    y = y + NOISE * torch.randn(rows, generator=g)
    lines = ["a,b,c,d,y"] + [
        ",".join(f"{v:.6f}" for v in [*xs, t]) for xs, t in zip(x.tolist(), y.tolist(), strict=True)
    ]
    path.write_text("\n".join(lines) + "\n")
    return float(y.var())


JOB = """
[task]
type = "regression"
path = "data.csv"
hidden = [64, 64]

[train]
epochs = 40
batch_size = 64
optimizer = {{ kind = "adam", lr = 0.003 }}
eval_every_epochs = 10

[checkpoint]
every_epochs = 0

[run]
dir = "runs"
name = "{name}"

[monitor]
progress = "off"
log_every_steps = 100
"""


def test_regression_plugin_learns_a_planted_target(tmp_path: Path) -> None:
    variance = _csv(tmp_path / "data.csv")
    site = tmp_path / "site"
    register(
        site,
        "shoal-regression",
        {"shoal.tasks": {"regression": "shoal_regression.config:RegressionConfig"}},
    )
    (tmp_path / "job.toml").write_text(JOB.format(name="reg"))
    done = run_shoal(
        "train", "job.toml", cwd=tmp_path, env=pythonpath(site, REGRESSION), timeout=300
    )
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "runs" / "reg" / "results.json").read_text())
    mse = results["valid"]["mse"]
    assert mse < 0.1, f"validation MSE {mse} (target variance {variance:.1f})"
    assert results["valid"]["r2"] > 0.99
    assert math.isclose(results["valid"]["rmse"], mse**0.5)


def test_regression_bad_data_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("a,b,y\n1,2,3\n4,x,6\n7,8,9\n")
    (tmp_path / "job.toml").write_text(JOB.format(name="bad"))
    site = tmp_path / "site"
    register(
        site,
        "shoal-regression",
        {"shoal.tasks": {"regression": "shoal_regression.config:RegressionConfig"}},
    )
    done = run_shoal("train", "job.toml", cwd=tmp_path, env=pythonpath(site, REGRESSION))
    assert done.returncode == 2
    assert (
        done.stderr.strip().splitlines()[-1].endswith("data.csv:3: column b: 'x' is not a number")
    )


def test_a_task_class_beside_the_config_imports_without_pythonpath(tmp_path: Path) -> None:
    """`[task] type = "custom"` names a class whose package lies beside the config: it is
    imported from the config's folder, as a factory is, by the launcher and by every worker
    (run from another directory, the project's folder on no PYTHONPATH)."""
    project = tmp_path / "project"
    shutil.copytree(REGRESSION / "shoal_regression", project / "shoal_regression")
    _csv(project / "data.csv", rows=300)
    job = JOB.format(name="custom").replace(
        '[task]\ntype = "regression"\npath = "data.csv"\nhidden = [64, 64]\n',
        '[task]\ntype = "custom"\nclass = "shoal_regression.task:RegressionTask"\n'
        '[task.config]\ntype = "regression"\npath = "data.csv"\nhidden = [16]\n'
        '[strategy]\ntype = "data_parallel"\nnum_replicas = 2\n',
    )
    (project / "job.toml").write_text(job.replace("epochs = 40", "epochs = 2"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run_shoal("train", str(project / "job.toml"), cwd=elsewhere, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (elsewhere / "runs" / "custom" / "results.json").is_file()
