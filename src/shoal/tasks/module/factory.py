"""The user's factory: imported, called once per process, and its result checked key by key.

The config's validation calls it (`ModuleTaskConfig.check`), so a factory that does not
import or returns something else is one line at `shoal config validate`, naming the
key and the type it got; the task then takes the same result (`built`), so the
factory runs once per process.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset

from shoal.errors import ShoalError
from shoal.tasks.user_code import import_factory

LOSSES = ("cross_entropy", "mse", "causal_lm")
KEYS = ("model", "train", "valid", "test", "collate", "loss", "metrics", "init")


@dataclass
class Built:
    """What a factory returned, checked."""

    model: nn.Module | Callable[[], nn.Module]
    splits: dict[str, Any]  # "train", and "valid" / "test" when given
    loss: str | Callable[[nn.Module, Any], tuple[torch.Tensor, int]]
    collate: Callable[[list[Any]], Any] | None = None
    metrics: Callable[[nn.Module, Any], dict[str, tuple[Any, Any]]] | None = None
    init: Callable[[nn.Module], None] | None = None


_BUILT: dict[str, Built] = {}


def _key(config: Any, seed: int) -> str:
    return json.dumps([config.factory, config.options, config.import_dir, seed], sort_keys=True)


def built(config: Any, seed: int) -> Built:
    """The factory's checked result for this config (called once per process), called with
    torch's generator seeded by `seed` (and put back after): a module it builds is then the
    same in every process of the job, and in the local run of the same seed."""
    key = _key(config, seed)
    if key not in _BUILT:
        function = import_factory(config.factory, config.import_dir)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            try:
                result = function(**config.options)
            except TypeError as exc:
                options = _options(config.options)
                raise ShoalError(f"{config.factory}({options}): {exc}") from None
        _BUILT[key] = _check(result, config.factory)
    return _BUILT[key]


def check_factory(config: Any, seed: int) -> tuple[str, str] | None:
    """(field, message) of what is wrong with the factory or its result; None: nothing."""
    try:
        built(config, seed)
    except ShoalError as exc:
        field = "options" if "unexpected keyword" in str(exc) else "factory"
        return field, f"{config.factory}: {exc}"
    return None


def _options(options: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in options.items())


def _type(value: Any) -> str:
    return type(value).__name__


def _check(result: Any, factory: str) -> Built:
    if not isinstance(result, dict):
        raise ShoalError(
            f"returned a {_type(result)}; return a dict with 'model', 'train' and 'loss' "
            f"(optionally {', '.join(repr(k) for k in KEYS[2:] if k != 'loss')})"
        )
    unknown = sorted(set(result) - set(KEYS))
    if unknown:
        raise ShoalError(f"returned unknown keys {unknown}; allowed: {', '.join(KEYS)}")
    for needed in ("model", "train", "loss"):
        if needed not in result:
            raise ShoalError(f"returned no {needed!r}; its result needs 'model', 'train', 'loss'")
    model = result["model"]
    if not (isinstance(model, nn.Module) or callable(model)):
        raise ShoalError(
            f"'model' is a {_type(model)}; give an nn.Module or a function of no argument "
            "returning one"
        )
    splits = {}
    for split in ("train", "valid", "test"):
        data = result.get(split)
        if data is None:
            continue
        if not _is_dataset(data):
            raise ShoalError(
                f"'{split}' is a {_type(data)}; give a map-style Dataset (__getitem__ and "
                "__len__) or an IterableDataset"
            )
        splits[split] = data
    loss = result["loss"]
    if isinstance(loss, str) and loss not in LOSSES:
        raise ShoalError(f"'loss' = {loss!r}; choose {', '.join(LOSSES)} or give a function")
    if not isinstance(loss, str) and not callable(loss):
        raise ShoalError(
            f"'loss' is a {_type(loss)}; give one of {', '.join(LOSSES)} or a function "
            "loss(model, batch) -> (summed_loss, count)"
        )
    for hook in ("collate", "metrics", "init"):
        if result.get(hook) is not None and not callable(result[hook]):
            raise ShoalError(f"'{hook}' is a {_type(result[hook])}; give a function")
    return Built(
        model, splits, loss, result.get("collate"), result.get("metrics"), result.get("init")
    )


def _is_dataset(data: Any) -> bool:
    if isinstance(data, IterableDataset | Dataset):
        return True
    return hasattr(data, "__getitem__") and hasattr(data, "__len__")


def on_meta(result: Built) -> nn.Module:
    """A model to check names and shapes against: the factory's callable called on the meta
    device (no memory, no init), or the module the factory built (left as it is)."""
    model = result.model
    if isinstance(model, nn.Module):
        with torch.device("meta"):
            return held(copy.deepcopy(model).to("meta"))
    with torch.device("meta"):
        made = model()
    if not isinstance(made, nn.Module):
        raise ShoalError(f"'model' returned a {_type(made)}; it must return an nn.Module")
    return held(made)


def held(model: nn.Module) -> nn.Module:
    """The model as shoal holds it, for every strategy alike: a GPT-2-style attention
    unfused (`families.py`)."""
    from shoal.tasks.module.families import is_gpt2_style, unfuse

    return unfuse(model) if is_gpt2_style(model) else model
