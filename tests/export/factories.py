"""Factories of `[task] type = "module"` for the export tests: a Llama loaded with
`from_pretrained` from a folder the test saved (a tiny random one: nothing downloaded), a
GPT-2 with tied embeddings, and a plain module of the user's own with a tied weight.

Each is imported by the test's job from this folder (`import_dir`), as a user's module is.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tests.tasks.module.hf_models import Windows, shakespeare_bytes, two_tower


def tiny_llama_config() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )


def _text() -> dict[str, Any]:
    tokens = shakespeare_bytes(12_000)
    return {"train": Windows(tokens[:10_000], 32), "valid": Windows(tokens[10_000:], 32)}


def pretrained_llama(folder: str) -> dict[str, Any]:
    """A Llama that starts from the weights saved in `folder` (`save_pretrained`)."""
    from transformers import LlamaForCausalLM

    return {
        "model": lambda: LlamaForCausalLM.from_pretrained(folder),
        **_text(),
        "loss": "causal_lm",
    }


def tied_gpt2() -> dict[str, Any]:
    """A GPT-2 whose head is its token embedding (Hugging Face's default)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=256,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=True,
    )
    return {"model": lambda: GPT2LMHeadModel(config), **_text(), "loss": "causal_lm"}


class TiedTower(nn.Module):
    """A plain module whose output layer reads through its input layer's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.encode = nn.Linear(4, 4, bias=False)
        self.decode = nn.Linear(4, 4, bias=False)
        self.decode.weight = self.encode.weight  # tied: one Parameter, two names
        self.score = nn.Linear(4, 1)

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        mixed = self.decode(torch.tanh(self.encode(left * right)))
        return self.score(mixed).squeeze(-1)


def tied_tower() -> dict[str, Any]:
    return {**two_tower(), "model": lambda: TiedTower()}
