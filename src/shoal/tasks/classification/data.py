"""Classification data: synthetic, from CSV/NPZ files, or from a user's factory.

Whatever the source, the number of classes is fixed once, by `labels.py`: declared
(`task.data.classes`, the factory's `num_classes`) or inferred from the labels of
every split together, with the checks that catch a label set that looks wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shoal.errors import DataError, ShoalError
from shoal.tasks.classification.config import (
    FileDataConfig,
    PythonDataConfig,
    SyntheticDataConfig,
)
from shoal.tasks.classification.files import read_table
from shoal.tasks.classification.labels import LabelColumn, LabelSpace, encode, fit_labels
from shoal.tasks.classification.samples import DatasetSamples, Samples, TensorSamples
from shoal.tasks.user_code import import_factory

FACTORY_CLASSES = "'num_classes' in the factory's result"


def _sample_locator(source: str) -> Callable[[int], str]:
    return lambda row: f"{source} sample {row}"


@dataclass
class ClassificationData:
    train: Samples
    valid: Samples | None
    model: torch.nn.Module | None = None
    num_classes: int | None = None
    label_names: tuple[str, ...] | None = None  # class i is label_names[i] for named labels
    warnings: list[str] = field(default_factory=list)  # about the data, for the run's log

    def input_features(self) -> int:
        first = self.train.fetch(torch.tensor([0]))[0]
        return int(first[0].numel())

    def classes(self) -> int:
        """The number of classes; inferred (and checked) from every split's labels if not set."""
        if self.num_classes is None:
            columns = [
                LabelColumn(s.all_labels().numpy(), _sample_locator(s.source))
                for s in (self.train, self.valid)
                if s is not None
            ]
            space, warnings = fit_labels(columns, None, FACTORY_CLASSES)
            self.num_classes = space.num_classes
            self.warnings.extend(warnings)
        return self.num_classes

    def label_space(self) -> LabelSpace:
        return LabelSpace(self.classes(), self.label_names)


def _split(
    features: np.ndarray, labels: np.ndarray, valid_fraction: float, seed: int
) -> ClassificationData:
    order = np.random.default_rng(seed).permutation(len(labels))
    n_valid = max(1, round(len(labels) * valid_fraction))
    if n_valid >= len(labels):
        raise DataError(f"{len(labels)} samples are too few to hold out {valid_fraction:.0%}")
    valid, train = order[:n_valid], order[n_valid:]
    return ClassificationData(
        train=TensorSamples(torch.from_numpy(features[train]), torch.from_numpy(labels[train])),
        valid=TensorSamples(torch.from_numpy(features[valid]), torch.from_numpy(labels[valid])),
    )


def make_synthetic(config: SyntheticDataConfig) -> ClassificationData:
    """Gaussian clusters on hypercube vertices, mixed into `features` dimensions.

    After Guyon's design (the "Madelon" generator, also behind scikit-learn's
    make_classification): class clusters sit on distinct vertices of a hypercube
    of side 2 * class_sep in the informative subspace, each stretched by a random
    linear map; half of the remaining dimensions are random linear combinations
    of the informative ones and the rest pure noise; a fraction `noise` of labels
    is replaced at random. Fully determined by `seed`.
    """
    rng = np.random.default_rng(config.seed)
    n_clusters = config.classes * config.clusters_per_class
    vertices: set[tuple[int, ...]] = set()
    while len(vertices) < n_clusters:
        vertices.add(tuple(rng.integers(0, 2, size=config.informative).tolist()))
    centroids = (np.array(sorted(vertices), dtype=np.float64) * 2 - 1) * config.class_sep
    centroids = centroids[rng.permutation(n_clusters)]

    sizes = np.full(n_clusters, config.samples // n_clusters)
    sizes[: config.samples % n_clusters] += 1
    informative, labels = [], []
    for cluster, size in enumerate(sizes):
        stretch = rng.uniform(-1, 1, size=(config.informative, config.informative))
        points = rng.standard_normal((size, config.informative)) @ stretch + centroids[cluster]
        informative.append(points)
        labels.append(np.full(size, cluster % config.classes))
    x_inf = np.concatenate(informative)
    y = np.concatenate(labels)

    extra = config.features - config.informative
    n_redundant = extra // 2
    redundant = x_inf @ rng.uniform(-1, 1, size=(config.informative, n_redundant))
    noise = rng.standard_normal((config.samples, extra - n_redundant))
    x = np.concatenate([x_inf, redundant, noise], axis=1)
    x = x[:, rng.permutation(config.features)]

    flip = rng.random(config.samples) < config.noise
    y[flip] = rng.integers(0, config.classes, size=int(flip.sum()))

    x = (x - x.mean(axis=0)) / (x.std(axis=0) + 1e-12)
    data = _split(x.astype(np.float32), y.astype(np.int64), config.valid_fraction, config.seed)
    data.num_classes = config.classes
    return data


def read_train_files(
    paths: list[str], config: FileDataConfig | None, space: LabelSpace
) -> list[TensorSamples]:
    """Each file's samples, read with task.data's format options when it has them, their
    labels coded in the classes of task.data (`space`)."""
    options = config or FileDataConfig.model_construct(
        path="", label_column=None, features_key="x", labels_key="y"
    )
    samples = []
    for path in paths:
        table = read_table(Path(path), options)
        labels = encode(table.labels, space, "task.data")
        samples.append(TensorSamples(torch.from_numpy(table.features), torch.from_numpy(labels)))
    return samples


def load_files(config: FileDataConfig) -> ClassificationData:
    """task.data's file (and validation file): labels are coded over both at once."""
    tables = [read_table(Path(config.path), config)]
    if config.valid_path is not None:
        tables.append(read_table(Path(config.valid_path), config))
        x, vx = tables[0].features, tables[1].features
        if vx.shape[1:] != x.shape[1:]:
            raise DataError(
                f"{config.valid_path}: samples of shape {vx.shape[1:]}, training has {x.shape[1:]}"
            )
    space, warnings = fit_labels([t.labels for t in tables], config.classes, "task.data.classes")
    x, y = tables[0].features, encode(tables[0].labels, space, "task.data")
    if config.valid_path is None:
        data = _split(x, y, config.valid_fraction, config.split_seed)
    else:
        vy = encode(tables[1].labels, space, "task.data")
        data = ClassificationData(
            train=TensorSamples(torch.from_numpy(x), torch.from_numpy(y)),
            valid=TensorSamples(torch.from_numpy(tables[1].features), torch.from_numpy(vy)),
        )
    data.num_classes, data.label_names = space.num_classes, space.names
    data.warnings = [w for t in tables for w in t.warnings] + warnings
    return data


def _as_samples(value: Any, what: str, factory: str) -> Samples:
    source = f"task.data.factory {factory}: {what}"
    if (
        isinstance(value, tuple | list)
        and len(value) == 2
        and all(isinstance(v, torch.Tensor) for v in value)
    ):
        return TensorSamples(value[0], value[1], source)
    if hasattr(value, "__getitem__") and hasattr(value, "__len__"):
        return DatasetSamples(value, source)
    raise ShoalError(
        f"task.data.factory: {what} must be a torch Dataset or a (features, labels) tensor pair, "
        f"got {type(value).__name__}"
    )


def call_factory(config: PythonDataConfig) -> ClassificationData:
    try:
        function = import_factory(config.factory, config.import_dir)
    except ShoalError as exc:
        raise ShoalError(f"task.data.factory: {exc}") from None
    built = function(**config.options)
    if isinstance(built, tuple) and len(built) == 3:
        built = {"model": built[0], "train": built[1], "valid": built[2]}
    if not isinstance(built, dict) or "train" not in built:
        raise ShoalError(
            f"task.data.factory: {config.factory} must return a dict with 'train' "
            "(and optionally 'valid', 'model', 'num_classes'), or (model, train, valid)"
        )
    unknown = set(built) - {"train", "valid", "model", "num_classes"}
    if unknown:
        raise ShoalError(f"task.data.factory: unexpected keys {sorted(unknown)} in its result")
    model = built.get("model")
    if model is not None and not isinstance(model, torch.nn.Module):
        raise ShoalError(
            f"task.data.factory: 'model' must be an nn.Module, got {type(model).__name__}"
        )
    num_classes = built.get("num_classes")
    if num_classes is not None and (not isinstance(num_classes, int) or num_classes < 2):
        raise ShoalError(
            f"task.data.factory: 'num_classes' must be an integer >= 2, got {num_classes!r}"
        )
    valid = built.get("valid")
    data = ClassificationData(
        train=_as_samples(built["train"], "'train'", config.factory),
        valid=_as_samples(valid, "'valid'", config.factory) if valid is not None else None,
        model=model,
        num_classes=num_classes,
    )
    if num_classes is not None:  # tensors are cheap to check against it; a Dataset is not
        for samples in (data.train, data.valid):
            if isinstance(samples, TensorSamples):
                column = LabelColumn(samples.labels.numpy(), _sample_locator(samples.source))
                encode(column, LabelSpace(num_classes), FACTORY_CLASSES)
    return data
