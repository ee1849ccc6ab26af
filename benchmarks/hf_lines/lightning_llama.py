"""Not run: the same job in Lightning, counted for RESULTS.md; the full example of
Lightning's FSDP guide ("Train models with billions of parameters using FSDP") with the
Llama in place of its demo Transformer and its wrap policy on LlamaDecoderLayer."""

import gzip

import lightning as L
import torch
from lightning.pytorch.strategies import FSDPStrategy
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer


class LanguageModel(L.LightningModule):
    def __init__(self, config):
        super().__init__()
        self.model = LlamaForCausalLM(config)

    def training_step(self, batch):
        loss = self.model(input_ids=batch, labels=batch).loss
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


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
L.seed_everything(42)
train_dataloader = DataLoader(windows, batch_size=8, shuffle=True)  # per process
model = LanguageModel(config)
strategy = FSDPStrategy(auto_wrap_policy={LlamaDecoderLayer})
trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=100)
trainer.fit(model, train_dataloader)
