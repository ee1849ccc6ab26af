"""Classification samples: synthetic, from CSV/NPZ files, or from a user's factory."""

from __future__ import annotations

import csv
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from shoal.errors import DataError, ShoalError
from shoal.tasks.classification.config import (
    FileDataConfig,
    PythonDataConfig,
    SyntheticDataConfig,
)


class TensorSamples:
    """Samples held as two tensors; a batch is one indexing operation."""

    def __init__(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        if len(features) != len(labels):
            raise DataError(f"{len(features)} feature rows but {len(labels)} labels")
        self.features = features
        self.labels = labels.long()

    def __len__(self) -> int:
        return len(self.labels)

    def fetch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.features[indices], self.labels[indices]

    def all_labels(self) -> torch.Tensor:
        return self.labels


class DatasetSamples:
    """A user's torch Dataset of `(input, label)` pairs, collated per batch."""

    def __init__(self, dataset: Dataset[Any]) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def fetch(self, indices: torch.Tensor) -> Any:
        return default_collate([self.dataset[int(i)] for i in indices])

    def all_labels(self) -> torch.Tensor:
        return torch.as_tensor([int(self.dataset[i][1]) for i in range(len(self))])


Samples = TensorSamples | DatasetSamples


@dataclass
class ClassificationData:
    train: Samples
    valid: Samples | None
    model: torch.nn.Module | None = None
    num_classes: int | None = None

    def input_features(self) -> int:
        first = self.train.fetch(torch.tensor([0]))[0]
        return int(first[0].numel())

    def classes(self) -> int:
        if self.num_classes is not None:
            return self.num_classes
        labels = [self.train.all_labels()]
        if self.valid is not None:
            labels.append(self.valid.all_labels())
        return int(max(int(t.max()) for t in labels if len(t)) + 1)


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
    return _split(x.astype(np.float32), y.astype(np.int64), config.valid_fraction, config.seed)


def _read_csv(path: Path, label_column: str | None) -> tuple[np.ndarray, np.ndarray]:
    """A CSV with a header row; numeric features; numeric or named labels."""
    try:
        handle = open(path, newline="", encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror}") from None
    with handle:
        reader = csv.reader(handle)
        try:
            header = next(reader)
        except StopIteration:
            raise DataError(
                f"{path}:1: empty file; expected a header row of column names"
            ) from None
        except (csv.Error, UnicodeDecodeError) as exc:
            raise DataError(f"{path}:1: not a readable CSV text: {exc}") from None
        header = [name.strip() for name in header]
        if label_column is None:
            label_at = len(header) - 1
        elif label_column in header:
            label_at = header.index(label_column)
        else:
            raise DataError(
                f"{path}:1: no column {label_column!r} (task.data.label_column); "
                f"columns: {', '.join(header)}"
            )
        if len(header) < 2:
            raise DataError(f"{path}:1: need at least one feature column and a label column")
        rows: list[list[float]] = []
        raw_labels: list[str] = []
        try:
            for row in reader:
                line = reader.line_num
                if not row or all(not cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    raise DataError(
                        f"{path}:{line}: expected {len(header)} columns, got {len(row)}"
                    )
                values = []
                for index, cell in enumerate(row):
                    if index == label_at:
                        continue
                    try:
                        values.append(float(cell))
                    except ValueError:
                        raise DataError(
                            f"{path}:{line}: column {header[index]!r}: not a number: {cell!r}"
                        ) from None
                rows.append(values)
                raw_labels.append(row[label_at].strip())
        except (csv.Error, UnicodeDecodeError) as exc:
            raise DataError(f"{path}:{reader.line_num}: not a readable CSV text: {exc}") from None
    if not rows:
        raise DataError(f"{path}: no data rows after the header")
    try:
        labels = np.array([int(v) for v in raw_labels], dtype=np.int64)
    except ValueError:
        names = sorted(set(raw_labels))  # named classes: ids in sorted order of the names
        labels = np.array([names.index(v) for v in raw_labels], dtype=np.int64)
    if labels.min() < 0:
        raise DataError(f"{path}: labels must be >= 0 class ids or class names")
    return np.asarray(rows, dtype=np.float32), labels


def _read_npz(path: Path, features_key: str, labels_key: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable NPZ archive: {exc}") from None
    with archive:
        for key, field in ((features_key, "features_key"), (labels_key, "labels_key")):
            if key not in archive.files:
                arrays = ", ".join(archive.files)
                raise DataError(f"{path}: no array {key!r} (task.data.{field}); arrays: {arrays}")
        x, y = archive[features_key], archive[labels_key]
    if x.ndim < 2 or y.ndim != 1 or len(x) != len(y):
        raise DataError(
            f"{path}: expected features of shape (n, ...) and labels of shape (n,), "
            f"got {x.shape} and {y.shape}"
        )
    if not np.issubdtype(y.dtype, np.integer) or (len(y) and y.min() < 0):
        raise DataError(f"{path}: labels must be integer class ids >= 0, got dtype {y.dtype}")
    return x.astype(np.float32), y.astype(np.int64)


def _read_file(path: Path, config: FileDataConfig) -> tuple[np.ndarray, np.ndarray]:
    if path.suffix.lower() == ".npz":
        return _read_npz(path, config.features_key, config.labels_key)
    return _read_csv(path, config.label_column)


def read_train_files(paths: list[str], config: FileDataConfig | None) -> list[TensorSamples]:
    """Each file's samples, read with task.data's format options when it has them."""
    options = config or FileDataConfig.model_construct(
        path="", label_column=None, features_key="x", labels_key="y"
    )
    samples = []
    for path in paths:
        x, y = _read_file(Path(path), options)
        samples.append(TensorSamples(torch.from_numpy(x), torch.from_numpy(y)))
    return samples


def load_files(config: FileDataConfig) -> ClassificationData:
    x, y = _read_file(Path(config.path), config)
    if config.valid_path is None:
        return _split(x, y, config.valid_fraction, config.split_seed)
    vx, vy = _read_file(Path(config.valid_path), config)
    if vx.shape[1:] != x.shape[1:]:
        raise DataError(
            f"{config.valid_path}: samples of shape {vx.shape[1:]}, training has {x.shape[1:]}"
        )
    return ClassificationData(
        train=TensorSamples(torch.from_numpy(x), torch.from_numpy(y)),
        valid=TensorSamples(torch.from_numpy(vx), torch.from_numpy(vy)),
    )


def _as_samples(value: Any, what: str) -> Samples:
    if (
        isinstance(value, tuple | list)
        and len(value) == 2
        and all(isinstance(v, torch.Tensor) for v in value)
    ):
        return TensorSamples(value[0], value[1])
    if hasattr(value, "__getitem__") and hasattr(value, "__len__"):
        return DatasetSamples(value)
    raise ShoalError(
        f"task.data.factory: {what} must be a torch Dataset or a (features, labels) tensor pair, "
        f"got {type(value).__name__}"
    )


def import_factory(spec: str, search_dirs: list[Path]) -> Any:
    """Import `module:function`, looking in `search_dirs` first (the config's folder, the cwd)."""
    module_name, _, function_name = spec.partition(":")
    for folder in reversed(search_dirs):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ShoalError(f"task.data.factory: cannot import {module_name!r}: {exc}") from None
    try:
        return getattr(module, function_name)
    except AttributeError:
        raise ShoalError(
            f"task.data.factory: module {module_name!r} has no function {function_name!r}"
        ) from None


def call_factory(config: PythonDataConfig, search_dirs: list[Path]) -> ClassificationData:
    built = import_factory(config.factory, search_dirs)(**config.options)
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
    valid = built.get("valid")
    return ClassificationData(
        train=_as_samples(built["train"], "'train'"),
        valid=_as_samples(valid, "'valid'") if valid is not None else None,
        model=model,
        num_classes=built.get("num_classes"),
    )
