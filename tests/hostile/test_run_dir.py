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
