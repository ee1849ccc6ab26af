"""Samples as the training loop fetches them: two tensors, or a user's Dataset.

Both say where a sample came from (`source`), so that a bad one is reported by
its index where it is read, not found later as "non-finite gradients": tensors
are checked once when they are built, a Dataset's inputs in every batch fetched
(its samples may be computed on the fly; the check costs one pass over the batch).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset, default_collate

from shoal.errors import DataError

REMEDY = "fix or drop that sample"


class TensorSamples:
    """Samples held as two tensors; a batch is one indexing operation."""

    def __init__(self, features: torch.Tensor, labels: torch.Tensor, source: str = "") -> None:
        where = f"{source}: " if source else ""
        if len(features) != len(labels):
            raise DataError(f"{where}{len(features)} feature rows but {len(labels)} labels")
        if labels.ndim != 1:
            raise DataError(
                f"{where}labels must be class ids of shape (n,), got shape {tuple(labels.shape)}"
            )
        if labels.is_floating_point() or labels.is_complex():
            fractional = torch.nonzero(labels != labels.round()).flatten()
            if len(fractional):
                row = int(fractional[0])
                raise DataError(
                    f"{source} sample {row}: label {float(labels[row])} is not a class id "
                    "(an integer); labels must be integer class ids"
                )
        if source and features.is_floating_point() and len(features):
            bad = ~torch.isfinite(features.reshape(len(features), -1))
            if bad.any():
                row, column = (int(i) for i in bad.nonzero()[0])
                value = float(features.reshape(len(features), -1)[row, column])
                raise DataError(
                    f"{source} sample {row}: feature {column} is not a finite number: {value}; "
                    f"{REMEDY}"
                )
        self.features = features
        self.labels = labels.long()
        self.source = source

    def __len__(self) -> int:
        return len(self.labels)

    def fetch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.features[indices], self.labels[indices]

    def all_labels(self) -> torch.Tensor:
        return self.labels


class DatasetSamples:
    """A user's torch Dataset of `(input, label)` pairs, collated per batch."""

    def __init__(self, dataset: Dataset[Any], source: str) -> None:
        self.dataset = dataset
        self.source = source

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def fetch(self, indices: torch.Tensor) -> Any:
        batch = default_collate([self.dataset[int(i)] for i in indices])
        inputs = batch[0] if isinstance(batch, list | tuple) and batch else None
        if isinstance(inputs, torch.Tensor) and inputs.is_floating_point() and len(inputs):
            finite = torch.isfinite(inputs.reshape(len(inputs), -1)).all(dim=1)
            if not finite.all():
                row = int(indices[int(torch.nonzero(~finite)[0, 0])])
                raise DataError(f"{self.source} sample {row}: its input holds nan or inf; {REMEDY}")
        return batch

    def all_labels(self) -> torch.Tensor:
        return torch.as_tensor([int(self.dataset[i][1]) for i in range(len(self))])


Samples = TensorSamples | DatasetSamples
