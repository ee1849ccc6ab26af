"""shoal on a CUDA device: the same jobs train on the GPU as on the CPU.

Skipped where no GPU exists (CI). The rest of the suite runs on the CPU with the GPUs
hidden (conftest.GPU_ENV); these tests start `shoal train` in processes that see them,
as a user does. One worker per GPU is all NCCL allows, so on one GPU the NCCL paths run
in a world of one (data_parallel with one replica: every collective of the step still
goes through NCCL, where a CPU tensor would be refused).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from shoal.monitor.metrics import read_metrics
from tests.conftest import GPU_ENV, run_shoal, small_job
from tests.cuda.helpers import (
    GPUS,
    assert_close_models,
    final_model,
    joined,
    named,
    needs_gpu,
    results_of,
    train,
)
from tests.tasks.kge.planted import random_mrr, write_planted_graph
from tests.tasks.kge.test_training import kge_job
from tests.tasks.lm.helpers import VERSE, lm_job, write_text

pytestmark = needs_gpu


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_text(tmp_path_factory.mktemp("cuda-text"))


@pytest.fixture(scope="module")
def lm_runs(tmp_path_factory: pytest.TempPathFactory, text: Path) -> dict[str, dict[str, Any]]:
    """The tiny lm for 6 steps (AdamW, weight decay, clipping that bites) on the CPU, on
    the GPU, and on the GPU under data_parallel with one NCCL replica."""
    runs = tmp_path_factory.mktemp("cuda-lm")
    out = {}
    for name, device, strategy in (
        ("cpu", "cpu", {"type": "local"}),
        ("cuda", "cuda", {"type": "local"}),
        ("nccl", "cuda", {"type": "data_parallel", "num_replicas": 1}),
    ):
        job = named(
            lm_job(runs, text, strategy=strategy, monitor={"log_every_steps": 1}), name, device
        )
        train(job)
        out[name] = results_of(job)
    return out


def test_lm_trains_on_the_gpu_as_on_the_cpu(lm_runs: dict[str, dict[str, Any]]) -> None:
    cpu, cuda = lm_runs["cpu"], lm_runs["cuda"]
    assert cuda["steps"] == cpu["steps"] == 6
    assert_close_models(final_model(cpu), final_model(cuda), atol=1e-4)
    assert cuda["valid"]["loss"] == pytest.approx(cpu["valid"]["loss"], abs=1e-4)
    norms = {
        name: [
            r["grad_norm"]
            for r in read_metrics(Path(r["run_dir"]) / "metrics.jsonl")
            if r["event"] == "train"
        ]
        for name, r in lm_runs.items()
    }
    assert norms["cuda"] == pytest.approx(norms["cpu"], rel=1e-4)
    # the GPU's peak is the allocator's (bytes the model, its gradients and AdamW hold at
    # least), not the process's resident set
    peak = cuda["ranks"]["peak_memory_mb"][0]
    params = sum(t.numel() for t in final_model(cuda).values())
    assert 4 * 4 * params / 2**20 <= peak < 200, peak


def test_data_parallel_runs_its_collectives_through_nccl(
    lm_runs: dict[str, dict[str, Any]],
) -> None:
    nccl, cuda = lm_runs["nccl"], lm_runs["cuda"]
    assert "rank 0 of 1 joined (nccl on cuda:0)" in joined(nccl)
    assert nccl["world_size"] == 1 and nccl["steps"] == 6
    assert_close_models(final_model(cuda), final_model(nccl), atol=1e-6)
    assert nccl["valid"]["loss"] == pytest.approx(cuda["valid"]["loss"], abs=1e-6)


def test_a_gpu_checkpoint_generates_on_a_machine_without_one(
    lm_runs: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    args = ["generate", lm_runs["cuda"]["run_dir"], "--prompt", "To be", "--tokens", "20"]
    done = run_shoal(*args, "--seed", "1", cwd=tmp_path, env={"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("To be") and set(done.stdout) <= set(VERSE)


def test_resume_on_the_gpu_is_exact(tmp_path: Path, text: Path) -> None:
    """Dropout draws from the GPU's generator: its state travels in the checkpoint."""
    common = {
        "train": {"max_steps": 12, "warmup_steps": 3, "lr_decay": "cosine"},
        "task": {"model": {"dim": 32, "heads": 4, "layers": 2, "context": 16, "dropout": 0.1}},
        "checkpoint": {"every_steps": 5},
    }
    runs = tmp_path / "runs"
    full = named(lm_job(runs, text, **common), "full", "cuda")
    train(full)
    cut = named(lm_job(runs, text, **common), "cut", "cuda")
    cut["faults"] = {"inject": {"rank": 0, "step": 8}}
    crashed = train(cut, ok=False)
    assert crashed.returncode != 0 and "injected fault at step 8" in crashed.stderr
    done = run_shoal("train", "--resume", str(runs / "cut"), cwd=runs, env=GPU_ENV, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    resumed, whole = results_of(cut), results_of(full)
    assert resumed["steps"] == 12
    a, b = final_model(resumed), final_model(whole)
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed run ends bit-identical"
    assert resumed["valid"] == whole["valid"]


@pytest.mark.parametrize(
    "precision",
    [{"mixed_precision": "bf16"}, {"mixed_precision": "fp16", "on_nonfinite": "skip_step"}],
)
def test_mixed_precision_trains_on_the_gpu(
    precision: dict[str, str], tmp_path: Path, text: Path
) -> None:
    job = named(
        lm_job(
            tmp_path / "runs",
            text,
            train={"max_steps": 40, "epochs": 100, **precision},
            monitor={"log_every_steps": 1},
        ),
        precision["mixed_precision"],
        "cuda",
    )
    train(job)
    results = results_of(job)
    losses = [
        r["loss"]
        for r in read_metrics(Path(results["run_dir"]) / "metrics.jsonl")
        if r["event"] == "train"
    ]
    assert len(losses) == 40 and all(loss == loss for loss in losses)
    assert sum(losses[-5:]) / 5 < losses[0] - 1.0, losses


def test_kge_learns_the_planted_structure_on_the_gpu(tmp_path: Path) -> None:
    """As tests/tasks/kge/test_training.py on the CPU: 3x a random ranking's MRR. Not the
    CPU's parameters: Adam (lr 0.05) turns the devices' different rounding into different
    paths (TransE, 10 epochs: entries up to 0.64 apart on an H100)."""
    graph = {k: str(v) for k, v in write_planted_graph(tmp_path).items()}
    run = {"dir": str(tmp_path / "runs"), "name": "kge", "device": "cuda"}
    job = kge_job(tmp_path / "runs", graph, run=run)
    train(job)
    results = results_of(job)
    assert results["test"]["mrr"] > 3 * random_mrr(results["data"]["entities"])
    assert results["test"]["hits@10"] > 0.6


def test_auto_trains_more_workers_than_gpus_on_the_cpu_and_cuda_refuses(tmp_path: Path) -> None:
    workers = GPUS + 1
    job = named(
        small_job(tmp_path / "runs", strategy={"type": "data_parallel", "num_replicas": workers}),
        "auto",
        "auto",
    )
    done = train(job)
    assert f'run.device = "auto": {workers} workers on this host but {GPUS} GPU' in done.stdout
    assert f"rank 0 of {workers} joined (gloo on cpu)" in joined(results_of(job))
    insist = named(dict(job), "insist", "cuda")
    refused = train(insist, ok=False)
    assert refused.returncode != 0
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "run.device: " in lines[0], refused.stderr
    assert f"{workers} workers on this host need a GPU each but only {GPUS} exist" in lines[0]
