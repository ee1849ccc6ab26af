"""The multi-layer perceptron of the classification task."""

from __future__ import annotations

from torch import nn

from shoal.tasks.classification.config import MLPConfig

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "silu": nn.SiLU}


def build_mlp(config: MLPConfig, in_features: int, classes: int) -> nn.Sequential:
    """Flatten -> [Linear -> activation -> dropout] per hidden width -> Linear to logits."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = in_features
    for hidden in config.hidden:
        layers += [nn.Linear(width, hidden), ACTIVATIONS[config.activation]()]
        if config.dropout > 0:
            layers.append(nn.Dropout(config.dropout))
        width = hidden
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)
