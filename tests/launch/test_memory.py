"""A job that cannot fit the machine's memory is refused before it starts, with the estimate."""

from __future__ import annotations

import gzip
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tomli_w
import torch

from shoal.config import load_config
from shoal.errors import ShoalError
from shoal.launch import memory
from shoal.launch.memory import check_memory, estimate
from shoal.strategies.parameter_server.config import (
    LazyAdamConfig,
    RowAdagradConfig,
    RowSGDConfig,
)
from shoal.strategies.parameter_server.row_optimizers import build_row_optimizer
from shoal.tasks.kge.prepared.cache import prepared_for
from shoal.tasks.kge.prepared.progress import PrepareProgress
from shoal.tasks.kge.synthetic import SyntheticGraph, write_prepared, write_tsv
from shoal.textfile import text_size
from tests.conftest import run_shoal, small_job
from tests.tasks.kge.test_training import kge_job


def test_data_larger_than_the_machine_is_refused_in_one_line(tmp_path: Path) -> None:
    job = small_job(
        tmp_path / "runs",
        task={"data": {"samples": 2_000_000_000, "features": 64}},
        strategy={"type": "data_parallel", "num_replicas": 2},
        run={"name": "big"},
    )
    (tmp_path / "job.toml").write_text(tomli_w.dumps(job))
    done = run_shoal("train", "job.toml", cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(
        "the job needs about 6208.0 GB of memory before its first step, more than"
    ), line
    assert (
        "2 processes x (task.data: 2,000,000,000 samples x 64 features: 3104.0 GB; the model: "
        in line
    )
    assert line.endswith("or pass --force to start it anyway")
    assert not (tmp_path / "runs" / "big").exists()


def test_the_estimate_counts_the_optimizers_copies_and_forces_through() -> None:
    base = small_job(Path("runs"), task={"model": {"hidden": [100]}})
    job = load_config(base, ["task.data.features=10", "task.data.classes=3"])
    parameters = (10 + 1) * 100 + (100 + 1) * 3
    sgd, _ = estimate(job, 1)  # momentum 0.9: one slot; weights, gradients, best, momentum
    adam, _ = estimate(load_config(base, ["train.optimizer={kind = 'adam'}"]), 1)
    assert adam - sgd == 4 * parameters  # Adam keeps two moments
    huge = load_config(base, ["task.data.samples=2000000000000"])
    check_memory(huge, 4, force=True)  # --force starts it anyway


def test_a_gzip_texts_size_is_read_from_its_trailer(tmp_path: Path) -> None:
    text = tmp_path / "text.txt.gz"
    text.write_bytes(gzip.compress(b"to be or not to be\n" * 100_000))
    assert text_size(text) == 1_900_000
    plain = tmp_path / "text.txt"
    plain.write_text("abc")
    assert text_size(plain) == 3


GRAPH = SyntheticGraph(entities=1000, relations=5, triples=3000, seed=0)


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("kge") / "graph"
    write_prepared(GRAPH, folder)
    return folder


def _kge(graph: Path, **sections: Any) -> Any:
    job = kge_job(Path("runs"), {"prepared": str(graph)}, task={"dim": 100})
    for name, value in sections.items():
        job[name] = {**job.get(name, {}), **value}
    return load_config(job)


def test_kge_tables_are_counted_where_the_strategy_keeps_them(graph: Path) -> None:
    """Whole with Adam's copies in every data-parallel process; once, with the row
    optimizer's state, over the parameter servers; not at all when they live on disk."""
    entries = 1000 * 100 + 5 * 100
    replicas, how = estimate(_kge(graph, strategy={"type": "data_parallel", "num_replicas": 3}), 3)
    assert replicas == 3 * 4 * entries * 5  # weights, gradients, best, two moments
    assert "task tables (entity 1,000 x 100, relation 5 x 100)" in how
    servers = {"type": "parameter_server", "num_workers": 2, "num_servers": 2}
    adagrad = _kge(graph, strategy={**servers, "optimizer": {"kind": "adagrad"}})
    assert estimate(adagrad, 4)[0] == 4 * (entries + 1005)  # one float of state per row
    lazy_adam = _kge(graph, strategy={**servers, "optimizer": {"kind": "lazy_adam"}})
    assert estimate(lazy_adam, 4)[0] == 4 * (3 * entries + 1005)
    on_disk = _kge(graph, strategy={**servers, "shard_dir": "/tmp/shards"})
    needed, how = estimate(on_disk, 4)
    assert needed == 0 and "on disk in strategy.shard_dir" in how


def test_a_kge_job_is_refused_only_when_its_tables_do_not_fit(
    graph: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _kge(graph, strategy={"type": "data_parallel", "num_replicas": 2})
    needed, _ = estimate(job, 2)
    monkeypatch.setattr(memory, "available_memory", lambda: needed + 1)
    check_memory(job, 2)  # fits: not refused
    monkeypatch.setattr(memory, "available_memory", lambda: needed - 1)
    with pytest.raises(ShoalError) as refused:
        check_memory(job, 2)
    assert "2 processes x (task tables (entity 1,000 x 100, relation 5 x 100)" in str(refused.value)
    assert "or strategy parameter_server with shard_dir: tables on disk" in str(refused.value)
    check_memory(job, 2, force=True)


def test_the_row_state_counted_is_the_servers_own() -> None:
    meta = lambda *shape: torch.empty(*shape, device="meta")  # noqa: E731
    for kind, config in (
        ("sgd", RowSGDConfig()),
        ("adagrad", RowAdagradConfig()),
        ("lazy_adam", LazyAdamConfig()),
    ):
        state = build_row_optimizer(config).new_state(7, 12, meta)
        assert sum(t.numel() for t in state.values()) == 7 * memory.ROW_STATE[kind](12), kind


def test_a_tsv_graph_is_estimated_once_prepared(tmp_path: Path) -> None:
    paths = write_tsv(GRAPH, tmp_path)
    job = kge_job(Path("runs"), {"train": str(paths["train"])}, task={"dim": 100})
    assert estimate(load_config(job), 1) == (0, "")  # not prepared yet: not estimated
    prepared_for({"train": paths["train"]}, PrepareProgress(), 60.0, True)
    needed, how = estimate(load_config(job), 1)
    assert needed > 0 and "task tables (entity" in how


def test_a_kge_job_larger_than_the_machine_is_refused_before_any_worker(
    graph: Path, tmp_path: Path
) -> None:
    job = kge_job(tmp_path / "runs", {"prepared": str(graph)}, task={"dim": 10_000_000})
    job["strategy"] = {"type": "data_parallel", "num_replicas": 2}
    job["run"]["name"] = "big"
    (tmp_path / "job.toml").write_text(tomli_w.dumps(job))
    done = run_shoal("train", "job.toml", cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("the job needs about 402.0 GB of memory before its first step"), line
    assert not (tmp_path / "runs" / "big").exists()


def test_classification_files_are_estimated_from_their_size(tmp_path: Path) -> None:
    """A CSV (plain or gzip) by its text, an NPZ by its arrays uncompressed; the MLP from
    the header's features (3) and at least 2 classes."""
    text = "a,b,c,label\n" + "0.5,1.5,2.5,1\n" * 1000
    (tmp_path / "d.csv").write_text(text)
    (tmp_path / "d.csv.gz").write_bytes(gzip.compress(text.encode()))
    np.savez_compressed(tmp_path / "d.npz", x=np.zeros((100, 3)), y=np.zeros(100, dtype=np.int64))
    with zipfile.ZipFile(tmp_path / "d.npz") as archive:
        arrays = sum(info.file_size for info in archive.infolist())
    model = 4 * 4 * ((3 + 1) * 16 + (16 + 1) * 16 + (16 + 1) * 2)  # sgd with momentum: 4 copies
    for name, held in (
        ("d.csv", 10 * len(text)),
        ("d.csv.gz", 10 * len(text)),
        ("d.npz", 2 * arrays),
    ):
        data = {"source": "file", "path": str(tmp_path / name)}
        needed, how = estimate(load_config(small_job(Path("runs"), task={"data": data})), 1)
        assert needed == held + model, name
        assert how.startswith("(task.data: "), how
