"""The classification workload: synthetic data, CSV/NPZ files, user factories, malformed input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import shoal
from shoal.cli.main import main
from shoal.errors import DataError, ShoalError
from shoal.tasks.classification.config import FileDataConfig, SyntheticDataConfig
from shoal.tasks.classification.data import load_files, make_synthetic
from tests.conftest import small_job


def test_synthetic_data_is_deterministic_and_balanced() -> None:
    config = SyntheticDataConfig(
        samples=1200, features=12, informative=6, classes=4, seed=3, noise=0.0
    )
    a, b = make_synthetic(config), make_synthetic(config)
    assert torch.equal(a.train.features, b.train.features)
    assert torch.equal(a.valid.labels, b.valid.labels)
    other = make_synthetic(config.model_copy(update={"seed": 4}))
    assert not torch.equal(a.train.features, other.train.features)
    assert len(a.train) + len(a.valid) == 1200 and len(a.valid) == 240
    counts = torch.bincount(torch.cat([a.train.labels, a.valid.labels]), minlength=4)
    assert counts.tolist() == [300, 300, 300, 300]
    assert a.train.features.shape[1] == 12 and a.train.features.dtype == torch.float32


def test_label_noise_flips_the_requested_share() -> None:
    clean = make_synthetic(SyntheticDataConfig(samples=4000, noise=0.0, seed=1))
    noisy = make_synthetic(SyntheticDataConfig(samples=4000, noise=0.2, seed=1))
    changed = (clean.train.labels != noisy.train.labels).float().mean().item()
    assert 0.1 < changed < 0.2  # 20% redrawn, a quarter of them land on the same class


def test_an_mlp_beats_a_linear_model_by_far(runs: Path) -> None:
    """The synthetic problem is not linearly separable: accuracy tells models apart."""
    task = {
        "type": "classification",
        "data": {
            "samples": 6000,
            "features": 32,
            "informative": 8,
            "classes": 6,
            "clusters_per_class": 3,
            "noise": 0.0,
            "seed": 2,
        },
    }
    train = {"epochs": 6, "batch_size": 64, "optimizer": {"kind": "adam", "lr": 3e-3}}
    linear = shoal.train(small_job(runs, task={**task, "model": {"hidden": []}}, train=train))
    mlp = shoal.train(small_job(runs, task={**task, "model": {"hidden": [128, 128]}}, train=train))
    assert mlp["valid"]["accuracy"] > linear["valid"]["accuracy"] + 0.15
    assert mlp["valid"]["accuracy"] > 0.6


def _csv(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "data.csv"
    path.write_text(text)
    return path


def test_csv_with_named_labels_and_a_label_column(tmp_path: Path) -> None:
    path = _csv(tmp_path, "kind,x1,x2\ncat,1,2\ndog,3,4\n\ncat,5,6\nbird,7,8\n")
    data = load_files(FileDataConfig(path=str(path), label_column="kind", valid_fraction=0.25))
    labels = torch.cat([data.train.labels, data.valid.labels]).sort().values.tolist()
    assert labels == [0, 1, 1, 2]  # bird, cat, cat, dog in sorted name order
    assert data.train.features.shape[1] == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,b,label\n1,2,0\n1,2\n", "data.csv:3: expected 3 columns, got 2"),
        ("a,b,label\n1,2,0\n1,oops,1\n", "data.csv:3: column 'b': not a number: 'oops'"),
        ("a,b,label\n1,,0\n", "data.csv:2: column 'b': not a number: ''"),
        ("", "data.csv:1: empty file; expected a header row of column names"),
        ("a,b,label\n", "data.csv: no data rows after the header"),
        (
            "a,b,label\n1,2,-1\n",
            "data.csv:2: label -1 is not a class id >= 0; fix the row, or use class names",
        ),
    ],
)
def test_malformed_csv_names_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = _csv(tmp_path, text)
    with pytest.raises(DataError) as caught:
        load_files(FileDataConfig(path=str(path)))
    assert str(caught.value) == f"{tmp_path}/{message}"


def test_binary_garbage_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_bytes(b"\x00\xff\xfe\x89garbage\n\x81\x82")
    with pytest.raises(DataError, match=r"data.csv:1: not UTF-8 text \(byte 0xff\)"):
        load_files(FileDataConfig(path=str(path)))


def test_missing_label_column(tmp_path: Path) -> None:
    path = _csv(tmp_path, "a,b\n1,2\n")
    with pytest.raises(
        DataError, match=r"data.csv:1: no column 'y' \(task.data.label_column\); columns: a, b"
    ):
        load_files(FileDataConfig(path=str(path), label_column="y"))


def test_npz_files(tmp_path: Path) -> None:
    path = tmp_path / "data.npz"
    np.savez(path, x=np.random.rand(50, 3, 2), y=np.arange(50) % 5)
    data = load_files(FileDataConfig(path=str(path), valid_fraction=0.2))
    assert len(data.train) == 40 and data.classes() == 5 and data.input_features() == 6
    np.savez(path, features=np.zeros((5, 2)), y=np.zeros(5, dtype=int))
    with pytest.raises(DataError, match=r"no array 'x' .*arrays: features, y"):
        load_files(FileDataConfig(path=str(path)))
    np.savez(path, x=np.zeros((5, 2)), y=np.zeros(5))
    with pytest.raises(DataError, match="labels must be integer class ids"):
        load_files(FileDataConfig(path=str(path)))


def test_csv_job_end_to_end(runs: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 4))
    y = (x[:, 0] + x[:, 1] > 0).astype(int)
    rows = "\n".join(
        ",".join(f"{v:.5f}" for v in r) + f",{label}" for r, label in zip(x, y, strict=True)
    )
    _csv(tmp_path, "a,b,c,d,label\n" + rows + "\n")
    task = {
        "type": "classification",
        "data": {"source": "file", "path": str(tmp_path / "data.csv")},
    }
    results = shoal.train(small_job(runs, task=task, train={"epochs": 10, "batch_size": 16}))
    assert results["valid"]["accuracy"] > 0.9


FACTORY = """
import torch
from torch import nn
from torch.utils.data import Dataset

class Squares(Dataset):
    def __init__(self, n, offset):
        g = torch.Generator().manual_seed(offset)
        self.x = torch.rand(n, 1, 4, 4, generator=g)
        self.y = (self.x.mean(dim=(1, 2, 3)) > 0.5).long()
    def __len__(self):
        return len(self.y)
    def __getitem__(self, i):
        return self.x[i], self.y[i]

class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(64, 2))
    def forward(self, x):
        return self.net(x)

def build(n=240, with_model=True):
    parts = {"train": Squares(n, 1), "valid": Squares(60, 2)}
    if with_model:
        parts["model"] = Conv()
    return parts

def broken():
    return [1, 2, 3]
"""


def test_user_factory_trains_any_module(runs: Path, tmp_path: Path) -> None:
    (tmp_path / "my_squares.py").write_text(FACTORY)
    (tmp_path / "job.toml").write_text(
        '[task]\ntype = "classification"\n[task.data]\nsource = "python"\n'
        'factory = "my_squares:build"\noptions = { n = 200 }\n'
        f'[train]\nepochs = 8\nbatch_size = 20\noptimizer = {{ kind = "adam", lr = 0.01 }}\n'
        f'[run]\ndir = "{runs}"\n[monitor]\nprogress = "off"\n'
    )
    results = shoal.train(tmp_path / "job.toml")  # the module is found next to the config
    assert results["valid"]["accuracy"] > 0.8
    state = torch.load(Path(results["checkpoint"]) / "state.pt", weights_only=True)["model"]
    assert "net.0.weight" in state  # the user's Conv module, not the MLP


def test_user_factory_without_model_gets_the_mlp(runs: Path, tmp_path: Path) -> None:
    (tmp_path / "my_squares2.py").write_text(FACTORY)
    task = {
        "type": "classification",
        "data": {
            "source": "python",
            "factory": "my_squares2:build",
            "options": {"with_model": False},
            "import_dir": str(tmp_path),
        },
    }
    results = shoal.train(small_job(runs, task=task))
    state = torch.load(Path(results["checkpoint"]) / "state.pt", weights_only=True)["model"]
    assert state["1.weight"].shape[1] == 16  # Flatten, then Linear over the 4x4 input


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("no_such_module_xyz:build", "task.data.factory: cannot import 'no_such_module_xyz'"),
        (
            "my_squares3:nothing",
            "task.data.factory: module 'my_squares3' has no function 'nothing'",
        ),
        ("my_squares3:broken", "task.data.factory: my_squares3:broken must return a dict"),
    ],
)
def test_factory_errors(runs: Path, tmp_path: Path, factory: str, message: str) -> None:
    (tmp_path / "my_squares3.py").write_text(FACTORY)
    task = {
        "type": "classification",
        "data": {"source": "python", "factory": factory, "import_dir": str(tmp_path)},
    }
    with pytest.raises(ShoalError, match=message):
        shoal.train(small_job(runs, task=task))


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("no_such_module_xyz:build", "cannot import 'no_such_module_xyz'"),
        ("my_squares4:nothing", "module 'my_squares4' has no function 'nothing'"),
    ],
)
def test_config_validate_imports_the_factory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], factory: str, message: str
) -> None:
    """`shoal config validate` imports the factory from the config's folder (a name that
    does not import is refused there, in one line, not first by a worker)."""
    (tmp_path / "my_squares4.py").write_text(FACTORY)
    (tmp_path / "job.toml").write_text(
        f'[task]\ntype = "classification"\n[task.data]\nsource = "python"\n'
        f'factory = "{factory}"\n[train]\nepochs = 1\nbatch_size = 20\n'
    )
    assert main(["config", "validate", str(tmp_path / "job.toml")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"{tmp_path / 'job.toml'}:5: task.data.factory: {message}"), line
