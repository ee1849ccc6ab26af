"""The module task: the user's `nn.Module`, datasets and loss, trained like shoal's own tasks.

A sample is an item of the user's Dataset (a tensor, a tuple or a dict); a batch is
the user's `collate` of the items at the batch's indices (torch's default collate
otherwise), on the worker's device. An IterableDataset is read once, in order, into
memory and indexed, so every strategy splits it as it splits a map-style one and a
resume lands on the same sample. The loss is a sum over the batch's samples
(`losses.py`); evaluation sums the loss and the metrics over each rank's slice of a
split and adds them up over the ranks.

What model-side strategies ask of it (capabilities) is `layout.py`'s: FSDP's units,
a tensor-parallel plan, the model cut into pipeline stages.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils.data import IterableDataset
from torch.utils.data._utils.collate import default_collate

from shoal.errors import ShoalError
from shoal.protocols.task import LossOutput, Task, move_to, rank_slice
from shoal.runtime.collectives import all_reduce_sum
from shoal.runtime.context import WorkerContext
from shoal.tasks.module import layout
from shoal.tasks.module.config import ModuleTaskConfig
from shoal.tasks.module.factory import built, held
from shoal.tasks.module.losses import LOSSES, Loss, user_loss
from shoal.tasks.module.weights import Pretrained
from shoal.training.materialise import draw_base, materialise, parameters_on_meta


class ModuleTask(Task):
    """Any `nn.Module` with its datasets and a loss; see the module docstring."""

    config_class: ClassVar[type[ModuleTaskConfig]] = ModuleTaskConfig

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        config = self.section
        assert isinstance(config, ModuleTaskConfig)
        self.config = config
        self.built = built(config, ctx.config.train.seed)  # the config check's call
        self.splits = {name: _indexed(data) for name, data in self.built.splits.items()}
        if len(self.splits["train"]) == 0:
            raise ShoalError(f"task.factory: {config.factory}: 'train' has no samples")
        self.collate = self.built.collate or default_collate
        self._weights_told = False
        self._meta_probe: bool | None = None  # whether the model function runs on meta
        self._owners: tuple[nn.Module | None, dict[int, Any]] = (None, {})  # init_module's
        loss = self.built.loss
        self.loss_fn: Loss = (
            LOSSES[loss]
            if isinstance(loss, str)
            else user_loss(loss, f"task.factory {config.factory}")
        )

    # ------------------------------------------------------------ the Task contract
    @property
    def train_size(self) -> int:
        return len(self.splits["train"])

    def build_model(self) -> nn.Module:
        """A fresh model: the factory's callable built on the meta device and initialised
        unit by unit (`training/materialise.py`: the values every sharded layout holds
        pieces of, for the caller's seed); else (a module the factory returned, or a
        function that loads weights itself) the model as the factory gives it."""
        meta = self.build_meta_model()
        if meta is None:
            given = self.built.model
            model = held(copy.deepcopy(given) if isinstance(given, nn.Module) else self._made())
            weights = self.weights_for(model)
            if weights is not None:
                for name, tensor in model.state_dict().items():
                    if weights.has(name):
                        weights.read_into(name, tensor)
            return model
        try:
            materialise(meta, self, draw_base(), torch.device("cpu"), None, self.weights_for(meta))
        except ShoalError as exc:
            if str(exc).startswith("task."):
                raise
            raise ShoalError(f"task.factory: {self.config.factory}: {exc}") from None
        return meta

    # ------------------------------------------------------------ built on meta (MetaBuild)
    def build_meta_model(self) -> nn.Module | None:
        """The factory's callable, called with parameters on the meta device. None: the
        factory returned a module (it exists whole already), or its function does not
        build on the meta device — one that loads weights itself (`from_pretrained`
        refuses it) would otherwise have its weights dropped; `[task] weights` loads them
        into any layout instead."""
        if isinstance(self.built.model, nn.Module) or not self._builds_on_meta():
            return None
        with parameters_on_meta():
            return held(self._made())

    def _builds_on_meta(self) -> bool:
        """Whether the factory's function runs under the meta device (a probe: nothing is
        allocated, no generator drawn)."""
        if self._meta_probe is None:
            try:
                with torch.device("meta"), torch.random.fork_rng(devices=[]):
                    self.built.model()
                self._meta_probe = True
            except Exception:
                self._meta_probe = False
                if self.ctx.is_main:
                    self.ctx.log.info(
                        "task.factory: %s: its model function does not run on the meta "
                        "device (it loads weights itself?): every process builds it whole; "
                        "[task] weights loads weights into any layout instead",
                        self.config.factory,
                    )
        return self._meta_probe

    def _made(self) -> nn.Module:
        made = self.built.model()
        if not isinstance(made, nn.Module):
            raise ShoalError(
                f"task.factory: {self.config.factory}: 'model' returned a "
                f"{type(made).__name__}; it must return an nn.Module"
            )
        return made

    def init_units(self, model: nn.Module) -> list[str]:
        """The repeated blocks, each a unit of its own."""
        lists = layout.block_lists(model)
        return (
            [f"{lists[0][0]}.{name}" if lists[0][0] else name for name, _ in lists[0][1]]
            if lists
            else []
        )

    def weights_for(self, model: nn.Module) -> Pretrained | None:
        """`[task] weights`, matched to `model`'s names; what it lacks or has beyond the
        model is logged (once per process)."""
        if self.config.weights is None:
            return None
        weights = Pretrained(self.config.weights, model)
        if self.ctx.is_main and not self._weights_told:
            self._weights_told = True
            missing = weights.missing(model)
            self.ctx.log.info(
                "task.weights: %d tensors from %s%s%s",
                len(weights.keys),
                self.config.weights,
                f"; initialised, not in it: {_some(missing)}" if missing else "",
                f"; in it, not in the model: {_some(weights.unexpected)}"
                if weights.unexpected
                else "",
            )
        return weights

    def init_module(self, model: nn.Module, module: nn.Module) -> None:
        """The factory's `init(module)`; else a Hugging Face model's own `_init_weights`
        (of the sub-model the module belongs to); else the module's `reset_parameters`."""
        if self.built.init is not None:
            self.built.init(module)
            return
        if self._owners[0] is not model:
            self._owners = (model, hf_owners(model))
        owner = self._owners[1].get(id(module))
        if owner is not None:
            owner._init_weights(module)
        else:
            reset = getattr(module, "reset_parameters", None)
            if callable(reset):
                reset()

    def train_batch(self, indices: torch.Tensor) -> Any:
        return self._batch("train", indices)

    def _batch(self, split: str, indices: torch.Tensor) -> Any:
        data = self.splits[split]
        return move_to(self.collate([data[i] for i in indices.tolist()]), self.ctx.device)

    def loss(self, model: nn.Module, batch: Any) -> LossOutput:
        total, count, sums = self.loss_fn(model, batch)
        metrics = self.built.metrics
        if metrics is not None:
            with torch.no_grad():
                for name, (value, _) in metrics(model, batch).items():
                    sums[name] = torch.as_tensor(value, dtype=torch.float64)
        return LossOutput(total, count, sums)

    def eval_splits(self) -> list[str]:
        return ["valid"] if "valid" in self.splits else []

    def test_splits(self) -> list[str]:
        return ["test"] if "test" in self.splits else []

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        """The loss per sample and each metric's sum / count over the split (collective)."""
        data = self.splits.get(split)
        if data is None:
            return {}
        was_training = model.training
        model.eval()
        part = rank_slice(len(data), self.ctx.rank, self.ctx.world_size)
        train = self.ctx.config.train
        size = train.eval_batch_size or train.batch_size
        sums: dict[str, list[float]] = {"loss": [0.0, 0.0]}
        for start in range(part.start, part.stop, size):
            batch = self._batch(split, torch.arange(start, min(start + size, part.stop)))
            total, count, extra = self.loss_fn(model, batch)
            sums["loss"][0] += float(total)
            sums["loss"][1] += count
            for name, value in extra.items():
                entry = sums.setdefault(name, [0.0, 0.0])
                entry[0] += float(value)
                entry[1] += count
            if self.built.metrics is not None:
                for name, (value, n) in self.built.metrics(model, batch).items():
                    entry = sums.setdefault(name, [0.0, 0.0])
                    entry[0] += float(value)
                    entry[1] += float(n)
        model.train(was_training)
        names = sorted(sums)
        flat = all_reduce_sum(self.ctx, [v for name in names for v in sums[name]])
        return {name: flat[2 * i] / max(flat[2 * i + 1], 1.0) for i, name in enumerate(names)}

    def summary(self) -> dict[str, Any]:
        return {f"{name}_samples": len(data) for name, data in self.splits.items()}

    # ------------------------------------------------------------ capabilities (layout.py)
    def shard_units(self, model: nn.Module) -> list[nn.Module]:
        return layout.repeated_blocks(model)

    def tensor_plan(self, model: nn.Module, sequence_parallel: bool) -> dict[str, Any]:
        return layout.family_plan(model, sequence_parallel)

    def pipeline_block_names(self, model: nn.Module) -> list[str]:
        return layout.cutter(model).names

    def pipeline_stage(self, model: nn.Module, first: int, last: int) -> nn.Module:
        return layout.cutter(model).stage(first, last)

    def pipeline_batch(self, batch: Any) -> tuple[torch.Tensor, Any]:
        return layout.stage_batch(self.config, self.built.loss, batch)

    def pipeline_loss(self, output: torch.Tensor, target: Any) -> LossOutput:
        total, count = layout.stage_loss(self.built.loss, output, target)
        return LossOutput(total, count)


def _some(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def hf_owners(model: nn.Module) -> dict[int, Any]:
    """For each module (by id), the innermost Hugging Face PreTrainedModel holding it (itself
    included), whose `_init_weights` initialises it; absent for another model's modules."""
    owners: dict[int, Any] = {}

    def walk(module: nn.Module, owner: Any) -> None:
        if hasattr(module, "_init_weights") and hasattr(module, "config"):
            owner = module
        if owner is not None:
            owners[id(module)] = owner
        for child in module.children():
            walk(child, owner)

    walk(model, None)
    return owners


def _indexed(data: Any) -> Any:
    """A dataset indexable by sample: a map-style one as it is, an iterable one read once."""
    if isinstance(data, IterableDataset):
        return list(data)
    return data
