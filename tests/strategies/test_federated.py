"""Federated runs through shoal's launcher: equivalences, dropouts, privacy, resume.

The backbone is an equivalence: FedAvg over all clients with one local step of
full-batch SGD is centralized full-batch SGD (the weighted mean of the clients'
gradient steps is the step on the whole data), on 1 and on 2 workers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import shoal
from shoal.checkpoint.manager import list_checkpoints
from shoal.errors import JobFailed
from shoal.monitor.metrics import read_metrics
from shoal.tasks.classification.config import SyntheticDataConfig
from shoal.tasks.classification.data import make_synthetic
from tests.conftest import final_state, run_shoal, small_job

SGD = {"kind": "sgd", "lr": 0.5}


def fed_job(runs: Path, train: dict[str, Any] | None = None, **strategy: Any) -> dict[str, Any]:
    """small_job's data and model (400 training samples) under the federated strategy."""
    job = small_job(
        runs,
        strategy={"type": "federated", "num_clients": 4, "workers": 1, "rounds": 3, **strategy},
        train={"batch_size": 16, "optimizer": SGD, **(train or {})},
    )
    del job["train"]["epochs"]
    return job


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=atol, msg=name)


def _rounds(results: dict[str, Any]) -> list[dict[str, Any]]:
    records = read_metrics(Path(results["run_dir"]) / "metrics.jsonl")
    return [r for r in records if r["event"] == "round"]


@pytest.fixture(scope="module")
def centralized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """Five steps of full-batch SGD on all 400 training samples, in one process."""
    runs = tmp_path_factory.mktemp("central")
    job = small_job(
        runs, train={"epochs": 5, "batch_size": 400, "shuffle": False, "optimizer": SGD}
    )
    return final_state(shoal.train(job))["model"]


@pytest.mark.parametrize("workers", [1, 2])
def test_fedavg_one_full_batch_step_equals_centralized_sgd(
    runs: Path, centralized: dict[str, torch.Tensor], workers: int
) -> None:
    federated = fed_job(runs, train={"batch_size": 400}, rounds=5, local_steps=1, workers=workers)
    results = shoal.train(federated)
    assert results["world_size"] == workers and results["rounds"] == 5
    _close(final_state(results)["model"], centralized)
    rounds = _rounds(results)
    assert [r["participants"] for r in rounds] == [4] * 5
    assert all(r["client_bytes_up"] > 0 and r["update_norm"] > 0 for r in rounds)


def test_fedprox_with_mu_zero_is_fedavg(runs: Path) -> None:
    skewed = {"kind": "dirichlet", "alpha": 0.3}
    fedavg = shoal.train(fed_job(runs, partition=skewed, local_epochs=2))
    prox0 = shoal.train(
        fed_job(
            runs, partition=skewed, local_epochs=2, aggregation={"method": "fedprox", "mu": 0.0}
        )
    )
    prox = shoal.train(
        fed_job(
            runs, partition=skewed, local_epochs=2, aggregation={"method": "fedprox", "mu": 1.0}
        )
    )
    _close(final_state(prox0)["model"], final_state(fedavg)["model"], atol=0)
    drift = {
        name: float(
            (final_state(prox)["model"][name] - final_state(fedavg)["model"][name]).abs().max()
        )
        for name in final_state(fedavg)["model"]
    }
    assert max(drift.values()) > 1e-3, "mu > 0 changes the local objective"


def test_a_failing_client_is_dropped_and_the_round_goes_on(runs: Path) -> None:
    results = shoal.train(
        fed_job(runs, workers=2, min_clients=3, inject=[{"client": 2, "round": 1}])
    )
    assert results["status"] == "completed" and results["dropped_clients"] == 1
    rounds = _rounds(results)
    assert [r["participants"] for r in rounds] == [4, 3, 4]
    assert rounds[1]["dropped_failed"] == [2] and rounds[1]["clients"] == [0, 1, 3]
    log = (Path(results["run_dir"]) / "logs" / "rank-0.log").read_text()
    assert "round 1: client 2 dropped (failed): InjectedClientFault" in log


def test_a_stalled_client_is_dropped_at_the_round_deadline(runs: Path) -> None:
    """Client 3 (the last on its worker) stalls past the deadline; the others take ~0.1 s."""
    results = shoal.train(
        fed_job(
            runs,
            workers=2,
            rounds=3,
            round_timeout_s=5.0,
            inject=[{"client": 3, "round": 1, "kind": "stall"}],
        )
    )
    rounds = _rounds(results)
    assert [r["participants"] for r in rounds] == [4, 3, 4]
    assert rounds[1]["dropped_timed_out"] == [3] and rounds[1]["clients"] == [0, 1, 2]


def test_too_few_clients_fail_the_run_with_a_clear_message(tmp_path: Path) -> None:
    job = fed_job(
        tmp_path / "runs",
        workers=2,
        min_clients=3,
        inject=[{"client": 1, "round": 1}, {"client": 2, "round": 1}],
    )
    with pytest.raises(JobFailed, match="round 1: only 2 of 4 selected clients reported"):
        shoal.train({**job, "strategy": {**job["strategy"], "workers": 1}})
    import tomli_w

    (tmp_path / "job.toml").write_text(tomli_w.dumps(job))
    done = run_shoal("train", "job.toml", cwd=tmp_path, timeout=120)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[:-1] == [
        "shoal: WARNING: round 1: client 2 dropped (failed): InjectedClientFault: "
        "injected fault in client 2"
    ], "rank 0 (hosting clients 0 and 2) warns of its dropped client"
    assert lines[-1:] == [
        "round 1: only 2 of 4 selected clients reported, fewer than strategy.min_clients = 3 "
        "(failed: clients [1, 2]); see the workers' logs for each client's error"
    ]


def test_secure_aggregation_gives_the_plain_result(runs: Path) -> None:
    plain = shoal.train(fed_job(runs, workers=2, partition={"kind": "dirichlet", "alpha": 0.5}))
    masked = shoal.train(
        fed_job(
            runs,
            workers=2,
            partition={"kind": "dirichlet", "alpha": 0.5},
            privacy={"secure_aggregation": True},
        )
    )
    _close(final_state(masked)["model"], final_state(plain)["model"], atol=1e-5)
    assert masked["valid"]["accuracy"] == pytest.approx(plain["valid"]["accuracy"], abs=0.01)


def _training_rows() -> np.ndarray:
    data = small_job(Path("."))["task"]["data"]
    synthetic = make_synthetic(SyntheticDataConfig(**data))
    return synthetic.train.features.numpy()  # type: ignore[union-attr]


def _contains_row(payload: np.ndarray, rows: np.ndarray) -> bool:
    """Whether any row of `rows` appears as a contiguous run of values in `payload`."""
    flat = payload.astype(np.float32).reshape(-1)
    width = rows.shape[1]
    if flat.size < width:
        return False
    windows = np.lib.stride_tricks.sliding_window_view(flat, width)
    row_set = {row.tobytes() for row in rows.astype(np.float32)}
    return any(window.tobytes() in row_set for window in windows)


def test_the_detector_finds_a_sample_when_there_is_one() -> None:
    rows = _training_rows()
    assert _contains_row(np.concatenate([np.zeros(7), rows[17], np.ones(3)]), rows)
    assert not _contains_row(np.concatenate([np.zeros(7), rows[17][:-1], np.ones(3)]), rows)


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "secure"])
def test_no_training_sample_crosses_the_wire(runs: Path, secure: bool) -> None:
    """Every tensor a worker sent or received is recorded: only updates, flags and keys."""
    results = shoal.train(
        fed_job(runs, workers=2, audit_wire=True, privacy={"secure_aggregation": secure})
    )
    rows = _training_rows()
    params = sum(t.numel() for t in final_state(results)["model"].values())
    allowed = {
        # 4 report flags, 4 run counts, 2 workers' busy seconds and client counts, and 6
        # round statistics
        "round_status": (torch.float64, 4 + 4 + 2 * 2 + 6),
        # 2 workers' seconds in 5 phases of the round and peak memory (training/meter.py)
        "round_phases": (torch.float64, 2 * (5 + 1)),
        "model_update": (torch.int64, params + 1),  # exact fixed point (federated/exact.py)
        "masked_model_update": (torch.int64, params + 1),
        "public_keys": (torch.uint8, 4 * 256),
        "stop_request": (torch.int32, 2),  # each worker's stop signal, after every round
    }
    seen = set()
    for rank in (0, 1):
        records = torch.load(
            Path(results["run_dir"]) / "logs" / f"wire-rank-{rank}.pt", weights_only=True
        )
        assert records, "the audit saw the traffic"
        for record in records:
            dtype, numel = allowed[record["what"]]
            tensor = record["tensor"]
            assert (tensor.dtype, tensor.numel()) == (dtype, numel), record["what"]
            if tensor.is_floating_point():
                assert not _contains_row(tensor.numpy(), rows), f"a sample in {record['what']}"
            elif record["what"] == "model_update":  # fixed point x 2^k: at any scale
                values = tensor.double().numpy()
                for k in range(-64, 128):
                    assert not _contains_row(np.ldexp(values, -k), rows), f"a sample at 2^{k}"
            seen.add(record["what"])
    update = "masked_model_update" if secure else "model_update"
    expected = {"round_status", update, "round_phases", "stop_request"} | (
        {"public_keys"} if secure else set()
    )
    assert seen == expected
    rounds = _rounds(results)
    sent = rounds[-1]["wire_bytes_sent_per_worker"]
    # the third round's record is written before its stop agreement: two of 2 x 4 bytes
    assert sent == 3 * (18 * 8 + (params + 1) * 8 + 12 * 8) + (1024 if secure else 0) + 2 * 2 * 4


def test_differential_privacy_clips_noises_and_reports(runs: Path) -> None:
    results = shoal.train(
        fed_job(
            runs,
            workers=2,
            privacy={
                "secure_aggregation": True,
                "differential": {"clip_norm": 0.05, "noise_multiplier": 0.5},
            },
        )
    )
    for record in _rounds(results):
        assert record["dp_noise_multiplier"] == 0.5
        assert record["dp_noise_std"] == pytest.approx(0.5 * 0.05 / 4)
        assert record["dp_clipped"] == 4  # lr 0.5 moves each client further than 0.05
        # ||mean of 4 clipped updates + noise|| <= 0.05 + about 0.0125 * sqrt(values)
        assert record["update_norm"] < 0.05 + 4 * 0.0125 * 23


def test_files_partition_and_tags_from_the_data_spec(runs: Path, tmp_path: Path) -> None:
    """Each client's own CSV; by_capability picks the clients whose file entry is tagged."""
    rows = np.random.default_rng(0).standard_normal((120, 3)).astype(np.float32)
    labels = (rows[:, 0] > 0).astype(int)
    clients = []
    for client in range(3):
        path = tmp_path / f"client-{client}.csv"
        part = slice(client * 40, (client + 1) * 40)
        lines = ["a,b,c,label"] + [
            f"{x[0]},{x[1]},{x[2]},{y}" for x, y in zip(rows[part], labels[part], strict=True)
        ]
        path.write_text("\n".join(lines) + "\n")
        clients.append({"path": str(path), "tags": ["eu"] if client != 1 else []})
    holdout = tmp_path / "valid.csv"
    holdout.write_text("a,b,c,label\n1,0,0,1\n-1,0,0,0\n2,1,1,1\n-2,1,1,0\n")
    job = fed_job(
        runs,
        num_clients=3,
        workers=2,
        partition={"kind": "files", "clients": clients},
        client_selection={"method": "by_capability", "required_tags": ["eu"]},
    )
    job["task"]["data"] = {"source": "file", "path": str(holdout), "valid_path": str(holdout)}
    results = shoal.train(job)
    assert [r["clients"] for r in _rounds(results)] == [[0, 2]] * 3
    assert results["valid"]["accuracy"] >= 0.75


def test_resume_at_a_round_boundary_is_bit_identical(runs: Path) -> None:
    common = fed_job(
        runs,
        workers=2,
        rounds=5,
        aggregation={"method": "fedyogi", "server_lr": 0.05},
        client_selection={"method": "random", "fraction": 0.5},
        partition={"kind": "dirichlet", "alpha": 0.5},
        train={"optimizer": {"kind": "sgd", "lr": 0.1, "momentum": 0.9}},
    )
    common["task"]["model"]["dropout"] = 0.2
    common["checkpoint"] = {"every_steps": 2}
    full = shoal.train({**common, "run": {**common["run"], "name": "full"}})
    with pytest.raises(JobFailed, match="injected fault at step 3"):
        shoal.train(
            {
                **common,
                "run": {**common["run"], "name": "broken"},
                "faults": {"inject": {"rank": 1, "step": 3}},
            }
        )
    broken = runs / "broken"
    assert [p.name for p in list_checkpoints(broken / "checkpoints")] == ["step-00000002"]
    resumed = shoal.train(resume=broken)
    assert resumed["rounds"] == full["rounds"] == 5
    a, b = final_state(resumed), final_state(full)
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    assert torch.equal(a["server"]["v"], b["server"]["v"])
    assert resumed["valid"] == full["valid"]
    rounds = [json.loads(line) for line in (broken / "metrics.jsonl").read_text().splitlines()]
    # rounds 1-3 ran, the crash came before round 4, the resume repeated round 3
    assert [r["round"] for r in rounds if r["event"] == "round"] == [1, 2, 3, 3, 4, 5]


def test_balanced_and_dynamic_assignments_give_the_static_model_bit_for_bit(runs: Path) -> None:
    """A label-skewed partition (client sizes differ several-fold) on 2 workers, one of them
    computing 10x slower: whoever runs which client, every selected client trains exactly
    once per round and the global model is the same bits as the static assignment's, and
    as one worker's (the clients' updates are summed exactly). Dynamically, the slowed
    worker takes fewer clients. (A client trains in a few ms here, as long as a queue's
    store round trip: at 3x the slowed worker took as many clients in one run of 3
    rounds; at 10x its first client outlasts the others' whole round.)"""
    skewed = {"kind": "dirichlet", "alpha": 0.3, "min_samples": 8}
    slow = {"inject": {"rank": 1, "step": 0, "kind": "slow", "factor": 10.0}}

    def job(workers: int, balance: str) -> dict[str, Any]:
        sections = fed_job(
            runs, num_clients=6, workers=workers, rounds=3, partition=skewed, balance=balance
        )
        return {**sections, "faults": slow} if workers > 1 else sections

    results = {
        "one worker": shoal.train(job(1, "static")),
        **{balance: shoal.train(job(2, balance)) for balance in ("static", "balanced", "dynamic")},
    }
    models = {name: final_state(r)["model"] for name, r in results.items()}
    for name, model in models.items():
        for key in model:
            assert torch.equal(model[key], models["static"][key]), (name, key)
    for name, r in results.items():
        rounds = _rounds(r)
        assert [sorted(rec["clients"]) for rec in rounds] == [list(range(6))] * 3, name
    dynamic = _rounds(results["dynamic"])
    assert all(sum(rec["worker_clients"]) == 6 for rec in dynamic)
    fast, slowed = (sum(rec["worker_clients"][w] for rec in dynamic) for w in (0, 1))
    assert slowed < fast
    _assert_the_waiting_worker_waited(_rounds(results["static"]))


def _assert_the_waiting_worker_waited(rounds: list[dict[str, Any]]) -> None:
    """Each worker's round in phases (training/meter.py's RankPhases): its clients' steps
    and the round's communication wait, where the worker that ran its clients sooner
    waits for the other; with the rest of the round, a worker's phases are its round.
    `round_s` is rank 0's round; rank 1's starts and ends on its own clock, apart from
    rank 0's by what rank 0 alone does between rounds (logging) and by the load."""
    phases = ("data", "forward_backward", "comm", "optimizer", "other")
    uneven = 0
    for rec in rounds:
        for w in (0, 1):
            spent = sum(rec[f"rank{w}_{p}_s"] for p in phases)
            if w == 0:
                assert spent == pytest.approx(rec["round_s"], rel=1e-9), rec
            else:
                assert spent == pytest.approx(rec["round_s"], rel=0.5), rec
            assert rec[f"rank{w}_forward_backward_s"] > 0
        busy = rec["worker_busy_s"]
        sooner, later = (0, 1) if busy[0] < busy[1] else (1, 0)
        if busy[later] > 1.5 * busy[sooner]:
            uneven += 1
            assert rec[f"rank{sooner}_comm_s"] > rec[f"rank{later}_comm_s"], rec
    assert uneven, "the slowed worker's rounds took longer"


def test_a_batch_norm_model_trains(runs: Path, tmp_path: Path) -> None:
    """The metric names are learnt from one sample: in evaluation mode, where BatchNorm
    takes a batch of one (in training mode it raised 'Expected more than 1 value per
    channel' before the first round)."""
    (tmp_path / "bn_fed.py").write_text(
        "import torch\n"
        "from torch import nn\n"
        "def build():\n"
        "    g = torch.Generator().manual_seed(0)\n"
        "    x = torch.randn(240, 6, generator=g)\n"
        "    y = (x[:, 0] > 0).long()\n"
        "    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))\n"
        "    return {'model': model, 'train': (x[:200], y[:200]), 'valid': (x[200:], y[200:])}\n"
    )
    job = fed_job(runs, rounds=6)
    job["task"] = {
        "type": "classification",
        "data": {"source": "python", "factory": "bn_fed:build", "import_dir": str(tmp_path)},
    }
    results = shoal.train(job)
    assert results["status"] == "completed" and results["steps"] == 6
    assert final_state(results)["model"]["1.num_batches_tracked"].item() > 0
    assert results["valid"]["accuracy"] > 0.8
