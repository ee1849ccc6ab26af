"""Factories of `[task] type = "module"` for the tests: Hugging Face models built from tiny
random configs (nothing downloaded) on tinyshakespeare's bytes or scikit-learn's digits,
and a model of the user's own with dict batches and its own loss.

Each is imported by the test's job from this folder (`import_dir`), as a user's module is.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset

SHAKESPEARE = Path(__file__).resolve().parents[3].parent / "shared/datasets/tinyshakespeare"


def shakespeare_bytes(limit: int) -> torch.Tensor:
    """The first `limit` bytes of tinyshakespeare as token ids (a byte a token)."""
    with gzip.open(SHAKESPEARE / "input.txt.gz", "rb") as handle:
        data = handle.read(limit)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


class Windows(Dataset[torch.Tensor]):
    """Consecutive windows of `length` tokens (a causal LM's sample)."""

    def __init__(self, tokens: torch.Tensor, length: int) -> None:
        self.tokens, self.length = tokens, length

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        start = index * self.length
        return self.tokens[start : start + self.length]


def llama(
    layers: int = 4,
    width: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    tied: bool = False,
    inner: int = 2,
    context: int = 32,
) -> dict[str, Any]:
    """A causal LM over bytes: windows of `context` tokens, 500 for training."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256,
        hidden_size=width,
        intermediate_size=inner * width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max(64, context),
        tie_word_embeddings=tied,
    )
    train_tokens = 500 * context
    tokens = shakespeare_bytes(train_tokens * 5 // 4)
    return {
        "model": lambda: LlamaForCausalLM(config),
        "train": Windows(tokens[:train_tokens], context),
        "valid": Windows(tokens[train_tokens:], context),
        "loss": "causal_lm",
    }


def gpt2(layers: int = 4, width: int = 64, heads: int = 4) -> dict[str, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=256,
        n_embd=width,
        n_layer=layers,
        n_head=heads,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=False,
        resid_pdrop=0.0,  # the layouts equal the local run without dropout's draws
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    tokens = shakespeare_bytes(20_000)
    return {
        "model": lambda: GPT2LMHeadModel(config),
        "train": Windows(tokens[:16_000], 32),
        "valid": Windows(tokens[16_000:], 32),
        "loss": "causal_lm",
    }


class Digits(Dataset[dict[str, torch.Tensor]]):
    """scikit-learn's 8x8 digits as image dicts, the way Hugging Face vision models take them."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.images[index], "labels": self.labels[index]}


def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return images, torch.tensor(digits.target)


def vit(width: int = 32, layers: int = 2) -> dict[str, Any]:
    """A Vision Transformer over 2 x 2 patches of the 8 x 8 digits (layer norms only: any
    split of a batch computes what one process does)."""
    from transformers import ViTConfig, ViTForImageClassification

    images, labels = _digits()
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
        "train": Digits(images[:1500], labels[:1500]),
        "valid": Digits(images[1500:], labels[1500:]),
        "loss": "cross_entropy",
    }


def resnet(width: int = 16) -> dict[str, Any]:
    """A ResNet: batch norm, so a split of the batch changes its statistics (it trains under
    every strategy; it equals one process only there)."""
    from transformers import ResNetConfig, ResNetForImageClassification

    images, labels = _digits()
    config = ResNetConfig(
        num_channels=1,
        embedding_size=width,
        hidden_sizes=[width, 2 * width],
        depths=[1, 1],
        layer_type="basic",
        num_labels=10,
        downsample_in_first_stage=False,
    )
    return {
        "model": lambda: ResNetForImageClassification(config),
        "train": Digits(images[:1500], labels[:1500]),
        "valid": Digits(images[1500:], labels[1500:]),
        "loss": "cross_entropy",
    }


class TwoTower(nn.Module):
    """A model of the user's own: two inputs by name, one score."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.left = nn.Sequential(nn.Linear(4, width), nn.Tanh())
        self.right = nn.Sequential(nn.Linear(4, width), nn.Tanh())

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        return (self.left(left) * self.right(right)).sum(dim=-1)


class Pairs(IterableDataset[dict[str, torch.Tensor]]):
    """A stream of dict samples (an IterableDataset): two 4-vectors and a target."""

    def __init__(self, count: int, seed: int) -> None:
        self.count, self.seed = count, seed

    def __iter__(self) -> Any:
        generator = torch.Generator().manual_seed(self.seed)
        for _ in range(self.count):
            left, right = torch.randn(4, generator=generator), torch.randn(4, generator=generator)
            yield {"left": left, "right": right, "target": (left * right).sum().tanh()}


def pair_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """The user's own loss: a sum over the batch, and its sample count."""
    score = model(batch["left"], batch["right"])
    return (score - batch["target"]).pow(2).sum(), len(score)


def pair_metrics(model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, tuple[Any, int]]:
    score = model(batch["left"], batch["right"])
    agree = ((score > 0) == (batch["target"] > 0)).sum()
    return {"sign_agreement": (agree, len(score))}


def two_tower(width: int = 16) -> dict[str, Any]:
    return {
        "model": TwoTower(width),
        "train": Pairs(512, seed=1),
        "valid": Pairs(128, seed=2),
        "loss": pair_loss,
        "metrics": pair_metrics,
    }


def broken_loss() -> dict[str, Any]:
    def loss(model: nn.Module, batch: Any) -> tuple[torch.Tensor, int]:
        return model(batch["left"], batch["right"]), 4  # per-sample scores, not their sum

    return {**two_tower(), "loss": loss}
