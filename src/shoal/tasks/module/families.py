"""Model families whose layout needs a hand: GPT-2's fused attention projection.

GPT-2 (and the models built like it) holds its attention's query, key and value in
one `Conv1D` (`c_attn`: a transposed linear layer of 3 x width outputs). Neither
torch's column-wise split (it takes `nn.Linear`) nor a plain split of the fused
outputs (a rank would get all of q and half of k) fits tensor parallelism, which
needs each rank to hold whole heads of q, k and v. So shoal holds such a model, for
every strategy alike (the layouts then load each other's checkpoints), with:

- every `Conv1D` as the `nn.Linear` it computes (the weight transposed);
- each attention's `c_attn` as three projections `c_attn.q`, `c_attn.k`, `c_attn.v`
  whose outputs are concatenated, so the attention's own split still cuts q | k | v,
  and a column-wise split of each gives a rank whole heads of all three. Its split
  size follows the rank's share (`SplitSize`, a parallel style applied to the
  attention).

`to_hf_state` / `from_hf_state` translate a state dict between this layout and the
one Hugging Face's `from_pretrained` reads (weights in and out).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor.parallel.style import ParallelStyle


class FusedQKV(nn.Module):
    """Three projections whose outputs are concatenated: GPT-2's `c_attn`, unfused."""

    def __init__(self, q: nn.Linear, k: nn.Linear, v: nn.Linear) -> None:
        super().__init__()
        self.q: nn.Linear = q
        self.k: nn.Linear = k
        self.v: nn.Linear = v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.q(x), self.k(x), self.v(x)], dim=-1)


def is_conv1d(module: nn.Module) -> bool:
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def _linear(conv: Any, rows: slice | None = None) -> nn.Linear:
    """The nn.Linear a Conv1D computes (its output columns `rows` of them, when given)."""
    weight, bias = conv.weight.detach().t(), conv.bias.detach()
    if rows is not None:
        weight, bias = weight[rows], bias[rows]
    linear = nn.Linear(weight.shape[1], weight.shape[0], device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(weight)
        linear.bias.copy_(bias)
    return linear


def is_gpt2_style(model: nn.Module) -> bool:
    """A model with GPT-2's attention (a fused `c_attn` Conv1D and a `split_size`)."""
    return any(_fused_attention(m) for m in model.modules())


def _fused_attention(module: nn.Module) -> bool:
    return is_conv1d(getattr(module, "c_attn", nn.Identity())) and hasattr(module, "split_size")


def unfuse(model: nn.Module) -> nn.Module:
    """The model in shoal's layout of GPT-2 (see the module docstring), in place."""
    for module in list(model.modules()):
        attention: Any = module  # GPT-2's attention, found by its parts' names
        if _fused_attention(attention) and not getattr(attention, "is_cross_attention", False):
            width = attention.c_attn.nf // 3
            parts = [_linear(attention.c_attn, slice(i * width, (i + 1) * width)) for i in range(3)]
            attention.c_attn = FusedQKV(*parts)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if is_conv1d(child):
                setattr(parent, name, _linear(child))
    return model


def gpt2_patterns(model: nn.Module) -> dict[str, str]:
    """GPT-2's Megatron plan over shoal's layout of it: q, k, v and the MLP's c_fc
    column-wise, the attention's and the MLP's c_proj row-wise."""
    return {
        "*.h.*.attn.c_attn.q": "colwise",
        "*.h.*.attn.c_attn.k": "colwise",
        "*.h.*.attn.c_attn.v": "colwise",
        "*.h.*.attn.c_proj": "rowwise",
        "*.h.*.mlp.c_fc": "colwise",
        "*.h.*.mlp.c_proj": "rowwise",
    }


class SplitSize(ParallelStyle):
    """A parallel style for a GPT-2 attention: its `split_size` (where its fused output is cut
    into q, k, v) becomes the rank's share of the width."""

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        module.split_size = module.split_size // device_mesh.size()
        return module


# ---------------------------------------------------------------- weights in and out


def to_hf_state(state: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """A state dict of shoal's GPT-2 layout in Hugging Face's: q, k, v fused into `c_attn`,
    every former Conv1D's weight transposed back."""
    out: dict[str, torch.Tensor] = {}
    fused: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in state.items():
        if ".c_attn." in name and name.rsplit(".", 2)[-2] in ("q", "k", "v"):
            prefix, part, kind = name.rsplit(".", 2)
            fused.setdefault(f"{prefix}.{kind}", {})[part] = tensor
        elif _was_conv1d(name) and name.endswith(".weight"):
            out[name] = tensor.t().contiguous()
        else:
            out[name] = tensor
    for name, parts in fused.items():
        joined = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
        out[name] = joined.t().contiguous() if name.endswith(".weight") else joined
    return out


def from_hf_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Hugging Face GPT-2 state dict in shoal's layout (the inverse of `to_hf_state`)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith(("attn.c_attn.weight", "attn.c_attn.bias")):
            prefix, kind = name.rsplit(".", 1)
            whole = tensor.t() if kind == "weight" else tensor
            for part, piece in zip("qkv", whole.chunk(3, dim=0), strict=True):
                out[f"{prefix}.{part}.{kind}"] = piece.contiguous()
        elif _was_conv1d(name) and name.endswith(".weight"):
            out[name] = tensor.t().contiguous()
        else:
            out[name] = tensor
    return out


def _was_conv1d(name: str) -> bool:
    return any(f".{part}." in name for part in ("c_proj", "c_fc", "c_attn", "q_attn"))
