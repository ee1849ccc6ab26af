"""`[task] type = "module"`: the user's own model under every strategy, as it trains locally.

Hugging Face models built from tiny random configs (nothing downloaded): a Llama and a
GPT-2 on tinyshakespeare's bytes, a ResNet on scikit-learn's digits, and a model of the
user's own with dict batches, an IterableDataset and its own loss. Each strategy's
training losses, step by step, equal the local run's (relative 1e-4: the sums run in
another order over ranks and shards).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import tomli_w
import torch

import shoal
from shoal.checkpoint.sharded import plain_model_state
from shoal.cli.main import main
from shoal.monitor.metrics import read_metrics
from tests.conftest import final_state

FACTORIES = Path(__file__).resolve().parent
STEPS = 3


def module_job(
    runs: Path, name: str, factory: str, strategy: dict[str, Any], **task: Any
) -> dict[str, Any]:
    return {
        "task": {"type": "module", "factory": factory, "import_dir": str(FACTORIES), **task},
        "strategy": strategy,
        "train": {
            "max_steps": STEPS,
            "batch_size": 8,
            "seed": 3,
            "shuffle": True,
            "optimizer": {"kind": "adamw", "lr": 3e-3},
        },
        "checkpoint": {"every_epochs": 0},
        "run": {"dir": str(runs), "name": name},
        "monitor": {"progress": "off", "log_every_steps": 1},
    }


def losses(results: dict[str, Any]) -> list[float]:
    records = read_metrics(Path(results["run_dir"]) / "metrics.jsonl")
    return [r["loss"] for r in records if r["event"] == "train"]


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The local run of each factory, trained once for the module's comparisons."""
    runs = tmp_path_factory.mktemp("local")
    done: dict[str, dict[str, Any]] = {}

    def run(factory: str, **task: Any) -> dict[str, Any]:
        key = json.dumps([factory, task], sort_keys=True)
        if key not in done:
            job = module_job(runs, f"local-{len(done)}", factory, {"type": "local"}, **task)
            done[key] = shoal.train(job)
        return done[key]

    return run


CASES = [
    ("hf_models:llama", {"type": "data_parallel", "num_replicas": 2}),
    ("hf_models:llama", {"type": "fully_sharded", "degree": 2}),
    ("hf_models:llama", {"type": "tensor_parallel", "degree": 2}),
    ("hf_models:llama", {"type": "pipeline", "stages": 2, "schedule": "gpipe", "microbatches": 2}),
    ("hf_models:llama", {"type": "hybrid", "mesh": {"data": 2, "tensor": 2}}),
    ("hf_models:gpt2", {"type": "tensor_parallel", "degree": 2}),
    ("hf_models:gpt2", {"type": "pipeline", "stages": 2, "schedule": "1f1b", "microbatches": 2}),
    ("hf_models:gpt2", {"type": "fully_sharded", "degree": 2}),
    ("hf_models:vit", {"type": "data_parallel", "num_replicas": 2}),
    ("hf_models:vit", {"type": "fully_sharded", "degree": 2}),
    ("hf_models:two_tower", {"type": "data_parallel", "num_replicas": 2}),
]


@pytest.mark.parametrize(
    ("factory", "strategy"),
    [
        # hybrid: 4 ranks, 7 s, with the slow checks (hybrid meshes: tests/strategies/spmd)
        pytest.param(
            f,
            s,
            id=f"{f.split(':')[1]}-{s['type']}",
            marks=[pytest.mark.slow] * (s["type"] == "hybrid"),
        )
        for f, s in CASES
    ],
)
def test_a_user_model_trains_under_a_strategy_as_it_does_locally(
    runs: Path, local: Any, factory: str, strategy: dict[str, Any]
) -> None:
    reference = local(factory)
    results = shoal.train(module_job(runs, strategy["type"], factory, strategy))
    ours, theirs = losses(results), losses(reference)
    assert len(ours) == len(theirs) == STEPS
    assert ours == pytest.approx(theirs, rel=1e-4), (ours, theirs)


def test_a_user_loss_with_dict_batches_and_an_iterable_dataset_trains(runs: Path) -> None:
    """The two-tower model: dict samples from an IterableDataset (read once, indexed), the
    user's loss and metric; the validation figures are the loss per sample and the metric,
    and 64 steps lower the loss (batches of 8 are noisy: means of 16 steps compared)."""
    job = module_job(runs, "two-tower", "hf_models:two_tower", {"type": "local"})
    job["train"].update(max_steps=64, optimizer={"kind": "adamw", "lr": 1e-2})
    results = shoal.train(job)
    assert results["data"] == {"train_samples": 512, "valid_samples": 128}
    valid = results["valid"]
    assert set(valid) == {"loss", "sign_agreement"}
    assert 0.0 <= valid["sign_agreement"] <= 1.0 and valid["loss"] > 0
    trained = losses(results)
    assert sum(trained[-16:]) < 0.5 * sum(trained[:16]), trained


def held_mib(run: Path, rank: int) -> float:
    """The MiB of parameters `rank` logged holding once its model was ready."""
    log = (run / "logs" / f"rank-{rank}.log").read_text()
    found = re.search(r"model ready: ([\d.]+) MiB of parameters on this rank", log)
    assert found is not None, log
    return float(found.group(1))


def test_a_pipeline_rank_holds_only_its_stages_started_from_local_values(
    runs: Path, local: Any
) -> None:
    """Each rank builds the model on the meta device and gives values to its own stages
    only (about half the model's parameters here, not all of them); the stages start from
    the values local builds for the seed and train as local does, and the checkpoint holds
    the whole model under the full model's names (each rank its pieces, gathered by one
    reader), equal to local's after the same steps."""
    reference_run = local("hf_models:llama")
    reference = final_state(reference_run)["model"]
    strategy = {"type": "pipeline", "stages": 2, "schedule": "gpipe", "microbatches": 2}
    job = module_job(runs, "pipe-layout", "hf_models:llama", strategy)
    job["checkpoint"] = {"at_end": True}
    results = shoal.train(job)
    folder = Path(results["checkpoint"])
    saved = plain_model_state(folder, torch.load(folder / "state.pt", weights_only=True)["model"])
    assert saved.keys() == reference.keys()
    for name, value in reference.items():
        torch.testing.assert_close(saved[name], value, rtol=0, atol=1e-5, msg=name)
    whole = held_mib(Path(reference_run["run_dir"]), 0)
    halves = [held_mib(Path(results["run_dir"]), rank) for rank in (0, 1)]
    assert all(0 < half < 0.65 * whole for half in halves), (halves, whole)


BAD = [
    (
        "a factory that does not import",
        'factory = "no_such_module:build"',
        "",
        r"task\.factory: no_such_module:build: cannot import 'no_such_module'",
    ),
    (
        "a factory that returns something else",
        'factory = "hf_models:Windows"\noptions = { tokens = [1, 2, 3], length = 2 }',
        "",
        r"task\.factory: hf_models:Windows: returned a Windows; return a dict with 'model'",
    ),
    (
        "a plan pattern that matches no module",
        'factory = "hf_models:llama"',
        '[strategy]\ntype = "tensor_parallel"\n[strategy.plan]\n"model.layers.*.attn.q" = "colwise"',
        r"strategy\.plan\.model\.layers\.\*\.attn\.q: names no module of LlamaForCausalLM; "
        r"nearest: model\.layers\.",
    ),
    (
        "a split point that does not exist",
        'factory = "hf_models:llama"',
        '[strategy]\ntype = "pipeline"\nsplit_points = ["model.layers.9"]',
        r"strategy\.split_points: 'model\.layers\.9' is not a block of the model; its blocks "
        r"are model\.layers\.0 \.\. model\.layers\.3",
    ),
    (
        "a tensor degree the heads do not divide",
        'factory = "hf_models:llama"',
        '[strategy]\ntype = "tensor_parallel"\ndegree = 3',
        r"strategy\.degree: a tensor degree of 3 does not divide the model's "
        r"num_attention_heads \(4\)",
    ),
    (
        "a pipeline of a model whose head is tied to its embedding",
        'factory = "hf_models:llama"\noptions = { tied = true }',
        '[strategy]\ntype = "pipeline"\nstages = 2',
        r"strategy\.stages: the factory's model ties its head to its input embedding, which a "
        r"pipeline puts on its last and first stages; untie them",
    ),
    (
        "a pipeline of a model that is no causal LM",
        'factory = "hf_models:resnet"',
        '[strategy]\ntype = "pipeline"',
        r"strategy\.type: strategy pipeline needs a task that can cut its model into pipeline "
        r"stages: the factory's loss is cross_entropy",
    ),
]


@pytest.mark.parametrize(
    ("task", "strategy", "expected"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_bad_user_model_input_is_one_line_at_validate(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    task: str,
    strategy: str,
    expected: str,
) -> None:
    text = (
        f'[task]\ntype = "module"\nimport_dir = "{FACTORIES}"\n{task}\n\n'
        "[train]\nmax_steps = 2\nbatch_size = 8\n\n" + strategy + "\n"
    )
    validates_to_one_line(tmp_path, monkeypatch, capsys, text, expected)


def validates_to_one_line(
    folder: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    text: str,
    expected: str,
) -> None:
    """`shoal config validate` of `text` exits 2 with one line matching `expected`."""
    (folder / "job.toml").write_text(text)
    monkeypatch.chdir(folder)
    assert main(["config", "validate", "job.toml"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert re.match(r"job\.toml:\d+: " + expected, lines[0]), lines[0]


def test_a_loss_that_returns_no_scalar_stops_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job = module_job(tmp_path / "runs", "broken", "hf_models:broken_loss", {"type": "local"})
    (tmp_path / "job.toml").write_text(tomli_w.dumps(job))
    monkeypatch.chdir(tmp_path)
    assert main(["train", "job.toml"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith(
        "task.factory hf_models:broken_loss: the loss returned a "
        "summed_loss of shape (8,); return a scalar tensor"
    ), lines


@pytest.mark.parametrize("method", ["ring", "tree", "hierarchical", "parameter_server"])
def test_every_exact_aggregation_trains_a_user_model_as_locally(
    runs: Path, local: Any, method: str
) -> None:
    strategy = {"type": "data_parallel", "num_replicas": 2, "aggregation": {"method": method}}
    results = shoal.train(module_job(runs, method, "hf_models:two_tower", strategy))
    assert losses(results) == pytest.approx(losses(local("hf_models:two_tower")), rel=1e-4)


@pytest.mark.parametrize(
    "strategy",
    [
        {
            "type": "data_parallel",
            "num_replicas": 2,
            "aggregation": {"method": "native", "compression": {"kind": "topk", "ratio": 0.5}},
        },
        {"type": "federated", "num_clients": 4, "workers": 2, "rounds": 2, "local_steps": 2},
        {
            "type": "population_based",
            "population_size": 2,
            "workers": 2,
            "ready_interval": 2,
            "search_space": {"lr": {"kind": "log", "low": 1e-3, "high": 1e-2}},
        },
    ],
    ids=["topk", "federated", "population"],
)
def test_a_user_model_trains_under_the_strategies_that_change_the_update(
    runs: Path, strategy: dict[str, Any]
) -> None:
    """Compression, FedAvg and a population train something else than one process does:
    the user's model and loss train under them to their end, with validation figures."""
    job = module_job(runs, strategy["type"], "hf_models:two_tower", strategy)
    if strategy["type"] == "federated":
        del job["train"]["max_steps"]
    results = shoal.train(job)
    assert results["status"] == "completed"
    assert results["valid"]["loss"] > 0
