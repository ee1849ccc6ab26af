"""Bad meshes get one line naming the field (file:line: path: what), exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.cli.main import main
from shoal.errors import ShoalError
from shoal.shape.roles import RankRoles

LM = (
    '[task]\ntype = "lm"\n[task.data]\ntrain = "t.txt"\n[task.model]\ndim = 32\nheads = 4\n'
    "layers = 2\ncontext = 16\n\n[train]\nmax_steps = 2\nbatch_size = 8\n\n"
)


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (
            'type = "tensor_parallel"\ndegree = 3\n',
            "bad.toml:17: strategy.degree: a tensor degree of 3 does not divide "
            "task.model.heads (4): each rank computes whole heads; choose a divisor of the heads",
        ),
        (
            'type = "hybrid"\nmesh = { data = 2, tensor = 3 }\n',
            "bad.toml:17: strategy.mesh.tensor: a tensor degree of 3 does not divide "
            "task.model.heads (4): each rank computes whole heads; choose a divisor of the heads",
        ),
        (
            'type = "hybrid"\nmesh = { data = 2, expert = 2 }\n',
            "bad.toml:17: strategy.mesh.expert: unknown mesh dimension; choose from data, "
            "pipeline, tensor",
        ),
        (
            'type = "hybrid"\nmesh = { data = 2, pipeline = 3 }\n',
            "bad.toml:17: strategy.mesh.pipeline: 3 stages need at least as many blocks; the "
            "model has 2 (task.model.layers): use fewer stages or more layers",
        ),
        (
            'type = "hybrid"\nmesh = { pipeline = 1, tensor = 2 }\n',
            "bad.toml:17: strategy.mesh.pipeline: a pipeline dimension has at least 2 stages; "
            "leave it out for none",
        ),
        (
            'type = "hybrid"\nmesh = { data = 2, pipeline = 2 }\nmicrobatches = 8\n',
            "bad.toml:18: strategy.microbatches: 8 micro-batches x 2 data replicas do not divide "
            "train.batch_size (8): choose a divisor of it",
        ),
        (
            'type = "hybrid"\nmesh = { pipeline = 2, tensor = 2 }\nsequence_parallel = true\n',
            "bad.toml:18: strategy.sequence_parallel: sequence parallelism is not built with a "
            "pipeline dimension (the stages exchange whole sequences); set "
            "sequence_parallel = false",
        ),
        (
            'type = "hybrid"\nmesh = { data = 2, pipeline = 2 }\nrebalance = "checkpoint"\n',
            "bad.toml:18: strategy.rebalance: re-partitioning at checkpoints is built for "
            "strategy pipeline, not for a hybrid mesh's pipeline dimension; set "
            'rebalance = "off"',
        ),
        (
            'type = "hybrid"\nmesh = { data = 0 }\n',
            "bad.toml:17: strategy.mesh.data: must be at least 1, got 0",
        ),
        (
            'type = "hybrid"\nmesh = { data = 2, pipeline = 2 }\nschedule = "interleaved_1f1b"\n',
            "bad.toml:17: strategy.mesh.pipeline: 4 stages (2 ranks x 2 virtual stages) need at "
            "least as many blocks; the model has 2 (task.model.layers): use fewer stages or more "
            "layers",
        ),
        (
            'type = "fully_sharded"\nsequence_parallel = true\n',
            "bad.toml:17: strategy.sequence_parallel: needs a tensor dimension larger than 1",
        ),
    ],
    ids=[
        "heads",
        "mesh-heads",
        "unknown-dim",
        "more-stages-than-blocks",
        "pipeline-of-one",
        "microbatches-per-replica",
        "sp-with-pipeline",
        "rebalance-in-a-mesh",
        "zero",
        "interleaved-stages-beyond-the-blocks",
        "sp-without-tensor",
    ],
)
def test_bad_mesh_gives_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    strategy: str,
    expected: str,
) -> None:
    (tmp_path / "t.txt").write_text("hello world\n" * 20)
    (tmp_path / "bad.toml").write_text(LM + "[strategy]\n" + strategy)
    monkeypatch.chdir(tmp_path)
    assert main(["config", "validate", "bad.toml"]) == 2
    assert capsys.readouterr().err.splitlines() == [expected]


def test_a_mesh_that_is_not_the_world_is_refused_naming_both() -> None:
    """Under torchrun the world size is the launcher's: a mesh of another size is an error."""
    roles = RankRoles.mesh(4, {"data": 2, "tensor": 2})
    assert [roles.coordinates(r) for r in (0, 1, 3)] == [
        {"data": 0, "tensor": 0},
        {"data": 0, "tensor": 1},
        {"data": 1, "tensor": 1},
    ]
    with pytest.raises(ShoalError, match=r"strategy hybrid: the roles need 4 processes"):
        roles.validate(6, "strategy hybrid")
    assert "mesh data 2 x tensor 2" in roles.describe()


def test_a_pipeline_mesh_that_is_not_the_world_is_refused() -> None:
    """A data x pipeline x tensor mesh: coordinates row-major, pipeline in the middle; a
    world of another size is refused naming both."""
    roles = RankRoles.mesh(8, {"data": 2, "pipeline": 2, "tensor": 2})
    assert roles.coordinates(6) == {"data": 1, "pipeline": 1, "tensor": 0}
    with pytest.raises(ShoalError, match=r"the roles need 8 processes .* this job has 4"):
        roles.validate(4, "strategy hybrid")
