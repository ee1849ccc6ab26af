"""benchmarks/kge_quality.py: a chunk cut off by its timeout does not end a model's run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from kge_quality import chunk_command, finished


def test_a_stopped_chunk_is_resumed_and_only_a_completed_run_is_done(tmp_path: Path) -> None:
    run = tmp_path / "distmult"
    assert not finished(run)
    assert "--resume" not in chunk_command("distmult", run, 600, [])
    (run / "checkpoints" / "step-00001459").mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"status": "stopped", "steps": 1459}))
    assert not finished(run), "a chunk stopped by its SIGTERM writes results.json too"
    command = chunk_command("distmult", run, 600, [])
    assert command[command.index("--resume") + 1] == str(run)
    (run / "results.json").write_text(json.dumps({"status": "completed", "test": {}}))
    assert finished(run)
