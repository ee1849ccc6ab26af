"""A user's own model and data for `source = "python"`: any nn.Module trains under shoal.

Small 12x12 images of a bright stroke, horizontal or vertical, in noise: a
convolutional net tells them apart, and the factory returns it with the data.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset


def _strokes(count: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(count, 1, 12, 12, generator=g)
    labels = torch.randint(0, 2, (count,), generator=g)
    where = torch.randint(2, 10, (count,), generator=g)
    for i in range(count):
        if labels[i] == 0:
            images[i, 0, where[i], 3:9] += 0.5
        else:
            images[i, 0, 3:9, where[i]] += 0.5
    return TensorDataset(images, labels)


class StrokeNet(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(channels, 2)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images).flatten(1))


def build(samples: int = 4000, channels: int = 16) -> dict[str, object]:
    """Called by shoal with `[task.data] options` as keyword arguments."""
    return {
        "model": StrokeNet(channels),
        "train": _strokes(samples, seed=1),
        "valid": _strokes(samples // 4, seed=2),
    }
