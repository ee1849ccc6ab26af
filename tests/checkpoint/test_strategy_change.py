"""Changing strategy on resume: `--set strategy.type=...` replaces the old strategy's section;
every pair whose checkpoint loads resumes and trains on, every other pair is refused in one
line that says which checkpoints the new strategy resumes."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w

import shoal
from shoal.checkpoint.changes import refuse_changes, resume_changes, resume_rules
from shoal.config import dump_config, load_config
from shoal.config.custom import own_config
from shoal.errors import ConfigError
from tests.conftest import run_shoal
from tests.tasks.lm.helpers import lm_job, write_text

#: every strategy an lm job runs under, as `--set` items (the type first: it resets the table)
SETS: dict[str, list[str]] = {
    "local": ["strategy.type=local"],
    "data_parallel": ["strategy.type=data_parallel", "strategy.num_replicas=2"],
    "pipeline": ["strategy.type=pipeline", "strategy.stages=2", "strategy.microbatches=2"],
    "tensor_parallel": ["strategy.type=tensor_parallel", "strategy.degree=2"],
    "fully_sharded": ["strategy.type=fully_sharded", "strategy.degree=2"],
    "hybrid": ["strategy.type=hybrid", "strategy.mesh={ data = 1, tensor = 2 }"],
}
PAIRS = [(a, b) for a in SETS for b in SETS if a != b]


def _job(tmp_path: Path, saved: str) -> dict[str, Any]:
    base = lm_job(
        tmp_path / "runs",
        write_text(tmp_path),
        train={"max_steps": 8},
        checkpoint={"every_steps": 4},
        monitor={"progress": "off"},
        run={"name": saved},
    )
    return load_config(base, SETS[saved]).model_dump(mode="json", exclude_none=True)


def _accepts(job: dict[str, Any], saved: str, asked: str) -> bool:
    """Whether the strategy `asked` resumes `saved`'s checkpoints, as its section declares."""
    return saved in own_config(load_config(job, SETS[asked]).strategy).resumes_from


@pytest.mark.parametrize(("saved", "asked"), PAIRS, ids=[f"{a}-to-{b}" for a, b in PAIRS])
def test_the_planner_accepts_a_loadable_pair_and_names_the_rest(
    tmp_path: Path, saved: str, asked: str
) -> None:
    """The old section's fields never surface as unknown keys of the new one; a pair that
    cannot load is one line naming the checkpoints the new strategy resumes."""
    job = _job(tmp_path, saved)
    saved_text = dump_config(load_config(job))
    config = load_config(tomllib.loads(saved_text), SETS[asked])
    assert config.strategy.type == asked
    changes = resume_changes(Path("step-4"), {"config": saved_text}, config, resume_rules(config))
    if _accepts(job, saved, asked):
        refuse_changes(changes, Path("step-4"), allow=False)
        return
    with pytest.raises(ConfigError) as refused:
        refuse_changes(changes, Path("step-4"), allow=False)
    (line,) = refused.value.lines
    assert line.startswith(f"strategy.type: cannot change when resuming from step-4: the "
                           f'checkpoint holds "{saved}", asked "{asked}"; a {asked} run resumes '
                           f"checkpoints of {asked}")  # fmt: skip


def test_the_cli_resumes_under_another_strategy_with_set(tmp_path: Path) -> None:
    """`shoal train --resume RUN --set strategy.type=local` on a data_parallel run: the
    run goes on from its checkpoint under the new strategy (its own section's defaults)."""
    job = _job(tmp_path, "data_parallel")
    (tmp_path / "job.toml").write_text(tomli_w.dumps(job))
    first = run_shoal("train", "job.toml", cwd=tmp_path, timeout=180)
    assert first.returncode == 0, first.stderr
    run = tmp_path / "runs" / "data_parallel"
    resumed = run_shoal(
        "train", "--resume", str(run / "checkpoints" / "step-00000004"),
        "--set", "strategy.type=local", cwd=tmp_path, timeout=180,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    # the terminal says it is a resume, not a new run
    assert f"shoal: resuming {run} from {run / 'checkpoints' / 'step-00000004'}" in resumed.stdout
    log = (run / "logs" / "rank-0.log").read_text()
    assert 'resuming with a change of strategy.type: the checkpoint holds "data_parallel", ' \
        'asked "local"' in log  # fmt: skip
    assert "Traceback" not in resumed.stderr


def test_a_new_config_file_beside_resume_is_the_resumed_runs_config(tmp_path: Path) -> None:
    """README: pass the new config with --resume (`shoal train new.toml --resume RUN`)."""
    job = _job(tmp_path, "local")
    shoal.train(job)
    new = load_config(job, SETS["data_parallel"]).model_dump(mode="json", exclude_none=True)
    (tmp_path / "new.toml").write_text(tomli_w.dumps(new))
    run = tmp_path / "runs" / "local"
    resumed = run_shoal(
        "train", "new.toml", "--resume", str(run / "checkpoints" / "step-00000004"),
        cwd=tmp_path, timeout=180,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    results = json.loads((run / "results.json").read_text())
    assert results["strategy"] == "data_parallel" and results["steps"] == 8


@pytest.mark.slow
@pytest.mark.parametrize(("saved", "asked"), PAIRS, ids=[f"{a}-to-{b}" for a, b in PAIRS])
def test_every_pair_resumes_or_is_refused_in_one_line(
    tmp_path: Path, saved: str, asked: str
) -> None:
    """A run of `saved`, resumed from its step 4 under `asked`: it trains to step 8 from the
    checkpoint, or (a pair the new strategy does not resume) is one line, exit 2."""
    job = _job(tmp_path, saved)
    (tmp_path / "job.toml").write_text(tomli_w.dumps(job))
    first = run_shoal("train", "job.toml", cwd=tmp_path, timeout=300)
    assert first.returncode == 0, first.stderr
    run = tmp_path / "runs" / saved
    sets = [arg for item in SETS[asked] for arg in ("--set", item)]
    step4 = str(run / "checkpoints" / "step-00000004")
    resumed = run_shoal("train", "--resume", step4, *sets, cwd=tmp_path, timeout=300)
    assert "Traceback" not in resumed.stderr
    if not _accepts(job, saved, asked):
        assert resumed.returncode == 2
        (line,) = resumed.stderr.strip().splitlines()
        assert f"a {asked} run resumes checkpoints of {asked}" in line
        return
    assert resumed.returncode == 0, resumed.stderr
    results = json.loads((run / "results.json").read_text())
    assert results["strategy"] == asked and results["steps"] == 8
