"""The synthetic graph generator: a function of the seed alone, power-law degrees, and the
same graph whether written prepared or as TSV and prepared again."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shoal.tasks.kge.prepared.graph import PreparedGraph
from shoal.tasks.kge.prepared.progress import PrepareProgress
from shoal.tasks.kge.prepared.sources import prepare_tsv
from shoal.tasks.kge.synthetic import SyntheticGraph, write_prepared, write_tsv
from tests.conftest import run_shoal

GRAPH = SyntheticGraph(entities=300, relations=20, triples=20_000, clusters=10, seed=4)


def test_triples_do_not_depend_on_the_block_size() -> None:
    whole, split = GRAPH.block(0, GRAPH.triples)
    blocks = list(GRAPH.blocks(rows=777))
    assert np.array_equal(np.concatenate([b[0] for b in blocks]), whole)
    assert np.array_equal(np.concatenate([b[1] for b in blocks]), split)
    other, _ = SyntheticGraph(300, 20, 20_000, clusters=10, seed=5).block(0, GRAPH.triples)
    assert not np.array_equal(other, whole)


def test_degrees_follow_a_power_law_and_relations_join_their_clusters() -> None:
    triples, _ = GRAPH.block(0, GRAPH.triples)
    degree = np.bincount(np.concatenate([triples[:, 0], triples[:, 2]]), minlength=300)
    assert degree.max() > 20 * np.median(degree)  # hubs and a long tail
    source, target = GRAPH.relation_clusters()
    assert (source != target).all()
    r = triples[:, 1]
    assert (triples[:, 0] % 10 == source[r]).all() and (triples[:, 2] % 10 == target[r]).all()


def test_prepared_directly_or_through_tsv_the_same_ids(tmp_path: Path) -> None:
    direct = write_prepared(GRAPH, tmp_path / "direct")
    prepare_tsv(write_tsv(GRAPH, tmp_path / "tsv"), tmp_path / "again", PrepareProgress())
    a, b = PreparedGraph.open(tmp_path / "direct"), PreparedGraph.open(tmp_path / "again")
    train = np.array(a.splits["train"])
    assert len(np.unique(train[:, [0, 2]])) == a.num_entities == b.num_entities  # all trained
    for name in ("train", "valid", "test"):
        assert np.array_equal(a.splits[name], b.splits[name]), name
    assert list(a.entity_names)[:3] == ["e000", "e001", "e002"]
    assert direct["input"] == "synthetic" and direct["sources"]["synthetic"]["seed"] == 4


def test_the_cli_synthesizes_a_prepared_folder(tmp_path: Path) -> None:
    args = ["kge", "synthesize", "g", "--entities", "200", "--relations", "4", "--triples", "5000"]
    done = run_shoal(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("g: 200 entities, 4 relations, train ")
    assert PreparedGraph.open(tmp_path / "g").num_entities == 200
    again = run_shoal(*args, cwd=tmp_path)
    assert again.returncode == 2
    assert again.stderr.strip() == "g: already exists; choose another folder or pass --force"
