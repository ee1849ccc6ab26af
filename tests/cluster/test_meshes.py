"""Model-parallel meshes across hosts: tensor groups inside a host, whatever the rank numbers.

`srun --distribution=cyclic` deals the ranks over the nodes in turn: ranks 0, 2 on
host 0 and 1, 3 on host 1. A `{ data = 2, tensor = 2 }` mesh in rank order would put
both tensor groups ({0, 1}, {2, 3}) across the hosts; laid out by host it puts them
inside ({0, 2}, {1, 3}) and the data dimension across. The job must still train
what one process trains (the layouts compute the same sums in another order).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import shoal
from shoal.monitor.metrics import read_metrics
from tests.cluster.jobs import start_slurm
from tests.cluster.netns import Cluster
from tests.strategies.spmd.test_equivalence import STEPS, assert_same, final_model
from tests.tasks.lm.helpers import lm_job, write_text


@pytest.mark.slow
def test_data2xtensor2_on_cyclic_hosts_keeps_tensor_groups_inside_hosts_and_equals_local(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    text = write_text(tmp_path)
    local = shoal.train(
        lm_job(tmp_path / "runs", text, train={"max_steps": STEPS}, run={"name": "local"})
    )
    strategy = {"type": "hybrid", "mesh": {"data": 2, "tensor": 2}}
    job = lm_job(tmp_path / "runs", text, strategy=strategy, train={"max_steps": STEPS})
    cluster = make_cluster(2)
    run = start_slurm(cluster, job, tmp_path, "mesh", cyclic=True).wait()
    results = run.check()
    assert results["world_size"] == 4 and results["steps"] == STEPS
    h0, h1 = cluster.hosts
    log = run.log(0)
    assert f"hosts: {h0.name} ({h0.address}): ranks 0, 2; {h1.name} ({h1.address}): ranks 1, 3" in log  # fmt: skip
    assert (
        f"mesh placed by host: data groups 0,1 on {h0.name}+{h1.name}, 2,3 on "
        f"{h0.name}+{h1.name}; tensor groups 0,2 on {h0.name}, 1,3 on {h1.name}"
    ) in log
    assert "this rank at data 0, tensor 1" in run.log(2)  # rank 2 is the mesh's point (0, 1)
    (record,) = [r for r in read_metrics(Path(results["run_dir"]) / "metrics.jsonl") if r["event"] == "placement"]  # fmt: skip
    assert record["order"] == [0, 2, 1, 3] and record["spanning"] == []
    assert [g["hosts"] for g in record["groups"]["tensor"]] == [[h0.name], [h1.name]]
    assert_same(final_model(local), final_model(results), atol=2e-5)
    assert results["valid"]["loss"] == pytest.approx(local["valid"]["loss"], abs=1e-4)
