"""Whole parameter-server jobs (`shoal.train`, real processes): equivalence with one process,
staleness under a straggler, failures that end the job with a name, resume with re-sharding,
the worker memory bound, and every model and sampling scheme."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import shoal
from shoal.config import load_config
from shoal.errors import ConfigError, JobFailed, ShoalError
from shoal.launch.external import _membership
from shoal.launch.plan import JobPlan, fit_plan
from shoal.run import RunPaths
from shoal.shape.sizing import shape_of
from shoal.strategies.parameter_server.shards import SHARD_GLOB
from tests.conftest import final_state
from tests.hostile.jobs import TORCHRUN, finish, start_torchrun
from tests.recovery.chaos import events
from tests.tasks.kge.planted import random_mrr, write_planted_graph
from tests.tasks.kge.test_training import kge_job

SGD = {"kind": "sgd", "lr": 0.5}


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    paths = write_planted_graph(tmp_path_factory.mktemp("planted"))
    return {name: str(path) for name, path in paths.items()}


def ps(**fields: Any) -> dict[str, Any]:
    return {
        "type": "parameter_server",
        "num_workers": 2,
        "num_servers": 2,
        "optimizer": SGD,
        "barrier_timeout_s": 20.0,
        **fields,
    }


def job(runs: Path, graph: dict[str, str], name: str, **sections: Any) -> dict[str, Any]:
    """A short TransE job: 2 epochs, SGD, one evaluation at the end, a final checkpoint."""
    base: dict[str, Any] = {
        "task": {"model": {"type": "transe", "p": 2}, "loss": {"kind": "margin_ranking"}},
        "train": {"epochs": 2, "optimizer": SGD, "eval_every_epochs": 0},
        "run": {"name": name},
        "faults": {"timeout_s": 60.0, "heartbeat_timeout_s": 60.0},
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return kge_job(runs, graph, **base)


def ps_tables(results: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The full tables, put together from the servers' shard files of the final checkpoint."""
    tables: dict[str, dict[int, torch.Tensor]] = {"entity": {}, "relation": {}}
    for file in sorted(Path(results["checkpoint"]).glob(SHARD_GLOB)):
        state = torch.load(file, weights_only=True)
        for name, rows in tables.items():
            for i, row in zip(state[f"{name}.ids"].tolist(), state[f"{name}.rows"], strict=True):
                assert i not in rows, f"{name} row {i} is in two shards"
                rows[i] = row
    return {name: torch.stack([rows[i] for i in sorted(rows)]) for name, rows in tables.items()}


DROP_LAST = {"drop_last": True}
#: server optimizer -> (local optimizer, local task settings) that it must reproduce
EQUIVALENT: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "sgd": (SGD, {}, SGD),
    "lazy_adam": (
        {"kind": "sparse_adam", "lr": 0.01},
        {"sparse_gradients": True},
        {"kind": "lazy_adam", "lr": 0.01},
    ),
}


@pytest.fixture(scope="module")
def local_runs(
    tmp_path_factory: pytest.TempPathFactory, graph: dict[str, str]
) -> dict[str, dict[str, Any]]:
    runs = tmp_path_factory.mktemp("local")
    return {
        name: shoal.train(
            job(runs, graph, name, train={**DROP_LAST, "optimizer": local}, task=task)
        )
        for name, (local, task, _) in EQUIVALENT.items()
    }


@pytest.mark.parametrize(
    ("optimizer", "placement"),
    [("sgd", "dedicated"), ("sgd", "colocated"), ("lazy_adam", "dedicated")],
)
def test_sync_reproduces_one_process(
    runs: Path,
    graph: dict[str, str],
    local_runs: dict[str, dict[str, Any]],
    optimizer: str,
    placement: str,
) -> None:
    """2 workers x 2 servers in sync mode == `local` on the same global batches: SGD, and
    the servers' lazy Adam == torch's SparseAdam on sparse row gradients.

    drop_last: a short last batch would split into shares that chunked negative sampling
    keys differently from the whole batch (as under data_parallel)."""
    local = local_runs[optimizer]
    _, _, server_optimizer = EQUIVALENT[optimizer]
    strategy = ps(placement=placement, optimizer=server_optimizer)
    served = shoal.train(job(runs, graph, "ps", strategy=strategy, train=DROP_LAST))
    assert served["steps"] == local["steps"] == 12
    model = final_state(local)["model"]
    tables = ps_tables(served)
    torch.testing.assert_close(tables["entity"], model["entity.weight"], rtol=0, atol=1e-5)
    torch.testing.assert_close(tables["relation"], model["relation.weight"], rtol=0, atol=1e-5)
    assert served["valid"]["mrr"] == pytest.approx(local["valid"]["mrr"], abs=1e-4)
    stats = served["parameter_server"]
    assert stats["pushes"] == 2 * 2 * served["steps"]  # every worker, every server, every step
    assert stats["staleness_histogram"] == {"0": stats["staleness_histogram"]["0"]}


def test_bounded_staleness_holds_with_a_straggler(runs: Path, graph: dict[str, str]) -> None:
    """Worker 2 sleeps before every step: the others run ahead, at most max_staleness."""
    results = shoal.train(
        job(
            runs,
            graph,
            "bounded",
            strategy=ps(num_workers=3, num_servers=1, mode="bounded", max_staleness=1),
            faults={"inject": {"rank": 2, "step": 0, "kind": "slow", "delay_s": 0.05}},
            monitor={"log_every_steps": 1000},
        )
    )
    histogram = {int(k): v for k, v in results["parameter_server"]["staleness_histogram"].items()}
    assert max(histogram) == 1  # the bound was reached and never exceeded
    assert results["parameter_server"]["server_held_s"][0] > 0  # pulls were held for it


def test_sync_times_out_naming_the_stalled_worker(runs: Path, graph: dict[str, str]) -> None:
    started = time.monotonic()
    with pytest.raises(ShoalError) as failure:
        shoal.train(
            job(
                runs,
                graph,
                "stalled",
                strategy=ps(barrier_timeout_s=2.0),
                faults={"inject": {"rank": 1, "step": 3, "kind": "hang"}},
            )
        )
    text = str(failure.value)
    assert "worker 1 (at clock 3)" in text and "barrier_timeout_s = 2" in text, text
    assert time.monotonic() - started < 40


@pytest.mark.parametrize(
    ("rank", "who"),
    [(3, r"rank 3 \(server 1\)"), (1, r"rank 1 \(worker 1\)")],
    ids=["server", "worker"],
)
def test_a_killed_process_ends_the_job_naming_it(
    runs: Path, graph: dict[str, str], rank: int, who: str
) -> None:
    started = time.monotonic()
    with pytest.raises(JobFailed, match=f"{who} exited with code 17"):
        shoal.train(
            job(
                runs,
                graph,
                f"killed-{rank}",
                strategy=ps(),
                faults={"inject": {"rank": rank, "step": 2, "kind": "exit"}},
            )
        )
    assert time.monotonic() - started < 40


def test_resume_with_more_servers_reshards_and_continues_exactly(
    runs: Path, graph: dict[str, str]
) -> None:
    full = shoal.train(job(runs, graph, "full", strategy=ps()))
    first = shoal.train(job(runs, graph, "first", strategy=ps(), train={"epochs": 1}))
    resumed = shoal.train(
        resume=Path(first["checkpoint"]),
        overrides=["train.epochs=2", "strategy.num_servers=3"],
    )
    assert resumed["steps"] == full["steps"]
    assert len(list(Path(resumed["checkpoint"]).glob(SHARD_GLOB))) == 3
    a, b = ps_tables(full), ps_tables(resumed)
    for name in a:  # bit for bit: a row's sum does not depend on which server holds it
        assert torch.equal(a[name], b[name]), name
    log = (Path(resumed["run_dir"]) / "logs" / "rank-2.log").read_text()
    assert "re-sharded from 2 servers to 3" in log


def test_a_table_larger_than_the_worker_budget_trains(runs: Path, graph: dict[str, str]) -> None:
    budget_mb = 0.07
    small = {"num_negatives": 2, "chunk_size": 2}
    results = shoal.train(
        job(
            runs,
            graph,
            "budget",
            task={"dim": 512, "negatives": small, "evaluation": {"batch_size": 8}},
            train={"batch_size": 4, "max_steps": 10, "epochs": 1},
            strategy=ps(worker_memory_budget_mb=budget_mb),
        )
    )
    table_bytes = 4 * 512 * (results["data"]["entities"] + results["data"]["relations"])
    peak = results["parameter_server"]["worker_peak_row_bytes"]
    assert 0 < peak <= budget_mb * (1 << 20) < table_bytes
    with pytest.raises(ShoalError, match=r"worker_memory_budget_mb = 0\.01"):
        shoal.train(
            job(
                runs,
                graph,
                "over-budget",
                task={"dim": 512, "negatives": small, "evaluation": {"batch_size": 8}},
                train={"batch_size": 4, "max_steps": 10, "epochs": 1},
                strategy=ps(worker_memory_budget_mb=0.01),
            )
        )


SCHEMES = {  # every model, each with another negative-sampling scheme and loss
    "transe": (
        {"type": "transe", "p": 1},
        {"chunk_size": 1, "side": "bernoulli"},
        "margin_ranking",
    ),
    "distmult": ({"type": "distmult"}, {"distribution": "degree"}, "softmax"),
    "complex": ({"type": "complex", "init_scale": 0.1}, {"side": "uniform"}, "softmax"),
    "rotate": ({"type": "rotate"}, {"chunk_size": 4}, "logistic"),
}


@pytest.mark.parametrize("model", sorted(SCHEMES))
def test_every_model_and_sampling_scheme_learns(
    runs: Path, graph: dict[str, str], model: str
) -> None:
    config, negatives, loss = SCHEMES[model]
    results = shoal.train(
        kge_job(
            runs,
            graph,
            task={
                "model": config,
                "negatives": {"num_negatives": 16, "chunk_size": 16, **negatives},
                "loss": {"kind": loss},
            },
            train={"epochs": 20, "eval_every_epochs": 0},
            strategy=ps(mode="async", num_servers=1, optimizer={"kind": "lazy_adam", "lr": 0.05}),
        )
    )
    assert results["test"]["mrr"] > 2 * random_mrr(results["data"]["entities"])


def test_sync_with_libkge_options_reproduces_one_process(runs: Path, graph: dict[str, str]) -> None:
    """Reciprocal relations (served: 2 x relations rows), negatives on both sides and weighted
    L3 regularization, all on rows a batch names: sync with 2 workers == local SGD."""
    task: dict[str, Any] = {
        "model": {"type": "distmult", "reciprocal": True},
        "negatives": {"num_negatives_s": 3, "num_negatives_o": 5, "chunk_size": 8},
        "loss": {"kind": "softmax"},
        "regularization": {"kind": "lp", "p": 3, "weight": 1e-3, "relation_weight": 1e-4},
    }
    local = shoal.train(job(runs, graph, "local-libkge", train=DROP_LAST, task=task))
    served = shoal.train(job(runs, graph, "ps-libkge", strategy=ps(), train=DROP_LAST, task=task))
    model, tables = final_state(local)["model"], ps_tables(served)
    assert tables["relation"].shape[0] == 2 * served["data"]["relations"]
    torch.testing.assert_close(tables["entity"], model["entity.weight"], rtol=0, atol=1e-5)
    torch.testing.assert_close(tables["relation"], model["relation.weight"], rtol=0, atol=1e-5)
    assert served["test"]["mrr"] == pytest.approx(local["test"]["mrr"], abs=1e-4)


@pytest.mark.parametrize(
    ("task", "message"),
    [
        ({"training": "1vsAll", "loss": {"kind": "softmax"}}, "training.type = '1vsAll'"),
        (
            {"training": {"type": "KvsAll"}, "loss": {"kind": "bce"}},
            "whole entity table each step",
        ),
        ({"regularization": {"kind": "l2", "weight": 0.1, "weighted": False}}, "weighted = true"),
    ],
)
def test_what_scores_every_row_is_refused_with_a_reason(
    runs: Path, graph: dict[str, str], task: dict[str, Any], message: str
) -> None:
    config = job(runs, graph, "refused", strategy=ps(), task=task)
    if "training" in task:
        del config["task"]["negatives"]
    with pytest.raises(ShoalError, match=message):
        shoal.train(config)


def test_fewer_chunks_than_workers_warn_once_and_train_as_one_worker(
    runs: Path, graph: dict[str, str]
) -> None:
    """A worker's share is whole chunks of the batch (negatives shared by a chunk stay those
    of one process): a batch of one chunk leaves the second worker without samples. Said
    in one warning, and the tables are those of one worker (sync: the idle worker pushes
    no rows)."""
    task = {"negatives": {"num_negatives": 16, "chunk_size": 32}}
    two = shoal.train(job(runs, graph, "one-chunk-2", task=task, strategy=ps()))
    one = shoal.train(job(runs, graph, "one-chunk-1", task=task, strategy=ps(num_workers=1)))
    log = (Path(two["run_dir"]) / "logs" / "rank-0.log").read_text()
    assert log.count("so 1 worker(s) train nothing in a step") == 1
    assert "chunk_size = 32: a batch of 32 (train.batch_size) is 1 chunk(s)" in log
    a, b = ps_tables(two), ps_tables(one)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_a_torchrun_restart_counts_workers_as_the_checkpoint_does(
    runs: Path, graph: dict[str, str]
) -> None:
    """Under torchrun a dedicated server is a rank but not a worker: started again with the
    job's 4 processes (2 workers, 2 servers), it resumes a checkpoint of 2 workers, which
    is no change of membership (no "grows back to 4 workers from 2")."""
    done = shoal.train(job(runs, graph, "torchrun-count", strategy=ps(placement="dedicated")))
    paths = RunPaths(Path(done["run_dir"]))
    config = load_config(paths.config)
    plan = SimpleNamespace(config=config, shape=shape_of(config))
    launch = SimpleNamespace(restart=1, agent_store=False)
    assert _membership(plan, launch, True, 4, paths, done["checkpoint"]) is None  # type: ignore[arg-type]
    assert not [e for e in events(paths.root) if e["event"] == "membership"]


@pytest.mark.parametrize(
    ("fields", "min_workers", "world", "expected"),
    [
        ({"num_workers": 3, "num_servers": 2}, 0, 4, {"workers": 2, "servers": 2}),
        ({"num_workers": 3, "num_servers": 2}, 2, 3, {"workers": 2, "servers": 1}),
        ({"num_workers": 2, "num_servers": 1}, 0, 5, {"workers": 4, "servers": 1}),
        (
            {"num_workers": 3, "num_servers": 3, "placement": "colocated"},
            0,
            2,
            {"workers": 2, "servers": 2},
        ),
    ],
    ids=["servers-stay", "min-workers-first", "grown", "colocated"],
)
def test_the_roles_fit_the_processes_torchrun_started(
    runs: Path,
    graph: dict[str, str],
    fields: dict[str, Any],
    min_workers: int,
    world: int,
    expected: dict[str, int],
) -> None:
    """A host lost (or back) under torchrun: the dedicated servers stay while enough ranks
    are left for faults.min_workers workers, workers fill the rest; colocated: every
    process a worker, no more servers than workers."""
    faults = {"min_workers": min_workers} if min_workers else {}
    config = load_config(job(runs, graph, "fit", strategy=ps(**fields), faults=faults))
    fitted, changed = fit_plan(JobPlan(config, shape_of(config), "fit"), world)
    assert changed and fitted.world_size == world
    assert fitted.shape.members == expected
    assert fit_plan(fitted, world)[1] is False  # fitted already


def test_too_few_processes_for_the_servers_is_one_line(runs: Path, graph: dict[str, str]) -> None:
    config = load_config(job(runs, graph, "few", strategy=ps(num_servers=2, min_servers=2)))
    with pytest.raises(ConfigError, match=r"needs strategy.min_servers \(2\) dedicated servers"):
        fit_plan(JobPlan(config, shape_of(config), "few"), 2)


def test_a_torchrun_restart_on_fewer_processes_goes_on_with_fewer_workers(
    runs: Path, graph: dict[str, str]
) -> None:
    """A checkpoint of 2 workers and 2 servers, torchrun started again on 3 processes (a host
    lost): the roles fit (1 worker, 2 servers) and the membership line counts workers."""
    strategy = ps(placement="dedicated")
    done = shoal.train(job(runs, graph, "torchrun-fewer", strategy=strategy))
    paths = RunPaths(Path(done["run_dir"]))
    config = load_config(paths.config, ["faults.min_workers=1"])
    plan, _ = fit_plan(JobPlan(config, shape_of(config), "fewer"), 3)
    launch = SimpleNamespace(restart=1, agent_store=False)
    line = _membership(plan, launch, True, 3, paths, done["checkpoint"])  # type: ignore[arg-type]
    assert line is not None and "goes on with 1 worker from 2 (faults.min_workers = 1)" in line, (
        line
    )
    [record] = [e for e in events(paths.root) if e["event"] == "membership"]
    assert (record["workers"], record["was"]) == (1, 2)


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun not installed next to this python")
def test_torchrun_on_fewer_processes_than_the_config_fits_the_roles(
    runs: Path, graph: dict[str, str], tmp_path: Path
) -> None:
    """The config describes 2 workers and 1 dedicated server, torchrun starts 2 processes:
    the job runs with 1 worker and 1 server, says so, and trains what shoal's own launcher
    trains with 1 worker and 1 server (the same tables, bit for bit)."""
    sections: dict[str, Any] = {"train": {"drop_last": True}}
    alone = shoal.train(
        job(runs, graph, "one", strategy=ps(num_workers=1, num_servers=1), **sections)
    )
    config = job(runs, graph, "fit", strategy=ps(num_workers=2, num_servers=1), **sections)
    code, _, err = finish(start_torchrun(tmp_path, config), timeout=240)
    assert code == 0, err[-3000:]
    log = (runs / "fit" / "logs" / "rank-0.log").read_text()
    assert (
        "the config describes 3 worker processes (2 workers, 1 server), torchrun started 2: "
        "the job runs on 2 (1 worker, 1 server)"
    ) in log
    results = json.loads((runs / "fit" / "results.json").read_text())
    assert results["steps"] == alone["steps"]
    a, b = ps_tables(results), ps_tables(alone)
    for name in a:
        assert torch.equal(a[name], b[name]), name
