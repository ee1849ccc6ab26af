"""Red-team tests of the data readers: what a careless or hostile file does to shoal.

Issue 18, item 10: a byte-order mark, a label typo, non-finite features and
other hostile inputs are caught where the data is read, as one line naming the
file and line (exit 2), never as a silently wrong model or as "non-finite
gradients"; item 11: the last progress line names the last epoch.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import shoal
from shoal.config import load_config
from shoal.errors import DataError
from shoal.strategies.parameter_server.config import FileShardingConfig
from shoal.strategies.parameter_server.sharding import table_owners
from shoal.tasks.classification.config import FileDataConfig, PythonDataConfig
from shoal.tasks.classification.data import call_factory, load_files, read_train_files
from shoal.tasks.classification.labels import LabelSpace
from shoal.tasks.classification.samples import DatasetSamples
from shoal.tasks.kge.triples import read_triples
from tests.conftest import run_shoal, small_job

BOM = b"\xef\xbb\xbf"


def _rows(n: int = 60, classes: tuple[str, ...] = ("0", "1")) -> list[str]:
    rng = np.random.default_rng(0)
    return [
        f"{a:.3f},{b:.3f},{classes[i % len(classes)]}"
        for i, (a, b) in enumerate(rng.normal(size=(n, 2)))
    ]


def _write(path: Path, rows: list[str], header: str = "a,b,label", prefix: bytes = b"") -> Path:
    path.write_bytes(prefix + (header + "\n" + "\n".join(rows) + "\n").encode())
    return path


def _job_file(tmp_path: Path, data: str, extra: str = "") -> Path:
    """A CLI job on `data` (a CSV beside it) that trains a second if the data is accepted."""
    job = tmp_path / "job.toml"
    job.write_text(
        f'[task]\ntype = "classification"\n[task.data]\nsource = "file"\npath = "{data}"\n'
        f"{extra}[task.model]\nhidden = [8]\n[train]\nepochs = 1\nbatch_size = 16\n"
        f'[run]\ndir = "{tmp_path / "runs"}"\n[monitor]\nprogress = "off"\n'
    )
    return job


def _one_line_error(tmp_path: Path, job: Path) -> str:
    done = run_shoal("train", str(job), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def _csv_error(tmp_path: Path, cli: bool) -> str:
    """The error data.csv raises: through the CLI (exit 2, one line), or (faster) from the
    reader itself, for the cases that only vary the message."""
    if cli:
        return _one_line_error(tmp_path, _job_file(tmp_path, "data.csv"))
    with pytest.raises(DataError) as caught:
        load_files(FileDataConfig(path=str(tmp_path / "data.csv")))
    return str(caught.value)


# ---------------------------------------------------------------- byte-order marks


@pytest.mark.parametrize("compress", [False, True])
def test_a_bom_is_not_part_of_the_first_csv_column(tmp_path: Path, compress: bool) -> None:
    """Excel's "CSV UTF-8" starts with a BOM: the first column name must still be `label`."""
    rows = [f"{'cat' if i % 2 else 'dog'},{i},{i * 2}" for i in range(20)]
    text = BOM + ("label,a,b\n" + "\n".join(rows) + "\n").encode()
    path = tmp_path / ("data.csv.gz" if compress else "data.csv")
    path.write_bytes(gzip.compress(text) if compress else text)
    data = load_files(FileDataConfig(path=str(path), label_column="label"))
    assert data.label_names == ("cat", "dog") and data.input_features() == 2


@pytest.mark.parametrize("compress", [False, True])
def test_a_bom_is_not_part_of_the_first_entity(tmp_path: Path, compress: bool) -> None:
    text = BOM + b"a\tlikes\tb\nb\tlikes\tc\n"
    path = tmp_path / "train.txt"
    path.write_bytes(gzip.compress(text) if compress else text)
    assert read_triples(path).heads == ["a", "b"]


def test_a_bom_in_a_sharding_file_and_a_config(tmp_path: Path) -> None:
    shards = tmp_path / "owners.tsv"
    shards.write_bytes(BOM + b"a\t1\nb\t0\n")
    owners = table_owners(FileShardingConfig(kind="file", path=str(shards)), 2, ["a", "b"], False)
    assert owners.tolist() == [1, 0]
    job = tmp_path / "job.toml"
    job.write_bytes(BOM + b'[task]\ntype = "classification"\n[train]\nepochs = 1\nbatch_size = 8\n')
    assert load_config(job).train.epochs == 1


def test_a_bom_inside_a_file_is_named_by_its_line(tmp_path: Path) -> None:
    """Two files joined with `cat`: the second one's mark is mid-file, an error at its line."""
    path = tmp_path / "train.txt"
    path.write_bytes(BOM + b"a\tr\tb\n" + BOM + b"b\tr\tc\n")
    with pytest.raises(DataError, match=r"train.txt:2: a byte-order mark inside the file"):
        read_triples(path)


# ---------------------------------------------------------------- labels that look wrong


def test_a_label_typo_does_not_build_a_million_class_model(tmp_path: Path) -> None:
    rows = _rows(40)
    rows[7] = rows[7].rsplit(",", 1)[0] + ",1000000"
    _write(tmp_path / "data.csv", rows)
    line = _one_line_error(tmp_path, _job_file(tmp_path, "data.csv"))
    assert line.startswith(f"{tmp_path / 'data.csv'}:9: label 1000000 is far beyond")
    assert "set task.data.classes = 1000001 if the ids are right" in line


def test_declared_classes_accept_sparse_ids_and_bound_them(tmp_path: Path) -> None:
    rows = _rows(40)
    rows[3] = rows[3].rsplit(",", 1)[0] + ",50"
    path = _write(tmp_path / "data.csv", rows)
    with pytest.raises(DataError, match=r"data.csv:5: label 50 is far beyond"):
        load_files(FileDataConfig(path=str(path)))
    assert load_files(FileDataConfig(path=str(path), classes=51)).classes() == 51
    with pytest.raises(DataError, match=r"data.csv:5: label 50 is not a class id in 0..9"):
        load_files(FileDataConfig(path=str(path), classes=10))


def test_a_class_of_one_sample_among_large_ones_is_a_warning(tmp_path: Path) -> None:
    rows = _rows(60, ("cat", "dog"))
    rows[30] = rows[30].rsplit(",", 1)[0] + ",dgo"
    _write(tmp_path / "data.csv", rows)
    done = run_shoal("train", str(_job_file(tmp_path, "data.csv")), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (
        f"{tmp_path / 'data.csv'}:32: class 'dgo' has a single sample while the median class "
        "has 29; a typo? fix the row, or set task.data.classes = 3 to accept it"
    ) in done.stderr
    silenced = load_files(FileDataConfig(path=str(tmp_path / "data.csv"), classes=3))
    assert silenced.warnings == [] and silenced.label_names == ("cat", "dgo", "dog")


@pytest.mark.parametrize(
    ("label", "message"),
    [
        ("", "data.csv:6: empty label; every row needs its class"),
        ("l", "data.csv:6: label 'l' is not an integer, but 39 of the 40 labels are integer ids"),
        ("99999999999999999999999", "data.csv:6: label 99999999999999999999999 is not a usable"),
    ],
)
def test_bad_labels_are_named_by_line(tmp_path: Path, label: str, message: str) -> None:
    rows = _rows(40)
    rows[4] = rows[4].rsplit(",", 1)[0] + "," + label
    path = _write(tmp_path / "data.csv", rows)
    with pytest.raises(DataError) as caught:
        load_files(FileDataConfig(path=str(path)))
    assert str(caught.value).startswith(f"{tmp_path}/{message}")


def test_a_measurement_taken_for_the_label_is_refused(tmp_path: Path) -> None:
    """The default label column is the last: a float feature there is not 60 classes."""
    path = _write(tmp_path / "data.csv", [f"{i % 2},{i / 7:.4f}" for i in range(60)], "y,x")
    with pytest.raises(DataError, match=r"data.csv:3: label '0.1429' in column 'x' .* fractional"):
        load_files(FileDataConfig(path=str(path)))


def test_one_class_only_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "data.csv", _rows(20, ("1",)))
    with pytest.raises(DataError, match=r"data.csv:2: every label is '1': a classifier needs"):
        load_files(FileDataConfig(path=str(path)))


def test_named_labels_keep_their_ids_across_files(tmp_path: Path) -> None:
    """A validation file without `bird` maps `cat` as training does (ids over both files)."""
    train = _write(tmp_path / "train.csv", _rows(30, ("bird", "cat", "dog")))
    valid = _write(tmp_path / "valid.csv", ["0,0,cat", "0,0,dog"])
    data = load_files(FileDataConfig(path=str(train), valid_path=str(valid)))
    assert data.label_names == ("bird", "cat", "dog")
    assert data.valid is not None and data.valid.all_labels().tolist() == [1, 2]
    client = _write(tmp_path / "client.csv", ["0,0,dog", "0,0,eel"])
    space = LabelSpace(3, data.label_names)
    assert read_train_files([str(valid)], None, space)[0].all_labels().tolist() == [1, 2]
    with pytest.raises(DataError, match=r"client.csv:3: label 'eel' is not one of the classes"):
        read_train_files([str(client)], None, space)


# ---------------------------------------------------------------- non-finite features


@pytest.mark.parametrize(
    ("cell", "what", "cli"),
    [
        ("nan", "not a finite number: nan", True),
        ("-inf", "not a finite number: -inf", False),
        ("1e39", "1e+39 is too large for float32 (|x| <= 3.4e38)", False),
    ],
)
def test_non_finite_features_are_named_where_they_are_read(
    tmp_path: Path, cell: str, what: str, cli: bool
) -> None:
    rows = _rows(40)
    rows[9] = f"0.5,{cell},1"
    _write(tmp_path / "data.csv", rows)
    assert _csv_error(tmp_path, cli) == (
        f"{tmp_path / 'data.csv'}:11: column 'b': {what}; remove the row or fill in the value"
    )


def test_non_finite_npz_features_are_named_by_index(tmp_path: Path) -> None:
    x = np.ones((20, 3, 2), dtype=np.float64)
    x[13, 2, 1] = np.inf
    np.savez(tmp_path / "data.npz", x=x, y=np.arange(20) % 2)
    with pytest.raises(DataError, match=r"data.npz: x\[13, 2, 1\]: not a finite number: inf"):
        load_files(FileDataConfig(path=str(tmp_path / "data.npz")))


FACTORY = """
import torch

def tensors():
    x = torch.zeros(30, 4)
    x[17, 2] = float("nan")
    return {"train": (x, torch.arange(30) % 2)}

class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 30
    def __getitem__(self, i):
        return torch.full((4,), float("inf") if i == 21 else 0.0), i % 2

def dataset():
    return {"train": Items()}

def too_few_classes():
    return {"train": (torch.zeros(30, 4), torch.arange(30) % 3), "num_classes": 2}
"""


def test_non_finite_inputs_of_a_factory_are_named_by_sample(tmp_path: Path) -> None:
    (tmp_path / "hostile_factory.py").write_text(FACTORY)
    with pytest.raises(DataError, match=r"'train' sample 17: feature 2 is not a finite number"):
        call_factory(PythonDataConfig(factory="hostile_factory:tensors", import_dir=str(tmp_path)))
    with pytest.raises(DataError, match=r"'train' sample 2: label 2 is not one of the 2 class"):
        call_factory(
            PythonDataConfig(factory="hostile_factory:too_few_classes", import_dir=str(tmp_path))
        )
    data = call_factory(
        PythonDataConfig(factory="hostile_factory:dataset", import_dir=str(tmp_path))
    )
    assert isinstance(data.train, DatasetSamples)
    data.train.fetch(torch.arange(0, 20))  # a clean batch passes
    with pytest.raises(DataError, match=r"'train' sample 21: its input holds nan or inf"):
        data.train.fetch(torch.arange(16, 24))


# ---------------------------------------------------------------- other hostile files


@pytest.mark.parametrize(
    ("content", "message", "cli"),
    [
        (
            b"a,a,label\n1,2,0\n",
            "data.csv:1: column name 'a' appears twice (columns 1 and 2)",
            True,
        ),
        (b"a,b,label,\n1,2,0,\n", "data.csv:1: column 4 of the header has no name", False),
        (
            b"a;b;label\n1;2;0\n",
            "data.csv:1: need at least one feature column and a label column "
            "(is it separated by ';'? shoal reads commas)",
            False,
        ),
        (
            "a,b,label\n1,2,0\n1,2,caf\xe9\n".encode("latin-1"),
            "data.csv:3: not UTF-8 text (byte 0xe9)",
            False,
        ),
    ],
)
def test_hostile_csv_files_are_one_line_errors(
    tmp_path: Path, content: bytes, message: str, cli: bool
) -> None:
    (tmp_path / "data.csv").write_bytes(content)
    assert _csv_error(tmp_path, cli).startswith(f"{tmp_path}/{message}")


def test_a_header_of_numbers_is_a_warning(tmp_path: Path) -> None:
    """A file without a header loses its first sample to the column names: say so."""
    path = _write(tmp_path / "data.csv", _rows(20), header="0.5,1.5,1")
    assert (
        load_files(FileDataConfig(path=str(path)))
        .warnings[0]
        .startswith(f"{path}:1: the header row holds only numbers (0.5, 1.5, 1)")
    )
    pandas = _write(tmp_path / "pandas.csv", _rows(20), header="0,1,2")
    assert load_files(FileDataConfig(path=str(pandas))).warnings == []


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (lambda p: np.save(p, np.zeros((4, 2))), "a single .npy array, not an NPZ archive"),
        (
            lambda p: np.savez(p, x=np.array([[object()]] * 4, dtype=object), y=np.zeros(4, int)),
            "not a readable NPZ archive",
        ),
        (lambda p: np.savez(p, x=np.array([["a", "b"]] * 4), y=np.arange(4) % 2), "dtype <U1"),
    ],
)
def test_hostile_npz_files_are_data_errors(tmp_path: Path, write: object, message: str) -> None:
    path = tmp_path / "data.npz"
    with open(path, "wb") as handle:
        write(handle)  # type: ignore[operator]
    with pytest.raises(DataError, match=message.replace(".", r"\.")):
        load_files(FileDataConfig(path=str(path)))


# ---------------------------------------------------------------- the last progress line


def test_the_last_progress_line_names_the_last_epoch(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """400 samples in batches of 31: 13 steps an epoch, lines at steps 10, 20 and 26 (the
    end); the epoch counter has moved on when the last line is written."""
    results = shoal.train(small_job(runs, monitor={"progress": "plain", "log_every_steps": 10}))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    progress = [line.split(" loss")[0] for line in lines if "/26" in line]
    assert progress == ["step 10/26 epoch 1/2", "step 20/26 epoch 2/2", "step 26/26 epoch 2/2"]
    metrics = Path(results["run_dir"]) / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["epoch"] for r in records if r["event"] == "train"] == [0, 1, 1]


def test_a_symlink_loop_as_a_data_path_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "a.csv").symlink_to(tmp_path / "b.csv")
    (tmp_path / "b.csv").symlink_to(tmp_path / "a.csv")
    line = _one_line_error(tmp_path, _job_file(tmp_path, "a.csv"))
    assert line == (
        f"{tmp_path / 'job.toml'}:5: task.data.path: {tmp_path / 'a.csv'}: a symbolic link that "
        "leads back to itself (a loop); point it at the file"
    )
