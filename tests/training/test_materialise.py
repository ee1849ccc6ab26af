"""Models built on the meta device and materialised unit by unit: every layout holds pieces
of the values one process builds whole, tied parameters stay tied, and a parameter no
initialiser sets is named in one line."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from shoal.errors import ShoalError
from shoal.tasks.module.task import ModuleTask
from shoal.training.materialise import draw_base, materialise, on_meta
from tests.comm.group import run_in_group
from tests.conftest import one_worker_context

pytest.importorskip("transformers")

FACTORIES = Path(__file__).resolve().parents[1] / "tasks" / "module"


def task_of(runs: Path, factory: str, **options: Any) -> ModuleTask:
    job = {
        "task": {
            "type": "module",
            "factory": factory,
            "import_dir": str(FACTORIES),
            "options": options,
        },
        "train": {"max_steps": 1, "batch_size": 4, "seed": 3},
        "run": {"dir": str(runs)},
        "monitor": {"progress": "off"},
    }
    return ModuleTask(one_worker_context(job))


def built_locally(task: ModuleTask) -> dict[str, torch.Tensor]:
    torch.manual_seed(11)
    return {k: v.clone() for k, v in task.build_model().state_dict().items()}


def test_in_place_and_from_an_unsharded_copy_give_the_same_values(tmp_path: Path) -> None:
    task = task_of(tmp_path / "runs", "hf_models:llama", layers=3)
    whole = built_locally(task)
    torch.manual_seed(11)
    meta = task.build_meta_model()
    assert meta is not None and on_meta(meta)
    base, shadow = draw_base(), copy.deepcopy(meta)
    materialise(meta, task, base, torch.device("cpu"), shadow)
    assert not on_meta(meta)
    for name, value in meta.state_dict().items():
        assert torch.equal(value, whole[name]), name
    # initialised as the model's own init does: normal(0.02) projections, unit norms
    assert 0.015 < float(whole["model.layers.2.mlp.up_proj.weight"].std()) < 0.025
    assert torch.equal(whole["model.norm.weight"], torch.ones(64))
    # a block's values are keyed by its path: the same in a model of more blocks
    deeper = built_locally(task_of(tmp_path / "runs2", "hf_models:llama", layers=5))
    assert torch.equal(
        deeper["model.layers.1.mlp.up_proj.weight"], whole["model.layers.1.mlp.up_proj.weight"]
    )


def test_tied_parameters_stay_one_tensor(tmp_path: Path) -> None:
    task = task_of(tmp_path / "runs", "hf_models:llama", layers=2, tied=True)
    model = task.build_model()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert not model.lm_head.weight.isnan().any()


class RawScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.scale = nn.Parameter(torch.ones(3))  # no reset_parameters sets it


def test_a_parameter_no_initialiser_sets_is_named(tmp_path: Path) -> None:
    task = task_of(tmp_path / "runs", "hf_models:llama", layers=2)
    task.built.model = RawScale
    with pytest.raises(ShoalError, match=r"no initialiser sets parameter scale: give its module"):
        task.build_model()
    task.built.init = lambda module: (
        torch.nn.init.ones_(module.scale) if hasattr(module, "scale") else None
    )
    with pytest.raises(ShoalError, match=r"linear\.weight"):  # init(module) replaces the defaults
        task.build_model()


def _laid_out_equals_local(rank: int, world: int, runs: str, layout: str) -> None:
    from torch.distributed.tensor import DTensor

    from shoal.strategies.spmd.layout import build_mesh, lay_out

    task = task_of(Path(runs) / f"rank-{rank}", "hf_models:llama", layers=3)
    whole = built_locally(task)
    dims = {"tensor": world} if layout == "tensor" else {"data": world}
    mesh = build_mesh(torch.device("cpu"), dims, tuple(range(world)))
    torch.manual_seed(11)
    meta = task.build_meta_model()
    assert meta is not None
    base, shadow = draw_base(), copy.deepcopy(meta)
    lay_out(task, layout, meta, mesh, dims, "sharded", False, False)
    materialise(meta, task, base, torch.device("cpu"), shadow)
    held = 0
    for name, param in meta.named_parameters():
        assert isinstance(param, DTensor) or layout == "tensor", name
        full = param.full_tensor() if isinstance(param, DTensor) else param
        assert torch.equal(full.detach(), whole[name]), name
        local = param.to_local() if isinstance(param, DTensor) else param
        held += local.numel()
    everything = sum(v.numel() for k, v in whole.items() if "rotary" not in k)
    assert held < 0.75 * everything  # this rank holds pieces, not the model


@pytest.mark.parametrize("layout", ["tensor", "data"])
def test_every_rank_holds_its_pieces_of_the_local_values(tmp_path: Path, layout: str) -> None:
    assert run_in_group(2, _laid_out_equals_local, tmp_path, str(tmp_path), layout) == [0, 1]
