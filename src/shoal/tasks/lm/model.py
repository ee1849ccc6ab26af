"""A decoder-only transformer (GPT-2 shape, pre-norm), laid out for model parallelism.

    tokens -> embed (token + learned position) -> blocks["0"] ... blocks["N-1"]
           -> norm -> head -> logits

Every block is x + dropout(attn(norm1(x))), then x + dropout(mlp(norm2(x))).
The layout is chosen for the strategies that split a model, and should stay so:

- **Pipeline stages.** The blocks live in an `nn.ModuleDict` keyed "0".."N-1", and
  the embeddings, final norm and head are separate children that may be absent.
  `model.stage(first, last)` is the same class holding blocks first..last, plus the
  embeddings on the first stage and the norm and head on the last: its forward
  takes one tensor (token ids on the first stage, activations (batch, time, dim)
  elsewhere) and returns one, as `torch.distributed.pipelining.PipelineStage`
  needs, and its parameter names are the full model's ("blocks.3.attn.q.weight"),
  so a stage's state dict is a slice of the model's and checkpoints move between
  partitions and strategies by name.
- **Tensor parallelism.** Attention has separate `q`, `k`, `v` and `out` projections,
  the MLP an `up` and a `down` projection, all `nn.Linear`, so a Megatron-style plan
  applies by name (:func:`shoal.tasks.lm.parallel.tensor_parallel_plan`): column-wise
  q/k/v/up, row-wise out/down. Attention counts its heads from the width of the
  query projection's output, so with the projections sharded each rank computes
  its own heads.
- **Sequence parallelism.** Norms are plain `nn.LayerNorm` children (`norm1`, `norm2`,
  `norm`) and dropout acts on the residual branches after `out` / `down`, where
  the activations are sharded along the sequence under SequenceParallel.
- **Initialisation** draws from torch's global generator in a fixed order over the
  full model (normal(0, init_std), residual projections scaled by 1/sqrt(2 layers)
  as in GPT-2), so every rank builds the same full model from the same seed and
  then keeps or shards its part: the parameters do not depend on the partition.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from shoal.tasks.lm.config import LMModelConfig


class Rotary(nn.Module):
    """Rotary position embedding (Su et al., 2021) of one attention module's queries and keys.

    The tables are buffers that are not saved (they follow from the config), one per
    attention module so that every pipeline stage holds its own.
    """

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, head_dim: int, context: int, base: float) -> None:
        super().__init__()
        inverse = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        angles = torch.outer(torch.arange(context, dtype=torch.float64), inverse)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, heads, time, head_dim); pairs (i, i + head_dim/2) rotate by position."""
        time = x.shape[-2]
        cos, sin = self.cos[:time].to(x.dtype), self.sin[:time].to(x.dtype)
        first, second = x.chunk(2, dim=-1)
        return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class Attention(nn.Module):
    """Causal multi-head self-attention with separate q, k, v and output projections."""

    def __init__(self, config: LMModelConfig) -> None:
        super().__init__()
        dim = config.dim
        self.head_dim = dim // config.heads
        self.q = nn.Linear(dim, dim, bias=config.bias)
        self.k = nn.Linear(dim, dim, bias=config.bias)
        self.v = nn.Linear(dim, dim, bias=config.bias)
        self.out = nn.Linear(dim, dim, bias=config.bias)
        self.dropout = config.dropout
        self.rotary = (
            Rotary(self.head_dim, config.context, config.rotary_base)
            if config.position == "rotary"
            else None
        )

    def _heads(self, projected: torch.Tensor) -> torch.Tensor:
        batch, time, width = projected.shape  # width: this rank's heads x head_dim
        return projected.view(batch, time, width // self.head_dim, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(self.q(x)), self._heads(self.k(x)), self._heads(self.v(x))
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        batch, heads, time, head_dim = y.shape
        return self.out(y.transpose(1, 2).reshape(batch, time, heads * head_dim))


class MLP(nn.Module):
    """up -> GELU -> down."""

    def __init__(self, config: LMModelConfig) -> None:
        super().__init__()
        self.up = nn.Linear(config.dim, config.hidden, bias=config.bias)
        self.down = nn.Linear(config.hidden, config.dim, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """A pre-norm transformer block."""

    def __init__(self, config: LMModelConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.dim, bias=config.bias)
        self.attn = Attention(config)
        self.norm2 = nn.LayerNorm(config.dim, bias=config.bias)
        self.mlp = MLP(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.norm1(x)))
        return x + self.dropout(self.mlp(self.norm2(x)))


class Embeddings(nn.Module):
    """Token embedding, plus a learned position embedding unless positions are rotary."""

    def __init__(self, config: LMModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, config.dim)
        self.pos = (
            nn.Embedding(config.context, config.dim) if config.position == "learned" else None
        )
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok(tokens)
        if self.pos is not None:
            h = h + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        return self.dropout(h)


class TransformerLM(nn.Module):
    """The language model, or a contiguous stage of it (see the module docstring)."""

    def __init__(
        self,
        config: LMModelConfig,
        embed: Embeddings | None,
        blocks: dict[str, Block],
        norm: nn.LayerNorm | None,
        head: nn.Linear | None,
    ) -> None:
        super().__init__()
        self.config = config
        self.embed = embed
        self.blocks = nn.ModuleDict(blocks)
        self.norm = norm
        self.head = head

    @property
    def context(self) -> int:
        return self.config.context

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, time) -> logits (batch, time, vocab); a stage maps its part."""
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks.values():
            x = block(x)
        if self.norm is not None:
            x = self.norm(x)
        if self.head is not None:
            x = self.head(x)
        return x

    def stage(self, first: int, last: int) -> TransformerLM:
        """Blocks first..last (inclusive) as a model of their own, sharing this one's modules.

        The stage holding block 0 gets the embeddings, the one holding the last block
        the final norm and head. Names stay those of the full model.
        """
        layers = len(self.blocks)
        if not 0 <= first <= last < layers:
            raise ValueError(
                f"a stage is blocks first..last within 0..{layers - 1}, got {first}..{last}"
            )
        starts, ends = first == 0, last == layers - 1
        if self.config.tie_embeddings and starts != ends:
            raise ValueError(
                "task.model.tie_embeddings = true shares the embedding with the head, which a "
                "stage boundary would split; set tie_embeddings = false"
            )
        blocks = {str(i): self.blocks[str(i)] for i in range(first, last + 1)}
        return TransformerLM(
            self.config,
            self.embed if starts else None,
            blocks,  # type: ignore[arg-type]
            self.norm if ends else None,
            self.head if ends else None,
        )


def build_lm(config: LMModelConfig, vocab_size: int) -> TransformerLM:
    """The full model, initialised from torch's global generator (seed it first)."""
    blocks = {str(i): Block(config) for i in range(config.layers)}
    model = TransformerLM(
        config,
        Embeddings(config, vocab_size),
        blocks,
        nn.LayerNorm(config.dim, bias=config.bias),
        nn.Linear(config.dim, vocab_size, bias=False),
    )
    _initialise(model, config)
    if config.tie_embeddings:
        assert model.head is not None and model.embed is not None
        model.head.weight = model.embed.tok.weight
    return model


@torch.no_grad()
def _initialise(model: TransformerLM, config: LMModelConfig) -> None:
    """GPT-2's scheme, in the order of `named_modules` (fixed by the layout)."""
    residual_std = config.init_std / math.sqrt(2 * config.layers)
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            std = residual_std if name.endswith((".out", ".down")) else config.init_std
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=config.init_std)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
