"""The classification task: cross-entropy training, loss and accuracy on held-out data."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from shoal.errors import ShoalError
from shoal.protocols.task import LossOutput, Task, move_to, rank_slice
from shoal.runtime.collectives import all_reduce_sum
from shoal.runtime.context import WorkerContext
from shoal.tasks.classification.config import (
    ClassificationTaskConfig,
    FileDataConfig,
    PythonDataConfig,
)
from shoal.tasks.classification.data import (
    ClassificationData,
    call_factory,
    load_files,
    make_synthetic,
    read_train_files,
)
from shoal.tasks.classification.model import build_mlp
from shoal.tasks.classification.samples import TensorSamples

DROPOUT_LAYERS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)


def load_data(config: ClassificationTaskConfig) -> ClassificationData:
    data = config.data
    if isinstance(data, FileDataConfig):
        return load_files(data)
    if isinstance(data, PythonDataConfig):
        return call_factory(data)
    return make_synthetic(data)


class ClassificationTask(Task):
    """Cross-entropy on (input, label) samples; reports loss and accuracy."""

    config_class: ClassVar[type[ClassificationTaskConfig]] = ClassificationTaskConfig

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        config = ctx.config.task
        assert isinstance(config, ClassificationTaskConfig)
        self.config = config
        self.data = load_data(config)
        if len(self.data.train) == 0:
            raise ShoalError("task.data: the training set is empty")
        if self.data.model is None:
            self.data.classes()  # fixed (and checked) now, before the model is built
        for warning in self.data.warnings:
            ctx.log.warning("%s", warning)

    @property
    def train_size(self) -> int:
        return len(self.data.train)

    def sample_labels(self) -> torch.Tensor:
        return self.data.train.all_labels()

    def load_train_files(self, paths: list[str]) -> list[int]:
        """Per-client files in task.data's format; the model's shape still comes from task.data."""
        options = self.config.data if isinstance(self.config.data, FileDataConfig) else None
        space = self.data.label_space()  # fixed before the samples change
        parts = read_train_files(paths, options, space)
        width = self.data.input_features()
        for path, part in zip(paths, parts, strict=True):
            if len(part) and int(part.features[0].numel()) != width:
                raise ShoalError(
                    f"{path}: samples have {int(part.features[0].numel())} features, "
                    f"task.data has {width}"
                )
        self.data.train = TensorSamples(
            torch.cat([p.features for p in parts]), torch.cat([p.labels for p in parts])
        )
        return [len(p) for p in parts]

    def build_model(self) -> nn.Module:
        if self.data.model is not None:
            return self.data.model
        return build_mlp(self.config.model, self.data.input_features(), self.data.classes())

    def set_tunable(self, model: nn.Module, name: str, value: float) -> None:
        """`dropout`: the probability of every dropout layer of the model (MLP or user module)."""
        if name != "dropout":
            super().set_tunable(model, name, value)
        layers = [m for m in model.modules() if isinstance(m, DROPOUT_LAYERS)]
        if not layers:
            raise ShoalError(
                "strategy.search_space.dropout: the model has no nn.Dropout layer to tune; "
                "set task.model.dropout > 0 so that the MLP is built with them"
            )
        for layer in layers:
            layer.p = value

    def train_batch(self, indices: torch.Tensor) -> Any:
        return move_to(self.data.train.fetch(indices), self.ctx.device)

    def loss(self, model: nn.Module, batch: Any) -> LossOutput:
        inputs, labels = batch
        logits = model(inputs)
        loss_sum = F.cross_entropy(logits, labels, reduction="sum")
        correct = (logits.detach().argmax(dim=1) == labels).sum()
        return LossOutput(loss_sum, int(labels.shape[0]), {"accuracy": correct})

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        samples = self.data.valid
        if samples is None or split != "valid":
            return {}
        was_training = model.training
        model.eval()
        part = rank_slice(len(samples), self.ctx.rank, self.ctx.world_size)
        batch_size = self.ctx.config.train.eval_batch_size or self.ctx.config.train.batch_size
        loss_sum, correct, count = 0.0, 0.0, 0.0
        for start in range(part.start, part.stop, batch_size):
            indices = torch.arange(start, min(start + batch_size, part.stop))
            inputs, labels = move_to(samples.fetch(indices), self.ctx.device)
            logits = model(inputs)
            loss_sum += float(F.cross_entropy(logits, labels, reduction="sum"))
            correct += float((logits.argmax(dim=1) == labels).sum())
            count += len(indices)
        model.train(was_training)
        loss_sum, correct, count = all_reduce_sum(self.ctx, [loss_sum, correct, count])
        return {"loss": loss_sum / max(count, 1), "accuracy": correct / max(count, 1)}
