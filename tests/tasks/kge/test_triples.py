"""Reading triples files: CRLF, gzip, blank lines, stable ids, malformed input, unseen labels."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from shoal.errors import DataError, ShoalError
from shoal.tasks.kge import triples as triples_module
from shoal.tasks.kge.config import BuiltinDataConfig, FilesDataConfig
from shoal.tasks.kge.triples import load_kg, read_triples
from tests.conftest import run_shoal


def _files(tmp_path: Path, **texts: str | bytes) -> FilesDataConfig:
    paths = {}
    for name, text in texts.items():
        path = tmp_path / f"{name}.txt"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        paths[name] = str(path)
    return FilesDataConfig(**paths)


def test_crlf_blank_lines_and_gzip(tmp_path: Path) -> None:
    text = "b\tlikes\ta\r\n\r\na\tlikes\tc\r\n  \nc\thates\tb\r\n"
    (tmp_path / "train.txt.gz").write_bytes(gzip.compress(text.encode()))
    data = load_kg(FilesDataConfig(train=str(tmp_path / "train.txt.gz")))
    assert data.entities.labels == ["a", "b", "c"]  # no "a\r": the CR is not part of a label
    assert data.relations.labels == ["hates", "likes"]
    assert data.train.tolist() == [[1, 1, 0], [0, 1, 2], [2, 0, 1]]
    assert read_triples(tmp_path / "train.txt.gz").lines.tolist() == [1, 3, 5]


def test_ids_are_stable_whatever_the_order_of_lines(tmp_path: Path) -> None:
    a = load_kg(_files(tmp_path, train="x\tr\ty\nz\ts\tx\n"))
    b = load_kg(_files(tmp_path, train="z\ts\tx\nx\tr\ty\n"))
    assert a.entities.labels == b.entities.labels and a.relations.labels == b.relations.labels
    assert a.entities.to_tsv() == "0\tx\n1\ty\n2\tz\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "a\tr\tb\na\tr\n",
            "train.txt:2: expected 3 tab-separated columns (head, relation, tail), got 2",
        ),
        (
            "a\tr\tb\tc\n",
            "train.txt:1: expected 3 tab-separated columns (head, relation, tail), got 4",
        ),
        ("a r b\n", "train.txt:1: expected 3 tab-separated columns (head, relation, tail), got 1"),
        ("a\tr\tb\n\t\tb\n", "train.txt:2: empty head and relation"),
        ("a\tr\t \n", "train.txt:1: empty tail"),
        ("\n\n", "train.txt: no triples; expected head<TAB>relation<TAB>tail lines"),
        (
            b"a\tr\tb\n\x89PNG\xff\xfe\x00\n",
            "train.txt:2: not UTF-8 text (byte 0x89); expected head<TAB>relation<TAB>tail lines",
        ),
        (
            b"a\tr\tb\nc\x00\tr\td\n",
            "train.txt:2: binary data (a NUL byte); expected head<TAB>relation<TAB>tail lines",
        ),
        (b"\x1f\x8bnot really gzip", "train.txt: not a readable gzip file"),
    ],
)
def test_malformed_files_name_file_and_line(
    tmp_path: Path, text: str | bytes, message: str
) -> None:
    with pytest.raises(DataError) as caught:
        load_kg(_files(tmp_path, train=text))
    assert str(caught.value).startswith(f"{tmp_path}/{message}")
    assert "\n" not in str(caught.value)


def test_unseen_entities_in_test_are_counted_and_skipped(tmp_path: Path) -> None:
    config = _files(
        tmp_path,
        train="a\tr\tb\nb\tr\tc\n",
        test="a\tr\tc\nd\tr\ta\na\tq\tb\n",  # d is an unknown entity, q an unknown relation
    )
    data = load_kg(config)
    assert data.splits["test"].unseen == 2
    assert data.splits["test"].triples.tolist() == [[0, 0, 2]]


def test_unseen_entities_can_stop_the_run(tmp_path: Path) -> None:
    config = _files(tmp_path, train="a\tr\tb\n", valid="a\tr\tb\n\nb\tr\tzed\n")
    with pytest.raises(DataError) as caught:
        load_kg(config.model_copy(update={"unseen": "error"}))
    assert str(caught.value) == (
        f"{tmp_path}/valid.txt:3: entity 'zed' never occurs in the training triples; "
        'set task.data.unseen = "skip" to leave such triples out'
    )


def test_builtin_dataset_without_pykeen_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(triples_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ShoalError, match=r"pip install 'shoal\[datasets\]'"):
        load_kg(BuiltinDataConfig(name="nations"))


@pytest.mark.skipif(
    triples_module.importlib.util.find_spec("pykeen") is None,
    reason="needs shoal[datasets] (pykeen)",
)
@pytest.mark.parametrize(
    ("name", "entities", "relations", "train"),
    [("nations", 14, 55, 1592), ("kinships", 104, 25, 8544), ("umls", 135, 46, 5216)],
)
def test_builtin_datasets(name: str, entities: int, relations: int, train: int) -> None:
    data = load_kg(BuiltinDataConfig(name=name))
    assert (len(data.entities), len(data.relations), len(data.train)) == (
        entities,
        relations,
        train,
    )
    assert set(data.splits) == {"valid", "test"}


def test_the_cli_stops_before_training_with_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "train.tsv").write_text("a\tr\tb\nb\tr\n")
    (tmp_path / "job.toml").write_text(
        '[task]\ntype = "kge"\nmodel = "transe"\ndata = { train = "train.tsv" }\n'
        f'[train]\nepochs = 1\nbatch_size = 2\n[run]\ndir = "{tmp_path / "runs"}"\n'
    )
    done = run_shoal("train", "job.toml", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"{tmp_path}/train.tsv:2: expected 3 tab-separated columns (head, relation, tail), got 2"
    )
    assert "Traceback" not in done.stderr
