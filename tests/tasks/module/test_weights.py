"""`[task] weights`: a Hugging Face safetensors folder (or one file) read into any layout,
each rank reading its pieces; what the file lacks initialised, a file of another model
refused in one line."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from shoal.errors import ShoalError
from shoal.tasks.module.task import ModuleTask
from shoal.training.materialise import draw_base, materialise
from tests.comm.group import run_in_group
from tests.conftest import one_worker_context

transformers = pytest.importorskip("transformers")

FACTORIES = Path(__file__).resolve().parent


def task_of(runs: Path, factory: str, weights: str | None, **options: Any) -> ModuleTask:
    task: dict[str, Any] = {
        "type": "module",
        "factory": factory,
        "import_dir": str(FACTORIES),
        "options": options,
    }
    if weights is not None:
        task["weights"] = weights
    job = {
        "task": task,
        "train": {"max_steps": 1, "batch_size": 4, "seed": 3},
        "run": {"dir": str(runs)},
        "monitor": {"progress": "off"},
    }
    return ModuleTask(one_worker_context(job))


def pretrained(folder: Path, factory: str, **options: Any) -> dict[str, torch.Tensor]:
    """A model of the factory, initialised by transformers (another seed than shoal's),
    saved with save_pretrained; its state in Hugging Face's names."""
    from tests.tasks.module import hf_models as factories

    torch.manual_seed(123)
    model = getattr(factories, factory)(**options)["model"]()
    model.save_pretrained(folder)
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_weights_replace_the_initial_values(tmp_path: Path, family: str) -> None:
    saved = pretrained(tmp_path / "hf", family, layers=2)
    task = task_of(tmp_path / "runs", f"hf_models:{family}", str(tmp_path / "hf"), layers=2)
    model = task.build_model()
    if family == "gpt2":  # held unfused: compare in Hugging Face's layout
        from shoal.tasks.module.families import to_hf_state

        state = to_hf_state(model.state_dict(), model.config)
    else:
        state = model.state_dict()
    for name, value in saved.items():
        if name in state:
            assert torch.equal(state[name], value), name
    assert sum(name in state for name in saved) >= len(state) - 1


def test_a_file_of_another_model_is_one_line(tmp_path: Path) -> None:
    pretrained(tmp_path / "hf", "vit", layers=1)
    task = task_of(tmp_path / "runs", "hf_models:llama", str(tmp_path / "hf"), layers=2)
    with pytest.raises(ShoalError, match=r"^task\.weights: .* has none of the model's"):
        task.build_model()


def test_a_weights_path_without_safetensors_is_refused_at_validate(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match=r"holds no \.safetensors file"):
        task_of(tmp_path / "runs", "hf_models:llama", str(tmp_path / "empty"))


def _sharded_reads_its_pieces(rank: int, world: int, folder: str, runs: str) -> None:
    from torch.distributed.tensor import DTensor

    from shoal.strategies.spmd.layout import build_mesh, lay_out

    task = task_of(Path(runs) / f"rank-{rank}", "hf_models:llama", folder, layers=2)
    torch.manual_seed(5)
    whole = task.build_model().state_dict()
    dims = {"tensor": world}
    mesh = build_mesh(torch.device("cpu"), dims, tuple(range(world)))
    meta = task.build_meta_model()
    assert meta is not None
    shadow = copy.deepcopy(meta)
    lay_out(task, "tensor_parallel", meta, mesh, dims, "replicated", False, False)
    materialise(meta, task, draw_base(), torch.device("cpu"), shadow, task.weights_for(shadow))
    for name, param in meta.named_parameters():
        full = param.full_tensor() if isinstance(param, DTensor) else param
        assert torch.equal(full.detach(), whole[name]), name


def test_a_tensor_parallel_layout_reads_the_same_weights(tmp_path: Path) -> None:
    pretrained(tmp_path / "hf", "llama", layers=2)
    done = run_in_group(2, _sharded_reads_its_pieces, tmp_path, str(tmp_path / "hf"), str(tmp_path))
    assert done == [0, 1]


def test_a_factory_that_loads_weights_itself_keeps_them(tmp_path: Path) -> None:
    """`from_pretrained` inside the model function does not run on the meta device: the
    model is built whole, with the weights it loaded (not initialised over them)."""
    saved = pretrained(tmp_path / "hf", "llama", layers=2)
    (tmp_path / "loads.py").write_text(
        "import torch\nfrom transformers import LlamaForCausalLM\n\n"
        "def build():\n"
        f"    return {{'model': lambda: LlamaForCausalLM.from_pretrained({str(tmp_path / 'hf')!r}),\n"
        "            'train': [torch.zeros(8, dtype=torch.long)] * 4, 'loss': 'causal_lm'}\n"
    )
    job = {
        "task": {"type": "module", "factory": "loads:build", "import_dir": str(tmp_path)},
        "train": {"max_steps": 1, "batch_size": 2},
        "run": {"dir": str(tmp_path / "runs")},
        "monitor": {"progress": "off"},
    }
    task = ModuleTask(one_worker_context(job))
    assert task.build_meta_model() is None
    state = task.build_model().state_dict()
    assert all(torch.equal(state[name], value) for name, value in saved.items())
