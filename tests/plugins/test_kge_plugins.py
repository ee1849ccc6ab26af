"""A KG model and a KG loss from entry points (`shoal.kge_models`, `shoal.kge_losses`),
trained together through `shoal train` alone on the planted graph.

The model plugin is DistMult's maths under a name, config and formula of its own
(the exported model.json must show its formula); the loss plugin is a squared hinge, sum_k w_k max(0, margin - s_pos + s_k)^2, a loss shoal does not have,
which records in the run folder that it was built (so the test knows it was used).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.conftest import run_shoal
from tests.plugins.helpers import pythonpath, register
from tests.tasks.kge.planted import random_mrr, write_planted_graph

MODEL_CONFIG = """
from typing import ClassVar, Literal
from pydantic import Field
from shoal.tasks.kge.model_config import ModelOptions

class ScaledDistMultConfig(ModelOptions):
    '''DistMult with its initialisation scaled by init_scale (a plugin).'''
    implementation: ClassVar[str] = "plug_kge:ScaledDistMult"
    type: Literal["scaled_distmult"] = "scaled_distmult"
    init_scale: float = Field(1.0, gt=0, description="Multiplies the Xavier initialisation.")
"""

LOSS_CONFIG = """
from typing import ClassVar, Literal
from pydantic import Field
from shoal.tasks.kge.loss_config import LossOptions

class SquaredHingeConfig(LossOptions):
    '''Squared hinge against sampled negatives (a plugin).'''
    implementation: ClassVar[str] = "plug_kge:SquaredHinge"
    kind: Literal["squared_hinge"] = "squared_hinge"
    margin: float = Field(1.0, gt=0, description="The margin.")
"""

IMPLEMENTATION = """
from pathlib import Path
import torch
from shoal.tasks.kge.losses import KGELoss
from shoal.tasks.kge.models import DistMult
from plug_kge_config import ScaledDistMultConfig, SquaredHingeConfig

class ScaledDistMult(DistMult):
    config_class = ScaledDistMultConfig
    formula = "plugin: sum_i h_i r_i t_i"

class SquaredHinge(KGELoss):
    config_class = SquaredHingeConfig

    def __init__(self, config):
        super().__init__(config)
        Path("squared_hinge_built").touch()

    def sampled(self, positive, negatives):
        hinge = torch.relu(self.config.margin - positive[:, None] + negatives)
        return (hinge * hinge).mean(dim=-1)
"""

JOB = """
[task]
type = "kge"
dim = 32
model = {{ type = "scaled_distmult", init_scale = 0.5 }}
loss = {{ kind = "squared_hinge", margin = 2.0 }}
negatives = {{ num_negatives = 16, chunk_size = 16 }}
data = {{ train = "{train}", valid = "{valid}", test = "{test}" }}

[train]
epochs = 30
batch_size = 32
optimizer = {{ kind = "adam", lr = 0.05 }}
eval_every_epochs = 10

[checkpoint]
every_epochs = 0

[run]
dir = "runs"
name = "plugin"

[monitor]
progress = "off"
"""


def _graph(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "graph").mkdir()
    return {name: str(path) for name, path in write_planted_graph(tmp_path / "graph").items()}


def _install(site: Path) -> dict[str, str]:
    (site / "plug_kge_config.py").write_text(
        textwrap.dedent(MODEL_CONFIG) + textwrap.dedent(LOSS_CONFIG)
    )
    (site / "plug_kge.py").write_text(textwrap.dedent(IMPLEMENTATION))
    register(
        site,
        "plug-kge",
        {
            "shoal.kge_models": {"scaled_distmult": "plug_kge_config:ScaledDistMultConfig"},
            "shoal.kge_losses": {"squared_hinge": "plug_kge_config:SquaredHingeConfig"},
        },
    )
    return pythonpath(site)


def test_a_kge_model_and_loss_plugin_train_through_the_cli(tmp_path: Path) -> None:
    env = _install(tmp_path)
    (tmp_path / "job.toml").write_text(JOB.format(**_graph(tmp_path)))
    done = run_shoal("train", "job.toml", cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "squared_hinge_built").exists(), "the plugin's loss was not used"
    run = tmp_path / "runs" / "plugin"
    results = json.loads((run / "results.json").read_text())
    assert results["test"]["mrr"] > 3 * random_mrr(results["data"]["entities"])
    info = json.loads((run / "embeddings" / "model.json").read_text())
    assert info["model"] == "scaled_distmult"
    assert info["score"] == "plugin: sum_i h_i r_i t_i"


def _refusal(tmp_path: Path, env: dict[str, str], name: str, text: str) -> list[str]:
    """`shoal config validate` of a job that must be refused: its stderr lines."""
    (tmp_path / name).write_text(text)
    done = run_shoal("config", "validate", name, cwd=tmp_path, env=env)
    assert done.returncode == 2
    return done.stderr.splitlines()


def test_a_loss_plugin_without_every_entity_is_refused_under_one_vs_all(tmp_path: Path) -> None:
    """The rule between training type and loss reads the plugin's `every_entity`, and the
    unknown-loss error lists the plugins beside the built-ins."""
    env = _install(tmp_path)
    job = JOB.format(**_graph(tmp_path))
    one_vs_all = job.replace("negatives = ", 'training = "1vsAll"\n#')
    assert _refusal(tmp_path, env, "one.toml", one_vs_all) == [
        "one.toml:2: task: loss 'squared_hinge' pairs a positive with sampled negatives; "
        "training 1vsAll scores every entity: use loss kind softmax or bce"
    ]
    assert _refusal(tmp_path, env, "bad.toml", job.replace('"squared_hinge"', '"hinge"')) == [
        "bad.toml:6: task.loss.kind: unknown value 'hinge'; choose one of: margin_ranking, "
        "logistic, softmax, bce, squared_hinge"
    ]
