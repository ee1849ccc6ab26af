"""Every aggregation method end to end through `shoal.train`.

Exact methods: 3 workers reproduce one process (to 1e-6), and each rank's bytes
on the wire are what the algorithm sends. Compression: top-k at 1% reaches the
dense model's accuracy within twice its steps; its per-rank state (residuals,
DGC momentum) is checkpointed, so a crashed and resumed run is bit-identical.
Gossip trains and logs its consensus distance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import shoal
from shoal.monitor.metrics import read_metrics
from tests.conftest import data_parallel, final_state, small_job

PARAMS = 499  # the small_job MLP: 10 -> 16 -> 16 -> 3
BUCKET_BYTES = PARAMS * 4


def _aggregation(workers: int, **aggregation: Any) -> dict[str, Any]:
    return {**data_parallel(workers), "aggregation": aggregation}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    results = shoal.train(small_job(tmp_path_factory.mktemp("reference")))
    return final_state(results)["model"]


# rank 0's bytes per step for 3 workers and one bucket of 499 gradient floats plus the step's
# agreement (a flag and a stop signal per rank: 6 floats), 505 in all, counted by hand:
# ring: 2 reduce-scatter + 2 all-gather chunks of 169/168 floats; tree (3 = 2 + 1 extra):
# one swap with rank 1 and the result to rank 2; hierarchical, groups {0, 1} {2}: a ring of
# the two leaders (a chunk each way) and the broadcast to rank 1; parameter server, servers
# 0 and 1 of slices 253/252: push 252 to server 1, pull 253 to ranks 1 and 2.
SUMMED = BUCKET_BYTES + 2 * 3 * 4
EXACT = {
    "ring": ({"method": "ring"}, (169 + 168 + 168 + 169) * 4),
    "tree": ({"method": "tree"}, 2 * SUMMED),
    "hierarchical": (
        {"method": "hierarchical", "branching_factor": 2},
        (253 + 252) * 4 + SUMMED,
    ),
    "parameter_server": (
        {"method": "parameter_server", "num_servers": 2},
        (252 + 2 * 253) * 4,
    ),
}


@pytest.mark.parametrize("method", sorted(EXACT))
def test_exact_methods_reproduce_one_process(
    runs: Path, one_process: dict[str, torch.Tensor], method: str
) -> None:
    aggregation, sent = EXACT[method]
    results = shoal.train(small_job(runs, strategy=_aggregation(3, **aggregation)))
    state = final_state(results)["model"]
    for name, value in one_process.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=1e-6, msg=name)
    assert results["sent_bytes_per_step"] == sent
    assert results["gradient_bytes_per_step"] == BUCKET_BYTES
    assert method in results["strategy_detail"]


TASK = {
    "type": "classification",
    "data": {
        "source": "synthetic",
        "samples": 3000,
        "features": 16,
        "informative": 6,
        "classes": 4,
        "seed": 1,
    },
    "model": {"hidden": [32, 32]},  # 1732 parameters: 1% is 18 of them per step
}


def test_topk_at_one_percent_reaches_dense_accuracy(runs: Path) -> None:
    """Dense SGD (momentum 0.9) for 3 epochs (114 steps) sets the accuracy; top-k keeping 1%
    of the gradient, with error feedback and DGC's momentum correction, reaches it within
    one point in at most twice the steps, sending 1/12 of the dense volume."""
    train = {"batch_size": 64, "optimizer": {"kind": "sgd", "lr": 0.1, "momentum": 0.9}}
    dense = shoal.train(small_job(runs, task=TASK, train={**train, "epochs": 3}))
    topk = {"kind": "topk", "ratio": 0.01, "momentum_correction": 0.9}
    sparse = shoal.train(
        small_job(
            runs,
            task=TASK,
            strategy=_aggregation(2, method="ring", compression=topk),
            train={**train, "epochs": 6, "optimizer": {"kind": "sgd", "lr": 0.1}},
        )
    )
    assert sparse["steps"] == 2 * dense["steps"] == 228
    assert sparse["valid"]["accuracy"] >= dense["valid"]["accuracy"] - 0.01
    # a ring all-gather of 18 (index, value) pairs from the other rank: 144 bytes, not 6928
    assert sparse["sent_bytes_per_step"] == 18 * 8
    records = read_metrics(Path(sparse["run_dir"]) / "metrics.jsonl")
    assert all(r["sent_bytes_per_step"] == 144 for r in records if r["event"] == "train")


def test_powersgd_trains_over_the_tree(runs: Path) -> None:
    """PowerSGD on real layouts (matrices compressed, biases not), over a p2p method."""
    powersgd = {"kind": "powersgd", "rank": 2}
    results = shoal.train(
        small_job(runs, strategy=_aggregation(2, method="tree", compression=powersgd))
    )
    assert results["valid"]["accuracy"] > 0.5  # chance is 1/3
    # P and Q of the 16x10, 16x16 and 3x16 weights at rank 2, r (rows + cols) floats each
    # (every one smaller than its matrix), and the three biases uncompressed, in two rounds
    # of a two-rank tree (one swap each)
    sent = (2 * (16 + 10) + 2 * (16 + 16) + 2 * (3 + 16) + 16 + 16 + 3) * 4
    assert results["sent_bytes_per_step"] == sent < BUCKET_BYTES


def test_resume_with_compression_state_is_bit_identical(runs: Path) -> None:
    """Residuals and DGC momentum are per rank: every rank's is in the checkpoint."""
    topk = {"kind": "topk", "ratio": 0.05, "momentum_correction": 0.9}
    common = {
        "strategy": _aggregation(2, method="ring", compression=topk),
        "train": {"epochs": 3, "optimizer": {"kind": "sgd", "lr": 0.1}},
        "checkpoint": {"every_steps": 5},
    }
    full = shoal.train(small_job(runs, **common, run={"name": "full"}))
    with pytest.raises(shoal.errors.JobFailed, match="injected fault at step 23"):
        shoal.train(
            small_job(
                runs, **common, run={"name": "broken"}, faults={"inject": {"rank": 1, "step": 23}}
            )
        )
    resumed = shoal.train(resume=runs / "broken")
    assert resumed["steps"] == full["steps"] == 39
    a, b = final_state(resumed), final_state(full)
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    residuals = b["strategy"]["ranks"]
    assert len(residuals) == 2 and set(residuals[0]) == {"0.momentum", "0.accumulated"}
    assert not torch.equal(residuals[0]["0.accumulated"], residuals[1]["0.accumulated"])


def test_gossip_trains_and_logs_the_consensus_distance(runs: Path) -> None:
    results = shoal.train(
        small_job(runs, strategy=_aggregation(3, method="gossip", topology="ring"))
    )
    assert results["valid"]["accuracy"] > 0.5
    # each rank sends its parameters to its two neighbours every step
    assert results["sent_bytes_per_step"] == 2 * BUCKET_BYTES
    records = read_metrics(Path(results["run_dir"]) / "metrics.jsonl")
    distances = [r["consensus_distance"] for r in records if r["event"] == "train"]
    assert distances and all(0 < d < 1 for d in distances)
    replicas = final_state(results)["strategy"]["ranks"]
    assert len(replicas) == 3 and not torch.equal(
        replicas[0]["replica.0"], replicas[1]["replica.0"]
    )
