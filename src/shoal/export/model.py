"""The run's model, rebuilt on the meta device, for what an export needs to know about it.

A module run's factory is called again (the run's seed, its options), and its model built
on `meta` (`tasks/module/factory.py on_meta`: no weights are materialised), as shoal holds
it: a GPT-2 with its attention unfused. From it come

- the names the user's own module uses (GPT-2's q, k, v fused back and its `Conv1D`
  weights transposed back: `families.to_hf_state`), and a check that the checkpoint holds
  exactly the model the factory builds, name by name and shape by shape;
- the weights tied to others (one `Parameter` under several names), written once;
- for a Hugging Face `PreTrainedModel`: its class, config and generation config.

shoal's own tasks (lm, classification, kge) have no factory: their checkpoint's names are
their model's, and tensors sharing memory in state.pt are the tied ones.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from pydantic import ValidationError
from torch import nn

from shoal.errors import ShoalError
from shoal.export.source import SavedModel


def run_model(saved: SavedModel) -> nn.Module | None:
    """The model of a module run, built on meta from its factory; None for another task."""
    task = saved.config.get("task", {})
    if task.get("type") != "module":
        return None
    from shoal.tasks.module.config import ModuleTaskConfig
    from shoal.tasks.module.factory import built, check_factory, on_meta

    where = f"{saved.checkpoint}: task"
    try:
        section = ModuleTaskConfig.model_validate(task)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"])
        raise ShoalError(
            f"{where}.{field}: {error['msg']} (the config the run trained with)"
        ) from None
    seed = int(saved.config.get("train", {}).get("seed", 0))
    problem = check_factory(section, seed)
    if problem is not None:
        field, message = problem
        raise ShoalError(
            f"{where}.{field}: {message}; the export rebuilds the model from the factory the "
            "run trained with: make it importable again"
        )
    return on_meta(built(section, seed))


def is_pretrained(model: nn.Module | None) -> bool:
    """A Hugging Face `PreTrainedModel` (transformers is imported already when it is one)."""
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(model, transformers.PreTrainedModel)


def is_held_gpt2(model: nn.Module) -> bool:
    """A GPT-2-style model as shoal holds it: its attention's q, k, v unfused."""
    from shoal.tasks.module.families import FusedQKV

    return any(isinstance(module, FusedQKV) for module in model.modules())


def user_names(state: dict[str, torch.Tensor], model: nn.Module | None) -> dict[str, torch.Tensor]:
    """`state` under the names of the user's module (GPT-2 fused back)."""
    if model is None or not is_held_gpt2(model):
        return state
    from shoal.tasks.module.families import to_hf_state

    return to_hf_state(state, getattr(model, "config", None))


def check_fits(saved: SavedModel, model: nn.Module, tied: dict[str, str]) -> None:
    """One line if the checkpoint does not hold exactly the model the factory builds (a tied
    weight may be there under its first name only)."""
    own = {
        name: tuple(t.shape)
        for name, t in model.state_dict().items()
        if not (name in tied and name not in saved.state)
    }
    held = {name: tuple(t.shape) for name, t in saved.state.items()}
    problems = [f"{name} is missing from the checkpoint" for name in own if name not in held]
    problems += [
        f"the checkpoint has {name}, the model does not" for name in held if name not in own
    ]
    problems += [
        f"{name} is {held[name]} in the checkpoint, {own[name]} in the model"
        for name in own
        if name in held and held[name] != own[name]
    ]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ShoalError(
            f"{saved.checkpoint}: does not fit the model the run's factory builds now: "
            f"{problems[0]}{more}; export with the factory and options the run trained with"
        )


def tied_names(model: nn.Module) -> dict[str, str]:
    """{alias: name} of every tensor the model holds under several names (tied weights),
    `name` the first under which `state_dict` lists it."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    named: list[tuple[str, Any]] = [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]
    order = {name: i for i, name in enumerate(model.state_dict(keep_vars=True))}
    for name, tensor in sorted(named, key=lambda item: order.get(item[0], len(order))):
        if name not in order:
            continue  # a non-persistent buffer
        if id(tensor) in first:
            aliases[name] = first[id(tensor)]
        else:
            first[id(tensor)] = name
    return aliases
