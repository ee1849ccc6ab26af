"""A job that cannot fit the machine's memory is refused before it starts, with the estimate."""

from __future__ import annotations

import gzip
from pathlib import Path

import tomli_w

from shoal.config import load_config
from shoal.launch.memory import check_memory, estimate
from shoal.tasks.lm.config import _text_bytes
from tests.conftest import run_shoal, small_job


def test_data_larger_than_the_machine_is_refused_in_one_line(tmp_path: Path) -> None:
    job = small_job(
        tmp_path / "runs",
        task={"data": {"samples": 2_000_000_000, "features": 64}},
        strategy={"type": "data_parallel", "num_replicas": 2},
        run={"name": "big"},
    )
    (tmp_path / "job.toml").write_text(tomli_w.dumps(job))
    done = run_shoal("train", "job.toml", cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(
        "the job needs about 6208.0 GB of memory before its first step, more than"
    ), line
    assert (
        "2 processes x (task.data: 2,000,000,000 samples x 64 features: 3104.0 GB; the model: "
        in line
    )
    assert line.endswith("or pass --force to start it anyway")
    assert not (tmp_path / "runs" / "big").exists()


def test_the_estimate_counts_the_optimizers_copies_and_forces_through() -> None:
    base = small_job(Path("runs"), task={"model": {"hidden": [100]}})
    job = load_config(base, ["task.data.features=10", "task.data.classes=3"])
    parameters = (10 + 1) * 100 + (100 + 1) * 3
    sgd, _ = estimate(job, 1)  # momentum 0.9: one slot; weights, gradients, best, momentum
    adam, _ = estimate(load_config(base, ["train.optimizer={kind = 'adam'}"]), 1)
    assert adam - sgd == 4 * parameters  # Adam keeps two moments
    huge = load_config(base, ["task.data.samples=2000000000000"])
    check_memory(huge, 4, force=True)  # --force starts it anyway


def test_a_gzip_texts_size_is_read_from_its_trailer(tmp_path: Path) -> None:
    text = tmp_path / "text.txt.gz"
    text.write_bytes(gzip.compress(b"to be or not to be\n" * 100_000))
    assert _text_bytes(text) == 1_900_000
    plain = tmp_path / "text.txt"
    plain.write_text("abc")
    assert _text_bytes(plain) == 3
