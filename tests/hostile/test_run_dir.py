"""Red team: a run directory that cannot be one. `run.dir` naming a file (or a folder under a
file) is one line naming the field, exit 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w

from tests.conftest import run_shoal, small_job


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_run_dir_at_a_file_is_one_line(tmp_path: Path, where: str) -> None:
    blocker = tmp_path / "runs"
    blocker.write_text("not a folder")
    run_dir = blocker if where == "a file" else blocker / "inside"
    (tmp_path / "job.toml").write_text(tomli_w.dumps(small_job(run_dir)))
    done = run_shoal("train", str(tmp_path / "job.toml"), cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line == (
        f"run.dir: {run_dir} is not a folder (a file is in the way); set run.dir to a folder "
        "(it is created if missing)"
    )


@pytest.mark.parametrize(
    "strategy",
    [
        {"type": "local"},
        pytest.param({"type": "data_parallel", "num_replicas": 2}, marks=pytest.mark.slow),
    ],
)
def test_a_run_that_failed_before_training_gives_its_name_back(
    tmp_path: Path, strategy: dict[str, object]
) -> None:
    """A first run that fails before its first step (a batch larger than the data) keeps its
    logs for the message, but the next good run of the same config is `job`, not `job-2`."""
    runs = tmp_path / "runs"
    bad = small_job(runs, strategy=strategy, train={"batch_size": 100_000}, run={"name": "job"})
    (tmp_path / "job.toml").write_text(tomli_w.dumps(bad))
    failed = run_shoal("train", "job.toml", cwd=tmp_path, timeout=120)
    assert failed.returncode == 2, failed.stderr
    assert "train.batch_size (100000) exceeds the" in failed.stderr
    assert (runs / "job" / "config.toml").is_file()  # still there to read
    good = small_job(runs, strategy=strategy, run={"name": "job"})
    (tmp_path / "job.toml").write_text(tomli_w.dumps(good))
    done = run_shoal("train", "job.toml", cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (runs / "job" / "results.json").is_file()
    assert sorted(p.name for p in runs.iterdir()) == ["job"]
    # a run that trained keeps its name: the next one is job-2
    again = run_shoal("train", "job.toml", cwd=tmp_path, timeout=120)
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in runs.iterdir()) == ["job", "job-2"]
