"""Not run: the same job in Accelerate, counted for RESULTS.md. The loop follows the
Transformers docs' "Accelerate" page (native PyTorch section) and Accelerate's FSDP guide
(prepare the model before creating the optimizer); the launch config is
accelerate_fsdp.yaml. Launch: accelerate launch --config_file accelerate_fsdp.yaml
accelerate_llama.py"""

import gzip

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    accelerator = Accelerator()
    # model and data
    with gzip.open("input.txt.gz", "rb") as file:
        tokens = torch.frombuffer(bytearray(file.read()), dtype=torch.uint8).long()
    windows = tokens[: len(tokens) // 128 * 128].view(-1, 128)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    # end model and data
    model = accelerator.prepare(LlamaForCausalLM(config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dataloader = DataLoader(windows, batch_size=8, shuffle=True)  # per process: 16 in all
    optimizer, dataloader = accelerator.prepare(optimizer, dataloader)
    for step, batch in enumerate(dataloader):
        loss = model(input_ids=batch, labels=batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step + 1 == 100:
            break


if __name__ == "__main__":
    main()
