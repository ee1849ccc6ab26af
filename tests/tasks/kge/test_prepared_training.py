"""Training from prepared graphs: bit-identical to training from the TSV files, evaluation
by sampled ranking, a worker reading only its share, and a synthetic graph that a model
learns."""

from __future__ import annotations

import ctypes
import mmap
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import shoal
from shoal.config import load_config
from shoal.tasks.kge.config import PreparedDataConfig
from shoal.tasks.kge.synthetic import SyntheticGraph, write_prepared, write_tsv
from shoal.tasks.kge.training_types import build_training_type
from shoal.tasks.kge.triples import load_kg
from tests.conftest import final_state, run_shoal
from tests.tasks.kge.planted import random_mrr
from tests.tasks.kge.test_training import kge_job

SMALL = SyntheticGraph(entities=120, relations=6, triples=3000, clusters=6, held_out=0.03, seed=2)


@pytest.fixture(scope="module")
def tsv(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    paths = write_tsv(SMALL, tmp_path_factory.mktemp("synthetic"))
    return {name: str(path) for name, path in paths.items()}


def test_tsv_and_its_prepared_folder_train_bit_identically(
    runs: Path, tsv: dict[str, str], tmp_path: Path
) -> None:
    folder = tmp_path / "graph"
    args = ["kge", "prepare", str(folder), "--train", tsv["train"], "--valid", tsv["valid"]]
    done = run_shoal(*args, "--test", tsv["test"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(
        rf"{folder}: 120 entities, 6 relations, train \d+, valid \d+, test \d+ triples; "
        r"prepared in [\d.]+ s \([\d,]+ triples/s\)\n",
        done.stdout,
    )
    sections: dict[str, Any] = {
        "task": {"negatives": {"num_negatives": 8, "chunk_size": 8, "distribution": "degree"}},
        "train": {"epochs": 2, "eval_every_epochs": 1},
    }
    from_tsv = shoal.train(kge_job(runs, tsv, **sections))
    from_folder = shoal.train(kge_job(runs, {"prepared": str(folder)}, **sections))
    a, b = final_state(from_tsv)["model"], final_state(from_folder)["model"]
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert from_tsv["test"] == from_folder["test"] and from_tsv["data"] == from_folder["data"]


def test_sampled_ranking_over_every_entity_reports_the_full_metrics(
    runs: Path, tsv: dict[str, str]
) -> None:
    sections: dict[str, Any] = {"train": {"epochs": 1, "eval_every_epochs": 1}}
    full = shoal.train(kge_job(runs, tsv, **sections))
    every = {"ranking": "sampled", "sampled_negatives": SMALL.entities}
    sampled = shoal.train(kge_job(runs, tsv, task={"evaluation": every}, **sections))
    assert sampled["test"] == full["test"]
    few = {"ranking": "sampled", "sampled_negatives": 5}
    fewer = shoal.train(kge_job(runs, tsv, task={"evaluation": few}, **sections))
    assert fewer["test"]["mrr"] > full["test"]["mrr"]  # 5 rivals, not 119


def _resident_pages(path: Path) -> int:
    """Pages of `path` in the page cache (mincore(2) over a mapping that touches none)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    with open(path, "rb") as handle:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, handle.fileno(), 0)
        assert address not in (None, ctypes.c_void_p(-1).value)
        try:
            vector = ctypes.create_string_buffer(pages)
            assert libc.mincore(address, size, vector) == 0
            return sum(byte & 1 for byte in vector.raw)
        finally:
            libc.munmap(address, size)


def _evict(path: Path) -> None:
    """Drop the file's (clean) pages from the page cache: as if it had never been read."""
    with open(path, "rb") as handle:
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise and mincore")
def test_a_batch_reads_its_own_triples_only(tmp_path: Path, runs: Path) -> None:
    """A worker maps the training triples (24 MB, 5,860 pages here) and a batch of 32
    random triples reads their pages from disk, not the file: at most two pages a row
    (one may straddle a page boundary), no read-around."""
    graph = SyntheticGraph(entities=50_000, relations=20, triples=1_000_000, seed=5)
    write_prepared(graph, tmp_path / "g")
    data = load_kg(PreparedDataConfig(prepared=str(tmp_path / "g")))
    train_file = tmp_path / "g" / "train.npy"
    _evict(train_file)
    if _resident_pages(train_file) > 1:
        pytest.skip("this file system keeps evicted pages cached")
    task_config = load_config(kge_job(runs, {"prepared": str(tmp_path / "g")})).task
    training = build_training_type(task_config, data, seed=0)  # type: ignore[arg-type]
    assert _resident_pages(train_file) <= 1  # the degrees come from their own file
    indices = torch.from_numpy(np.random.default_rng(0).choice(len(data.train), 32, replace=False))
    batch = training.batch(indices, torch.device("cpu"))
    read = _resident_pages(train_file)
    assert 32 <= read <= 2 * 32 + 1, read
    assert torch.equal(batch["triples"], torch.from_numpy(np.load(train_file)[indices.numpy()]))


def test_a_synthetic_graph_is_learnable(runs: Path, tmp_path: Path) -> None:
    """A random ranking of 120 entities has MRR 0.045; DistMult learns the cluster structure."""
    write_prepared(SMALL, tmp_path / "g")
    results = shoal.train(
        kge_job(
            runs, {"prepared": str(tmp_path / "g")}, train={"epochs": 15, "eval_every_epochs": 0}
        )
    )
    assert results["test"]["mrr"] > 3 * random_mrr(SMALL.entities)
