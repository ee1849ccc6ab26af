"""Your own models, as `[task] type = "module"` takes them: a factory returns the model, the
datasets and the loss. Two examples, both built from configs (nothing is downloaded):

- `causal_lm`: a Hugging Face Llama (or any `AutoModelForCausalLM` config) on the bytes of
  a text file, `loss = "causal_lm"`;
- `vision`: a Hugging Face Vision Transformer on scikit-learn's 8 x 8 digits,
  `loss = "cross_entropy"`.

The configs beside this file (hf-llama.toml, hf-vit.toml) name them; change only their
`[strategy]` to train the same model data-parallel, fully sharded, tensor-parallel or in a
pipeline.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

HERE = Path(__file__).resolve().parent


class ByteWindows(Dataset[torch.Tensor]):
    """Consecutive windows of `length` bytes of a text: a causal LM's samples."""

    def __init__(self, tokens: torch.Tensor, length: int) -> None:
        self.tokens, self.length = tokens, length

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.tokens[index * self.length : (index + 1) * self.length]


def _bytes(path: str) -> torch.Tensor:
    file = (HERE / path).resolve()
    opener = gzip.open if file.suffix == ".gz" else open
    with opener(file, "rb") as handle:
        return torch.frombuffer(bytearray(handle.read()), dtype=torch.uint8).long()


def causal_lm(
    text: str,
    layers: int = 4,
    width: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    context: int = 128,
    valid_fraction: float = 0.1,
) -> dict[str, Any]:
    """A Llama of `layers` blocks on the bytes of `text` (relative to this file)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256,
        hidden_size=width,
        intermediate_size=4 * width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=context,
        tie_word_embeddings=False,
    )
    tokens = _bytes(text)
    cut = int(len(tokens) * (1 - valid_fraction))
    return {
        # a function: each process builds the model itself, from the job's seed
        "model": lambda: LlamaForCausalLM(config),
        "train": ByteWindows(tokens[:cut], context),
        "valid": ByteWindows(tokens[cut:], context),
        "loss": "causal_lm",
    }


class Digits(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.images[index], "labels": self.labels[index]}


def vision(width: int = 64, layers: int = 4, valid: int = 297) -> dict[str, Any]:
    """A Vision Transformer over 2 x 2 patches of scikit-learn's digits (10 classes)."""
    from sklearn.datasets import load_digits
    from transformers import ViTConfig, ViTForImageClassification

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target)
    config = ViTConfig(
        image_size=8,
        patch_size=2,
        num_channels=1,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=2 * width,
        num_labels=10,
    )
    return {
        "model": lambda: ViTForImageClassification(config),
        "train": Digits(images[:-valid], labels[:-valid]),
        "valid": Digits(images[-valid:], labels[-valid:]),
        "loss": "cross_entropy",
    }
