import gzip
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

# model and data
TEXT = Path(__file__).parents[3] / "shared/datasets/tinyshakespeare/input.txt.gz"
# end model and data


def build(context: int = 128) -> dict:
    # model and data
    with gzip.open(TEXT, "rb") as file:
        tokens = torch.frombuffer(bytearray(file.read()), dtype=torch.uint8).long()
    windows = tokens[: len(tokens) // context * context].view(-1, context)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
    )
    # end model and data
    return {"model": lambda: LlamaForCausalLM(config), "train": windows, "loss": "causal_lm"}
