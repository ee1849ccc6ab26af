"""The four FB15k-237 examples train on the GPU as on the CPU, at the same seed.

Each example runs its first epoch (RotatE, whose CPU epoch takes minutes even on many
cores, its first 40 steps) once with run.device = "cpu" and once with "cuda", and the two
runs are compared. The batches and negatives are the same on both (drawn on the CPU), so
TransE and RotatE, which draw nothing else, follow the same path up to the devices'
rounding: the loss of every logged step agrees within 1%. DistMult and ComplEx drop
entries of their rows out with masks drawn from the device's own generator, different
on a GPU: their runs are the same recipe, not the same path, so their mean loss over the
second half of the epoch and their test MRR are compared instead.

Skipped without a GPU (CI) and where FB15k-237 is not beside the repository.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from shoal.monitor.metrics import read_metrics
from tests.conftest import GPU_ENV, run_shoal
from tests.cuda.helpers import needs_gpu

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: model -> (overrides of the example's length and logging, whether its path is the CPU's)
RUNS: dict[str, tuple[list[str], bool]] = {
    "transe": (["train.epochs=1", "monitor.log_every_steps=100"], True),
    "distmult": (["train.epochs=1", "monitor.log_every_steps=10"], False),
    "complex": (["train.epochs=1", "monitor.log_every_steps=10"], False),
    "rotate": (["train.max_steps=40", "monitor.log_every_steps=4"], True),
}

pytestmark = needs_gpu


def _data_missing(example: Path) -> str | None:
    """FB15k-237 lives beside the repository (../shared/datasets), not in it."""
    data = tomllib.loads(example.read_text())["task"]["data"]
    train = (example.parent / data["train"]).resolve()
    return None if train.exists() else f"FB15k-237 not on this machine: {train}"


def _train(example: Path, runs: Path, name: str, device: str, length: list[str]) -> dict[str, Any]:
    overrides = [
        *length,
        f"run.device={device}",
        f"run.dir={runs}",
        f"run.name={name}",
        "monitor.progress=off",
        "checkpoint.every_steps=0",
        "checkpoint.at_end=false",
        "checkpoint.keep_best=false",
        "task.evaluation.max_triples=2000",
    ]
    args = [arg for override in overrides for arg in ("--set", override)]
    done = run_shoal("train", str(example), *args, cwd=runs, env=GPU_ENV, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    records = read_metrics(runs / name / "metrics.jsonl")
    losses = [r["loss"] for r in records if r["event"] == "train"]
    tests = [r for r in records if r["event"] == "test"]
    return {"losses": losses, "test": tests[-1] if tests else {}}


@pytest.mark.parametrize("model", list(RUNS))
def test_example_trains_on_the_gpu_as_on_the_cpu(model: str, tmp_path: Path) -> None:
    example = EXAMPLES / f"kge-fb15k237-{model}.toml"
    missing = _data_missing(example)
    if missing:
        pytest.skip(missing)
    length, same_path = RUNS[model]
    cpu = _train(example, tmp_path, "cpu", "cpu", length)
    cuda = _train(example, tmp_path, "cuda", "cuda", length)
    assert len(cuda["losses"]) == len(cpu["losses"]) >= 10
    if same_path:
        assert cuda["losses"] == pytest.approx(cpu["losses"], rel=1e-2)
        tolerance = 0.005
    else:
        half = len(cpu["losses"]) // 2
        mean = {d: sum(r["losses"][half:]) / (len(r["losses"]) - half) for d, r in (
            ("cpu", cpu), ("cuda", cuda))}  # fmt: skip
        assert mean["cuda"] == pytest.approx(mean["cpu"], rel=0.03)
        tolerance = 0.01
    assert cuda["test"]["mrr"] == pytest.approx(cpu["test"]["mrr"], abs=tolerance)
