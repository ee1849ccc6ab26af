"""The same config runs under torchrun (here: one machine, --standalone picks a free port)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import shoal
from tests.conftest import data_parallel, final_state, small_job


@pytest.mark.skipif(
    shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
    reason="torchrun not installed next to this python",
)
def test_torchrun_matches_shoals_own_launcher(runs: Path, tmp_path: Path) -> None:
    import tomli_w

    job = small_job(runs, strategy=data_parallel(2))
    own = shoal.train(job)
    (tmp_path / "job.toml").write_text(
        tomli_w.dumps({**job, "run": {"dir": str(runs), "name": "tr"}})
    )
    torchrun = str(Path(sys.executable).parent / "torchrun")
    done = subprocess.run(
        [
            torchrun,
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "shoal",
            "train",
            str(tmp_path / "job.toml"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith(("RANK", "MASTER_"))},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "run directory:" in done.stdout
    results = runs / "tr" / "results.json"
    assert results.is_file() and (runs / "tr" / "logs" / "rank-1.log").is_file()
    import json

    theirs = json.loads(results.read_text())
    assert theirs["world_size"] == 2 and theirs["steps"] == own["steps"]
    mine, other = final_state(own)["model"], final_state(theirs)["model"]
    for name in mine:
        torch.testing.assert_close(mine[name], other[name], rtol=0, atol=1e-6)
