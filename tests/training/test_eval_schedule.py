"""`[train] eval_every_steps`, and validation lines that count epochs as the progress bar."""

from __future__ import annotations

import re
from pathlib import Path

import tomli_w

from shoal.monitor.metrics import read_metrics
from tests.conftest import run_shoal, small_job


def test_eval_every_steps_and_epochs_counted_as_the_bar_counts_them(tmp_path: Path) -> None:
    """Every 5 steps an evaluation (besides the epochs' ends); each validation line names
    the epoch its step belongs to, 1-based of the total, as the plain progress lines do."""
    job = small_job(
        tmp_path / "runs",
        train={"eval_every_steps": 5},
        run={"name": "job"},
        monitor={"progress": "plain", "log_every_steps": 1},
    )
    (tmp_path / "job.toml").write_text(tomli_w.dumps(job))
    done = run_shoal("train", "job.toml", cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    records = read_metrics(tmp_path / "runs" / "job" / "metrics.jsonl")
    evaluated = sorted({r["step"] for r in records if r["event"] == "eval"})
    steps = max(r["step"] for r in records if r["event"] == "train")
    assert set(range(5, steps + 1, 5)) <= set(evaluated), evaluated
    bar = dict(re.findall(r"^step (\d+)/\d+ epoch (\S+) ", done.stdout, re.M))
    shown = re.findall(r"^step (\d+) epoch (\S+) valid", done.stdout, re.M)
    assert len(shown) >= len(evaluated) > 2
    for step, epoch in shown:
        assert bar[step] == epoch, (step, epoch, bar[step])
