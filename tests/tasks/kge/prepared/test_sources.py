"""Preparing TSV and id files: the arrays match what the triples say, whatever the block
size or the sorting budget, and bad input is refused in one line at its line."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from shoal.errors import DataError
from shoal.tasks.kge.evaluation import FilterIndex
from shoal.tasks.kge.prepared import sources
from shoal.tasks.kge.prepared.graph import PreparedGraph
from shoal.tasks.kge.prepared.progress import PrepareProgress
from shoal.tasks.kge.prepared.sources import prepare_ids, prepare_tsv
from shoal.tasks.kge.sampling import TrainStats
from tests.tasks.kge.planted import write_planted_graph


def _write(folder: Path, **texts: str) -> dict[str, Path]:
    paths = {}
    for name, text in texts.items():
        paths[name] = folder / f"{name}.txt"
        paths[name].write_text(text)
    return paths


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix in (".npy", ".bin")
    }


def test_labels_get_sorted_ids_and_every_array_agrees_with_the_triples(tmp_path: Path) -> None:
    text = "b\tlikes\ta\r\n\r\na\tlikes\tc\r\n  \nc\thates\tb\r\nb\tlikes\ta\n"
    (tmp_path / "train.txt.gz").write_bytes(gzip.compress(text.encode()))
    paths = {"train": tmp_path / "train.txt.gz"}
    paths |= _write(tmp_path, test="a\thates\tb\n d \tlikes\tc\n")  # d: never in training
    prepare_tsv(paths, tmp_path / "g", PrepareProgress())
    graph = PreparedGraph.open(tmp_path / "g")
    assert list(graph.entity_names) == ["a", "b", "c"]
    assert list(graph.relation_names) == ["hates", "likes"]
    assert graph.splits["train"].tolist() == [[1, 1, 0], [0, 1, 2], [2, 0, 1], [1, 1, 0]]
    assert graph.splits["test"].tolist() == [[0, 0, 1]]
    assert graph.split_info("test")["unseen"] == 1
    assert graph.split_info("test")["first_unseen"] == (
        f"{tmp_path}/test.txt:2: entity 'd' never occurs in the training triples"
    )
    expected = TrainStats.from_triples(torch.from_numpy(np.array(graph.splits["train"])), 3, 2)
    assert graph.degree.tolist() == expected.entity_degree.tolist() == [[1, 2], [2, 1], [1, 1]]
    assert graph.relation_counts.tolist() == expected.relation_counts.tolist()


def test_the_filter_index_holds_every_known_answer(tmp_path: Path) -> None:
    paths = write_planted_graph(tmp_path)
    prepare_tsv(paths, tmp_path / "g", PrepareProgress())
    graph = PreparedGraph.open(tmp_path / "g")
    known = torch.from_numpy(np.concatenate([np.array(t) for t in graph.splits.values()]))
    test = torch.from_numpy(np.array(graph.splits["test"]))
    in_memory = FilterIndex.build(known, test, graph.num_relations)
    on_disk = FilterIndex.of_split(graph.filter, test)
    for side in ("tails", "heads"):
        a_rows, a_entities = getattr(in_memory, side).rows(0, len(test))
        b_rows, b_entities = getattr(on_disk, side).rows(0, len(test))
        pairs = sorted(zip(a_rows.tolist(), a_entities.tolist(), strict=True))
        assert pairs == sorted(zip(b_rows.tolist(), b_entities.tolist(), strict=True)), side


def test_block_size_and_sorting_budget_change_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks of 64 bytes cut lines everywhere; a budget of 7 entries sorts the filter index
    in dozens of buckets on disk: the same bytes as one block and one bucket."""
    paths = write_planted_graph(tmp_path)
    prepare_tsv(paths, tmp_path / "whole", PrepareProgress())
    monkeypatch.setattr(sources, "BLOCK_BYTES", 64)
    prepare_tsv(paths, tmp_path / "pieces", PrepareProgress(), budget=7)
    assert _files(tmp_path / "whole") == _files(tmp_path / "pieces")
    assert not [p for p in (tmp_path / "pieces").iterdir() if p.name.startswith(".")]


def test_a_bad_line_in_a_later_block_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sources, "BLOCK_BYTES", 16)
    lines = [f"e{i}\tr\te{i + 1}\n" for i in range(40)]
    lines[30] = "e30\tr\n"
    paths = _write(tmp_path, train="".join(lines))
    with pytest.raises(DataError) as caught:
        prepare_tsv(paths, tmp_path / "g", PrepareProgress())
    assert str(caught.value) == (
        f"{tmp_path}/train.txt:31: expected 3 tab-separated columns (head, relation, tail), got 2"
    )


def test_id_files_keep_their_ids(tmp_path: Path) -> None:
    """DGL-KE's udd_hrt: integer triples, names from id<TAB>name files when given."""
    paths = _write(tmp_path, train="0\t1\t2\n2\t0\t3\n", valid="3\t1\t0\n")
    names = _write(tmp_path, entities="0\tzero\n1\tone\n2\ttwo\n3\tthree\n4\tfour\n")
    relation_names = _write(tmp_path, relations="0\tr0\n1\tr1\n")
    prepare_ids(
        paths, tmp_path / "g", PrepareProgress(), names["entities"], relation_names["relations"]
    )
    graph = PreparedGraph.open(tmp_path / "g")
    assert (graph.num_entities, graph.num_relations) == (5, 2)  # entity 4: a row, never used
    assert graph.splits["train"].tolist() == [[0, 1, 2], [2, 0, 3]]
    assert list(graph.entity_names) == ["zero", "one", "two", "three", "four"]
    prepare_ids(paths, tmp_path / "bare", PrepareProgress())
    bare = PreparedGraph.open(tmp_path / "bare")
    assert (bare.num_entities, bare.num_relations) == (4, 2)
    assert list(bare.entity_names) == ["0", "1", "2", "3"]


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (
            {"train": "0\t1\t2\n0\tx\t2\n"},
            "train.txt:2: relation 'x' is not an id (a non-negative integer)",
        ),
        (
            {"train": "0\t1\t2\n-1\t0\t2\n"},
            "train.txt:2: head '-1' is not an id (a non-negative integer)",
        ),
        (
            {"train": "0\t1\t2\n\n0\t1\n"},
            "train.txt:3: expected 3 tab-separated columns (head, relation, tail), got 2",
        ),
        (
            {"train": "0\t0\t1\n", "entities": "0\ta\n2\tb\n"},
            "entities.txt:2: id 2 where 1 was expected; ids must be 0, 1, 2, ... in order",
        ),
        (
            {"train": "0\t0\t1\n1\t0\t2\n", "entities": "0\ta\n1\tb\n"},
            "train.txt:2: entity id 2 is not in {dir}/entities.txt (ids 0 to 1)",
        ),
    ],
)
def test_bad_id_files_are_refused_at_their_line(
    tmp_path: Path, files: dict[str, str], message: str
) -> None:
    paths = _write(tmp_path, **files)
    entities = paths.pop("entities", None)
    with pytest.raises(DataError) as caught:
        prepare_ids(paths, tmp_path / "g", PrepareProgress(), entities)
    assert str(caught.value).startswith(f"{tmp_path}/" + message.format(dir=tmp_path))
