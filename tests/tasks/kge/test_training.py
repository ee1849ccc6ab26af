"""Training the kge task end to end: quality on planted structure, data-parallel equivalence,
exact resume, the run's artifacts, and sparse row gradients."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import shoal
from shoal.checkpoint.manager import list_checkpoints
from shoal.errors import JobFailed, ShoalError
from tests.conftest import data_parallel, final_state, run_shoal
from tests.tasks.kge.planted import random_mrr, write_planted_graph

MODELS = {
    "transe": {"type": "transe", "p": 1},
    "distmult": {"type": "distmult"},
    "complex": {"type": "complex", "init_scale": 0.1},
    "rotate": {"type": "rotate"},
}


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    paths = write_planted_graph(tmp_path_factory.mktemp("planted"))
    return {name: str(path) for name, path in paths.items()}


def kge_job(runs: Path, data: dict[str, Any], **sections: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "task": {
            "type": "kge",
            "dim": 32,
            "model": {"type": "distmult"},
            "data": data,
            "negatives": {"num_negatives": 16, "chunk_size": 16},
            "loss": {"kind": "softmax"},
        },
        "train": {
            "epochs": 30,
            "batch_size": 32,
            "optimizer": {"kind": "adam", "lr": 0.05},
            "eval_every_epochs": 10,
        },
        "checkpoint": {"every_epochs": 0},
        "run": {"dir": str(runs)},
        "monitor": {"progress": "off"},
    }
    for name, value in sections.items():
        job[name] = {**job.get(name, {}), **value}
    return job


@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_model_learns_planted_structure(
    runs: Path, graph: dict[str, str], model: str
) -> None:
    """56 entities: a random ranking has MRR 0.08; each model must reach 3x that on test."""
    results = shoal.train(kge_job(runs, graph, task={"model": MODELS[model]}))
    assert results["test"]["mrr"] > 3 * random_mrr(results["data"]["entities"])
    assert results["test"]["hits@10"] > 0.6
    assert results["best"]["metric"] == "mrr"


@pytest.mark.skipif(
    importlib.util.find_spec("pykeen") is None, reason="needs shoal[datasets] (pykeen)"
)
def test_nations_reaches_a_high_filtered_mrr(runs: Path) -> None:
    """nations has 14 entities (random MRR 0.23); DistMult reaches about 0.75 in seconds."""
    job = kge_job(
        runs,
        {"name": "nations"},
        task={"dim": 64, "negatives": {"num_negatives": 32, "chunk_size": 32}},
        train={"batch_size": 128, "optimizer": {"kind": "adam", "lr": 0.01}},
    )
    results = shoal.train(job)
    assert results["data"]["entities"] == 14
    assert results["test"]["mrr"] > 0.6 and results["test"]["hits@3"] > 0.7


@pytest.mark.parametrize(
    ("workers", "micro"),
    [(2, 1), (3, 2)],
    ids=["2-workers", "3-workers-2-micro-batches"],
)
def test_data_parallel_reproduces_one_process(
    runs: Path, graph: dict[str, str], workers: int, micro: int
) -> None:
    """A chunk of 8 positives shares its negatives, keyed by the chunk's first sample, and a
    batch of 32 is split among workers and micro-batches in whole chunks (16 + 8 + 8 over 3
    workers, not 11 + 11 + 10), so N workers draw exactly what 1 process draws; gradients
    sum over workers: the same parameters."""
    sections: dict[str, Any] = {
        "task": {"model": MODELS["complex"], "negatives": {"num_negatives": 8, "chunk_size": 8}},
        "train": {"epochs": 3, "drop_last": True, "eval_every_epochs": 0},
    }
    local = shoal.train(kge_job(runs, graph, **sections))
    sections["train"]["micro_batches"] = micro
    spread = shoal.train(kge_job(runs, graph, strategy=data_parallel(workers), **sections))
    assert spread["world_size"] == workers and spread["steps"] == local["steps"] == 18
    a, b = final_state(local)["model"], final_state(spread)["model"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-5, msg=name)
    assert spread["valid"]["mrr"] == pytest.approx(local["valid"]["mrr"], abs=1e-6)


def test_crash_then_resume_is_bit_identical(runs: Path, graph: dict[str, str]) -> None:
    common: dict[str, Any] = {
        "train": {"epochs": 4, "eval_every_epochs": 2},
        "checkpoint": {"every_steps": 5},
        "monitor": {"progress": "off", "log_every_steps": 5},
    }
    full = shoal.train(kge_job(runs, graph, run={"name": "full"}, **common))
    with pytest.raises((JobFailed, RuntimeError), match="injected fault at step 17"):
        shoal.train(
            kge_job(
                runs,
                graph,
                run={"name": "broken"},
                faults={"inject": {"rank": 0, "step": 17}},
                **common,
            )
        )
    resumed = shoal.train(resume=runs / "broken")
    a, b = final_state(full), final_state(resumed)
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    assert resumed["test"] == full["test"] and resumed["best"]["step"] == full["best"]["step"]


def test_run_directory_holds_ids_best_checkpoint_and_embeddings(
    runs: Path, graph: dict[str, str]
) -> None:
    results = shoal.train(kge_job(runs, graph, task={"model": MODELS["rotate"]}))
    root = Path(results["run_dir"])
    folder = root / "embeddings"
    entities = [line.split("\t") for line in (folder / "entities.tsv").read_text().splitlines()]
    assert [int(i) for i, _ in entities] == list(range(len(entities))) == list(range(56))
    assert sorted(label for _, label in entities) == [label for _, label in entities]
    table = np.load(folder / "entity_embeddings.npy", allow_pickle=False)
    phases = np.load(folder / "relation_embeddings.npy", allow_pickle=False)
    assert table.shape == (56, 32) and phases.shape == (8, 16)
    info = json.loads((folder / "model.json").read_text())
    assert info["model"] == "rotate" and info["dim"] == 32
    # the exported tables are the best model's: the best checkpoint holds the same entity rows
    best = list_checkpoints(root / "best")
    assert len(best) == 1 and best[0].name == f"step-{results['best']['step']:08d}"
    state = torch.load(best[0] / "state.pt", weights_only=True)["model"]
    np.testing.assert_array_equal(state["entity.weight"].numpy(), table)
    assert results["data"]["test_triples"] == 25 and results["data"]["test_unseen_skipped"] == 0
    events = [
        json.loads(line)["event"] for line in (root / "metrics.jsonl").read_text().splitlines()
    ]
    assert "test" in events and "best" in events


def test_sparse_row_gradients_train(runs: Path, graph: dict[str, str]) -> None:
    results = shoal.train(
        kge_job(
            runs,
            graph,
            task={"sparse_gradients": True},
            train={"optimizer": {"kind": "sparse_adam", "lr": 0.05}},
        )
    )
    assert results["test"]["mrr"] > 3 * random_mrr(56)


def test_sparse_row_gradients_train_without_torch_warnings(
    runs: Path, graph: dict[str, str], tmp_path: Path
) -> None:
    """A fresh process (torch warns once per process): sparse Adagrad's first step warned
    that sparse invariant checks are "implicitly disabled" in every KGE run that used it."""
    import tomli_w

    job = kge_job(
        runs,
        graph,
        task={"sparse_gradients": True},
        train={"optimizer": {"kind": "adagrad", "lr": 0.05}, "max_steps": 4},
    )
    (tmp_path / "sparse.toml").write_text(tomli_w.dumps(job))
    done = run_shoal("train", "sparse.toml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "UserWarning" not in done.stderr, done.stderr


def test_sparse_training_keeps_the_sparse_invariant_checks_a_user_turned_on(
    runs: Path, graph: dict[str, str]
) -> None:
    """`local` trains in the caller's process: torch's switch is the caller's to keep."""
    torch.sparse.check_sparse_tensor_invariants.enable()
    try:
        job = kge_job(
            runs,
            graph,
            task={"sparse_gradients": True},
            train={"optimizer": {"kind": "adagrad", "lr": 0.05}, "max_steps": 2},
        )
        shoal.train(job)
        assert torch.sparse.check_sparse_tensor_invariants.is_enabled()
    finally:
        torch.sparse.check_sparse_tensor_invariants.disable()


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        (
            {"train": {"optimizer": {"kind": "adam"}}},
            "train.optimizer.kind = 'adam' cannot apply sparse",
        ),
        ({"strategy": data_parallel(2)}, "strategy 'data_parallel' reduces dense gradients"),
    ],
)
def test_sparse_gradients_need_a_row_wise_optimizer_and_one_process(
    runs: Path, graph: dict[str, str], sections: dict[str, Any], message: str
) -> None:
    job = kge_job(runs, graph, task={"sparse_gradients": True}, **sections)
    if "optimizer" not in sections.get("train", {}):
        job["train"]["optimizer"] = {"kind": "sparse_adam"}
    with pytest.raises(ShoalError, match=message):
        shoal.train(job)


#: each training type with the options it is meant for: (task settings, train settings)
TRAINING_TYPES: dict[str, dict[str, Any]] = {
    "negative_sampling": {
        "model": {"type": "transe", "p": 2, "reciprocal": True, "normalize_entities": False},
        "negatives": {"num_negatives_s": 4, "num_negatives_o": 8, "chunk_size": 8},
        "loss": {"kind": "bce"},
        "regularization": {"kind": "lp", "p": 3, "weight": 1e-3, "relation_weight": 1e-4},
    },
    "1vsAll": {
        "model": {"type": "distmult", "reciprocal": True},
        "training": "1vsAll",
        "regularization": {"kind": "l2", "weight": 1e-4, "weighted": False},
    },
    "KvsAll": {
        "model": {"type": "complex", "init": {"kind": "normal", "std": 0.1}},
        "training": {"type": "KvsAll", "label_smoothing": 0.1},
        "loss": {"kind": "bce"},
        "regularization": {"kind": "n3", "weight": 1e-3},
    },
}


@pytest.mark.parametrize("training", sorted(TRAINING_TYPES))
def test_every_training_type_under_data_parallel_reproduces_one_process(
    runs: Path, graph: dict[str, str], training: str
) -> None:
    """2 workers, each half of every global batch, the losses sums: the same parameters as one
    process, for negative sampling on both sides, 1vsAll and KvsAll (with their
    regularizations: weighted per use, or the whole tables once per step)."""
    task = {k: v for k, v in kge_job(runs, graph)["task"].items() if k != "negatives"}
    task.update(TRAINING_TYPES[training])
    sections: dict[str, Any] = {
        "train": {"epochs": 2, "drop_last": True, "eval_every_epochs": 0},
    }
    local = shoal.train({**kge_job(runs, graph, **sections), "task": task})
    spread = shoal.train(
        {**kge_job(runs, graph, strategy=data_parallel(2), **sections), "task": task}
    )
    assert spread["world_size"] == 2 and spread["steps"] == local["steps"] >= 8  # KvsAll: 8
    a, b = final_state(local)["model"], final_state(spread)["model"]
    for name in a:  # the sums run in another order: float32 rounding, relative to the value
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=2e-5, msg=name)
    assert spread["test"]["mrr"] == pytest.approx(local["test"]["mrr"], abs=1e-6)


def test_plateau_lowers_the_rate_and_resumes_exactly(runs: Path, graph: dict[str, str]) -> None:
    """lr_decay = plateau with patience 0: every evaluation that does not beat the best by
    50% halves the rate. A run broken after a reduction and resumed ends bit-identical, with
    the same learning rates, to one that never stopped (the plateau state is in the
    checkpoint)."""
    common: dict[str, Any] = {
        "task": {"model": {"type": "distmult", "entity_dropout": 0.1}},
        "train": {
            "epochs": 6,
            "eval_every_epochs": 1,
            "lr_decay": "plateau",
            "plateau": {"factor": 0.5, "patience": 0, "threshold": 0.5},
        },
        "checkpoint": {"every_steps": 5},
        "monitor": {"progress": "off", "log_every_steps": 5},
    }
    full = shoal.train(kge_job(runs, graph, run={"name": "full"}, **common))
    with pytest.raises((JobFailed, RuntimeError), match="injected fault at step 33"):
        shoal.train(
            kge_job(
                runs,
                graph,
                run={"name": "broken"},
                faults={"inject": {"rank": 0, "step": 33}},
                **common,
            )
        )
    resumed = shoal.train(resume=runs / "broken")

    def rates(results: dict[str, Any]) -> list[float]:
        lines = (Path(results["run_dir"]) / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line)["lr"] for line in lines if '"event": "train"' in line]

    assert rates(full)[0] == 0.05 and rates(full)[-1] < 0.05 / 2  # lowered at least twice
    assert rates(resumed)[-1] == rates(full)[-1]
    a, b = final_state(full), final_state(resumed)
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    assert resumed["test"] == full["test"]
