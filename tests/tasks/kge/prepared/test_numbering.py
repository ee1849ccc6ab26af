"""Numbering labels a block at a time writes the very bytes the per-field dictionary wrote.

`DictLabelIndex` is the numbering preparation used before (a Python dictionary lookup
per field, keyed by the raw bytes), kept here as the reference: both prepare the same
unusual graph (unicode, spaces inside labels, labels that differ only in surrounding or
non-ASCII whitespace, long labels sharing their first words, CRLF and blank lines, gzip,
held-out labels never seen in training) and every array and name file must be equal,
whatever the block size.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from shoal.tasks.kge.prepared import sources
from shoal.tasks.kge.prepared.parse import Rows, _parse_ids_by_field
from shoal.tasks.kge.prepared.progress import PrepareProgress
from shoal.tasks.kge.prepared.sources import prepare_ids, prepare_tsv


class DictLabelIndex:
    """Labels -> ids with a dictionary lookup per raw field (the numbering it replaced)."""

    def __init__(self) -> None:
        self.labels: list[str] = []
        self._canonical: dict[str, int] = {}
        self._raw: dict[bytes, int] = {}
        self.frozen = False

    def freeze(self) -> None:
        self.frozen = True

    def __len__(self) -> int:
        return len(self.labels)

    def ids(self, rows: Rows, columns: list[int]) -> np.ndarray | None:
        out = []
        for column in columns:
            fields = rows.columns[column]
            for field in set(fields) - self._raw.keys():
                label = field.decode().strip()
                if not label:
                    return None
                index = self._canonical.get(label)
                if index is None:
                    index = -1 if self.frozen else len(self.labels)
                    if not self.frozen:
                        self._canonical[label] = index
                        self.labels.append(label)
                self._raw[field] = index
            out.append([self._raw[field] for field in fields])
        return np.array(out, dtype=np.int64).T.reshape(len(rows), len(columns))


LABELS = [
    "Zürich",
    "東京",
    "😀 smile",
    "New York City",
    "a  b",
    "a b",
    "x",
    "xy",
    "abcdefgh",
    "abcdefghi",
    "abcdefgh" * 2,
    "abcdefgh" * 2 + "!",
    "abcdefgh" * 9 + "é",
    "/m/0abc12",
    "Q42",
    "ÿ" * 5,
]
#: what may surround a label and is stripped: ASCII spaces, NBSP, em space, \x1c
SURROUNDINGS = [("", ""), (" ", ""), ("", "  "), ("\u00a0", ""), ("\u2003", "\x1c"), ("\x0b", "")]


def _write_graph(folder: Path, seed: int) -> dict[str, Path]:
    rng = np.random.default_rng(seed)
    relations = ["likes", "is part of", "ünïcode", "r" * 30]

    def label(pool: list[str]) -> str:
        before, after = SURROUNDINGS[int(rng.integers(len(SURROUNDINGS)))]
        return before + pool[int(rng.integers(len(pool)))] + after

    def lines(count: int, pool: list[str]) -> str:
        out = []
        for _ in range(count):
            ending = "\r\n" if rng.random() < 0.3 else "\n"
            out.append(f"{label(pool)}\t{label(relations)}\t{label(pool)}{ending}")
            if rng.random() < 0.05:  # blank lines: nothing, spaces, a CR, a NBSP
                out.append(["\n", "   \r\n", "\u00a0\n"][int(rng.integers(3))])
        return "".join(out)

    (folder / "train.txt.gz").write_bytes(gzip.compress(lines(600, LABELS).encode()))
    (folder / "valid.txt").write_text(lines(80, [*LABELS, "never seen"]), encoding="utf-8")
    (folder / "test.txt").write_bytes(lines(80, [*LABELS, "unseen ö"]).encode())
    return {
        "train": folder / "train.txt.gz",
        "valid": folder / "valid.txt",
        "test": folder / "test.txt",
    }


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix in (".npy", ".bin")
    }


@pytest.mark.parametrize("block_bytes", [64, 1 << 20])
def test_tsv_preparation_writes_the_bytes_the_dictionary_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_bytes: int
) -> None:
    paths = _write_graph(tmp_path, seed=block_bytes)
    monkeypatch.setattr(sources, "BLOCK_BYTES", block_bytes)
    manifest = prepare_tsv(paths, tmp_path / "blocks", PrepareProgress())
    monkeypatch.setattr(sources, "LabelIndex", DictLabelIndex)
    reference = prepare_tsv(paths, tmp_path / "dictionary", PrepareProgress())
    assert _files(tmp_path / "blocks") == _files(tmp_path / "dictionary")
    assert manifest["splits"] == reference["splits"]
    names = (tmp_path / "blocks" / "entity_names.bin").read_bytes().decode()
    assert "Zürich" in names and "abcdefgh" * 9 + "é" in names  # non-trivial labels got in
    assert manifest["entities"] == len(LABELS)  # surroundings stripped: one id per label
    assert manifest["splits"]["valid"]["unseen"] > 0


def test_id_files_parse_as_numpy_converted_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Digits read in place: the same ids as NumPy's conversion of each field, with
    whitespace, CRLF, leading zeros, blank lines; signs and underscores still accepted."""
    plain = "0\t1\t2\r\n 007\t0\t3 \n\n12\t1\t\x0b5\n"
    unusual = "+4\t1\t1_0\n3\t0\t2\n"
    for name, text in (("plain", plain), ("unusual", unusual)):
        path = tmp_path / f"{name}.txt"
        path.write_text(text)
        prepare_ids({"train": path}, tmp_path / f"{name}-fast", PrepareProgress())
    monkeypatch.setattr(
        sources,
        "parse_ids",
        lambda rows, block, path, form, columns=None: _parse_ids_by_field(
            rows, block, path, form, len(form.columns) if columns is None else columns
        ),
    )
    for name in ("plain", "unusual"):
        prepare_ids(
            {"train": tmp_path / f"{name}.txt"}, tmp_path / f"{name}-ref", PrepareProgress()
        )
        assert _files(tmp_path / f"{name}-fast") == _files(tmp_path / f"{name}-ref")
    triples = np.load(tmp_path / "unusual-fast" / "train.npy")
    assert triples.tolist() == [[4, 1, 10], [3, 0, 2]]
