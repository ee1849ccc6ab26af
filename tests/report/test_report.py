"""`shoal report` of real runs of four strategies: every panel drawn from data, runs overlaid,
a running job's files, TensorBoard's event files, and the figures the runs now record."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import shoal
from shoal.errors import ShoalError
from shoal.monitor.metrics import read_metrics
from shoal.report import write_report
from tests.conftest import run_shoal
from tests.report.page import PageReader, read_page
from tests.report.runs import JOBS

#: the panels every run's page has (issue 16, item 1), each with data
COMMON = ("summary", "loss", "metrics", "throughput", "time", "bytes", "config")
OWN = {"dp": (), "ps": ("parameter_server",), "fed": ("federated",), "pop": ("population",)}


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    runs = tmp_path_factory.mktemp("runs")
    return {name: shoal.train(make(runs)) for name, make in JOBS.items()}


def _page(path: Path) -> PageReader:
    return read_page(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(JOBS))
def test_every_panel_of_a_run_has_data(
    finished: dict[str, dict[str, Any]], name: str, tmp_path: Path
) -> None:
    run_dir = Path(finished[name]["run_dir"])
    page = _page(write_report([run_dir], tmp_path / "report.html"))
    assert not page.links, "the page must open offline: no scripts, links or images"
    for panel in (*COMMON, *OWN[name]):
        assert panel in page.panels, f"{name}: no {panel} panel"
        content = page.panels[panel]
        if panel in ("summary", "config"):
            assert content.rows or content.text, f"{name}: {panel} is empty"
            continue
        assert content.svgs, f"{name}: {panel} has no chart"
        assert content.drawn, f"{name}: {panel}'s charts draw no data"
    assert "completed" in " ".join(page.panels["summary"].text)
    config = " ".join(page.panels["config"].text)
    assert f'type = "{finished[name]["strategy"]}"' in config
    others = {"parameter_server", "federated", "population", "model_parallel"} - set(OWN[name])
    assert not others & set(page.panels), f"{name}: another strategy's panel"


def test_data_parallel_has_gradient_norm_memory_and_time_per_rank(
    finished: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    page = _page(write_report([Path(finished["dp"]["run_dir"])], tmp_path / "r.html"))
    for panel in ("grad_norm", "memory"):
        assert page.panels[panel].drawn, panel
    time_text = " ".join(page.panels["time"].text)
    for label in ("rank 0", "rank 1", "forward/backward", "communication wait", "checkpoint"):
        assert label in time_text


#: each strategy's unit and the parts its per-rank time bar must show (one worker's
#: federated round waits for nobody: no communication wait there)
BARS = {
    "dp": ("step", ("data", "forward/backward", "communication wait", "optimizer", "checkpoint")),
    "ps": ("step", ("data", "forward/backward", "communication wait", "optimizer")),
    "fed": ("round", ("data", "forward/backward", "optimizer", "other", "checkpoint")),
    "pop": ("generation", ("forward/backward", "communication wait", "evaluation", "other")),
}


@pytest.mark.parametrize("name", sorted(BARS))
def test_every_strategys_time_bar_is_its_ranks_phases(
    finished: dict[str, dict[str, Any]], name: str, tmp_path: Path
) -> None:
    """One bar per rank of the phases the strategy's unit recorded (training/meter.py's
    RankPhases), in seconds per step, round or generation; every record of a unit holds
    every rank's phases and peak memory, and a worker's phases add up to its unit's time."""
    run_dir = Path(finished[name]["run_dir"])
    unit, parts = BARS[name]
    page = _page(write_report([run_dir], tmp_path / "r.html"))
    panel = page.panels["time"]
    text = set(panel.text)
    ranks = 2 if name in ("dp", "ps") else 1  # the parameter server's 2 workers
    assert {f"rank {r}" for r in range(ranks)} <= text, text
    assert set(parts) <= text, (name, text)
    assert f"seconds per {unit}" in text and panel.drawn >= ranks * len(parts)
    event = {"step": "train", "round": "round", "generation": "generation"}[unit]
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["event"] == event]
    assert records
    for record in records:
        for r in range(ranks):
            assert record[f"rank{r}_forward_backward_s"] > 0 and record[f"rank{r}_peak_mb"] > 10
    if unit == "round":  # the worker's phases, other included, are its round
        for record in records:
            phases = ("data", "forward_backward", "comm", "optimizer", "other")
            spent = sum(record[f"rank0_{p}_s"] for p in phases)
            assert spent == pytest.approx(record["round_s"], rel=0.1, abs=0.01)


def test_population_panel_shows_members_and_lineage(
    finished: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    page = _page(write_report([Path(finished["pop"]["run_dir"])], tmp_path / "r.html"))
    panel = page.panels["population"]
    assert panel.rows >= 4  # the newest generation, one row per member
    assert "lineage" in " ".join(panel.text)


def test_two_runs_give_one_overlaid_page(
    finished: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    dp, fed = Path(finished["dp"]["run_dir"]), Path(finished["fed"]["run_dir"])
    done = run_shoal("report", str(dp), str(fed), "-o", "both.html", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    page = _page(tmp_path / "both.html")
    loss = " ".join(page.panels["loss"].text)
    assert "dp: train loss" in loss and "fed: train loss" in loss  # one chart, both runs
    assert page.panels["loss"].svgs == 2  # by step and by wall time, not one per run
    differences = " ".join(page.panels["differences"].text)
    assert "config: strategy.type" in differences and "federated" in differences
    assert "results: world_size" in differences
    assert "federated" in page.panels


def test_a_running_job_is_reported_from_what_is_on_disk(
    finished: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    """No results.json yet, and a last line still being written: the page is drawn."""
    source = Path(finished["dp"]["run_dir"])
    running = tmp_path / "running"
    running.mkdir()
    shutil.copy(source / "config.toml", running / "config.toml")
    lines = (source / "metrics.jsonl").read_text().splitlines()
    half = lines[len(lines) // 2]
    (running / "metrics.jsonl").write_text("\n".join(lines[: len(lines) // 2]) + "\n" + half[:40])
    page = _page(write_report([running]))
    assert (running / "report.html").is_file()
    assert "running" in " ".join(page.panels["summary"].text)
    assert page.panels["loss"].drawn and page.panels["time"].drawn


def test_a_folder_that_is_no_run_is_one_line_exit_2(tmp_path: Path) -> None:
    with pytest.raises(ShoalError, match=r"no metrics\.jsonl"):
        write_report([tmp_path])
    done = run_shoal("report", str(tmp_path / "missing"), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "no such directory" in done.stderr


def test_tensorboard_event_files_hold_the_logged_scalars(
    finished: dict[str, dict[str, Any]],
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = Path(finished["dp"]["run_dir"])
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in records if r["event"] == "train"]
    for name in ("loss", "samples_per_s", "grad_norm", "rank1_comm_s"):
        logged = {r["step"]: r[name] for r in train}
        saved = {e.step: e.value for e in events.Scalars(f"train/{name}")}
        assert saved.keys() == logged.keys(), name
        for step, value in logged.items():
            assert saved[step] == pytest.approx(value, rel=1e-6), (name, step)
    valid = [r for r in records if r["event"] == "eval" and r["split"] == "valid"]
    saved = {e.step: e.value for e in events.Scalars("eval/valid/accuracy")}
    assert saved == {r["step"]: pytest.approx(r["accuracy"], rel=1e-6) for r in valid}


def test_checkpoints_record_the_logged_loss(finished: dict[str, dict[str, Any]]) -> None:
    run_dir = Path(finished["dp"]["run_dir"])
    logged = {
        r["step"]: r["loss"]
        for r in read_metrics(run_dir / "metrics.jsonl")
        if r["event"] == "train"
    }
    metas = [json.loads(p.read_text()) for p in sorted(run_dir.glob("checkpoints/*/meta.json"))]
    assert [m["step"] for m in metas] == [10, 20, 26]
    for meta in metas:
        assert meta["loss_step"] == meta["step"]
        assert meta["loss"] == logged[meta["step"]]


@pytest.mark.parametrize("name", sorted(JOBS))
def test_results_count_checkpoints_and_failures_and_each_ranks_peak(
    finished: dict[str, dict[str, Any]], name: str
) -> None:
    results = json.loads((Path(finished[name]["run_dir"]) / "results.json").read_text())
    written = len(
        [
            r
            for r in read_metrics(Path(results["run_dir"]) / "metrics.jsonl")
            if r["event"] == "checkpoint"
        ]
    )
    assert results["counts"] == {"checkpoints": written, "failures": 0}
    assert written >= 1
    peaks = results["ranks"]["peak_memory_mb"]
    assert len(peaks) == results["world_size"] and all(p > 10 for p in peaks)


def test_the_parameter_servers_summary_counts_pulls_and_pushes(
    finished: dict[str, dict[str, Any]],
) -> None:
    from rich.console import Console

    from shoal.monitor.summary import print_summary

    results = finished["ps"]
    console = Console(record=True, width=200)
    print_summary(results, console)
    text = console.export_text()
    section = results["parameter_server"]
    assert f"{section['pulls']:,.0f} pulls, {section['pushes']:,.0f} pushes" in text
    assert section["pulls"] > 0 and section["pushes"] > 0


def test_the_page_reader_sees_no_data_in_an_empty_chart() -> None:
    """The check above can fail: axes, grid and legend alone count as nothing drawn."""
    from shoal.report.figures import Series, lines

    empty = lines([Series("nothing", [], [])], "step", "loss")
    one = lines([Series("loss", [1.0, 2.0, 3.0], [3.0, 2.0, 1.0])], "step", "loss")
    wrap = '<section data-panel="x">{}</section>'
    assert read_page(wrap.format(empty)).panels["x"].drawn == 0
    assert read_page(wrap.format(one)).panels["x"].drawn >= 1


def test_a_pipeline_runs_page_has_the_model_parallel_panel(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Two stages: the measured bubble beside the schedule's, each rank's compute and idle
    time; clipping's norm (a sum over the stages) is logged as the gradient norm."""
    from tests.tasks.lm.helpers import lm_job, write_text

    corpus = write_text(tmp_path_factory.mktemp("text"))
    job = lm_job(
        tmp_path / "runs",
        corpus,
        train={"max_steps": 6, "batch_size": 8, "drop_last": True, "grad_clip_norm": 0.5},
        task={"model": {"dim": 32, "heads": 4, "layers": 4, "context": 16}},
        monitor={"log_every_steps": 2, "progress": "off"},
        strategy={"type": "pipeline", "stages": 2, "microbatches": 4},
        run={"name": "pp"},
    )
    results = shoal.train(job)
    page = _page(write_report([Path(results["run_dir"])], tmp_path / "pp.html"))
    panel = page.panels["model_parallel"]
    assert panel.svgs == 2 and panel.drawn  # the bubble by step, compute and idle by rank
    assert {"rank 0", "rank 1", "compute", "idle"} <= set(panel.text)
    assert panel.rows == 2  # results.json's pipeline ranks
    train = [
        r for r in read_metrics(Path(results["run_dir"]) / "metrics.jsonl") if r["event"] == "train"
    ]
    assert all(r["grad_norm"] > 0 for r in train)
    for name in ("time", "memory", "grad_norm"):
        assert page.panels[name].drawn, name


def test_the_page_names_the_optimizer_the_run_trains_with(tmp_path: Path) -> None:
    """A parameter server's rows are trained by its own optimizer: the summary names that
    one, and the resolved config (which lists [train.optimizer]'s defaults too) says so."""
    run = tmp_path / "ps"
    run.mkdir()
    (run / "config.toml").write_text(
        '[task]\ntype = "kge"\n\n[strategy]\ntype = "parameter_server"\n\n'
        '[strategy.optimizer]\nkind = "adagrad"\nlr = 0.3\n\n'
        '[train]\nbatch_size = 512\n\n[train.optimizer]\nkind = "sgd"\nlr = 0.01\n'
    )
    (run / "metrics.jsonl").write_text(
        json.dumps({"event": "train", "step": 2, "epoch": 0, "loss": 1.5, "time": 1.0}) + "\n"
    )
    page = _page(write_report([run], tmp_path / "report.html"))
    summary = " ".join(page.panels["summary"].text)
    assert "adagrad (lr 0.3; strategy.optimizer)" in summary, summary
    assert "sgd" not in summary
    config = " ".join(page.panels["config"].text)
    assert "trains with is adagrad (lr 0.3; strategy.optimizer)" in config
    assert "[train.optimizer] below is not used" in config
