"""How a user's model is laid out over ranks: its repeated blocks, a tensor-parallel plan by
family, and the model cut into pipeline stages at its block list.

- **Blocks** (FSDP's units, the pipeline's units): the largest `ModuleList` /
  `ModuleDict` / `Sequential` whose children are all of one class (a transformer's
  decoder layers, a ResNet stage's blocks).
- **Tensor plans** for the families users bring most (patterns and styles:
  `protocols/layouts.py`): a Hugging Face model whose config carries
  `base_model_tp_plan` (Llama, Mistral, Qwen2 and others: q/k/v/gate/up column-wise,
  o/down row-wise), its embedding split by vocabulary rows and its head by columns; a
  model with neither gets one line naming what to add and the projections that look
  like candidates.
- **Pipeline stages**: a Hugging Face causal LM is cut at its block list (embeddings on
  the first stage, the final norm and the head on the last): Llama-style
  (`model.embed_tokens / layers / norm / rotary_emb`, `lm_head`) and GPT-2-style
  (`transformer.wte / wpe / drop / h / ln_f`, `lm_head`). A stage keeps the full model's
  parameter names, so checkpoints are the local layout's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from shoal.errors import ShoalError
from shoal.protocols.layouts import plan_from_patterns
from shoal.tasks.module.families import FusedQKV, SplitSize, gpt2_patterns, is_gpt2_style

# ---------------------------------------------------------------- repeated blocks


def block_lists(model: nn.Module) -> list[tuple[str, list[tuple[str, nn.Module]]]]:
    """Every container of two or more children of one class, by path, largest first."""
    found = []
    for path, module in model.named_modules():
        if isinstance(module, nn.ModuleList | nn.ModuleDict | nn.Sequential):
            children = list(module.named_children())
            if len(children) >= 2 and len({type(c) for _, c in children}) == 1:
                size = sum(p.numel() for p in module.parameters())
                found.append((size, path, children))
    found.sort(key=lambda item: (-item[0], item[1]))
    return [(path, children) for _, path, children in found]


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: the children of its largest block list."""
    lists = block_lists(model)
    if not lists:
        raise ShoalError(
            f"{type(model).__name__} has no list of repeated blocks (a ModuleList or "
            "ModuleDict of same-class children) to shard one by one; name the block classes "
            'in strategy.wrap, e.g. wrap = ["MyBlock"]'
        )
    return [module for _, module in lists[0][1]]


def class_names(model: nn.Module) -> set[str]:
    return {type(module).__name__ for module in model.modules()}


# ---------------------------------------------------------------- tensor plans


def family_patterns(model: nn.Module) -> dict[str, str] | None:
    """The plan of a family the model belongs to, as patterns over its paths (None: none).

    A Hugging Face model's config carries its base model's plan (`base_model_tp_plan`,
    Llama, Mistral, Qwen2...): its projections, under the base model's attribute. GPT-2
    (no such plan: its attention is fused) has Megatron's plan over shoal's layout of it
    (`families.py`). Either way the embedding is split by vocabulary rows and a causal
    LM's head by columns, unless they share one weight."""
    config = getattr(model, "config", None)
    plan = getattr(config, "base_model_tp_plan", None)
    base = getattr(model, "base_model_prefix", "")
    if plan:
        prefix = f"{base}." if base and hasattr(model, base) else ""
        patterns = {f"{prefix}{key}": _hf_style(kind) for key, kind in plan.items()}
    elif is_gpt2_style(model):
        patterns = gpt2_patterns(model)
    else:
        return None
    get_embeddings = getattr(model, "get_input_embeddings", None)
    embeddings = get_embeddings() if get_embeddings is not None else None
    head = getattr(model, "lm_head", None)
    paths = {id(module): path for path, module in model.named_modules()}
    if isinstance(embeddings, nn.Embedding) and head is not None:
        tied = getattr(config, "tie_word_embeddings", False)
        if not tied:  # a tied weight cannot be split by rows in one and columns in the other
            patterns[paths[id(embeddings)]] = "rowwise_embedding"
            patterns[paths[id(head)]] = "colwise_gather"
    return patterns


def _hf_style(kind: str) -> str:
    return {"colwise": "colwise", "rowwise": "rowwise"}.get(kind.split("_")[0], "colwise")


def family_plan(model: nn.Module, sequence_parallel: bool) -> dict[str, Any]:
    """The tensor-parallel plan of the model's family, or one line saying what to add."""
    patterns = family_patterns(model)
    if patterns is None:
        candidates = [
            path
            for path, module in model.named_modules()
            if isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"
        ][:8]
        raise ShoalError(
            f"tensor_parallel: no plan is known for {type(model).__name__}; give one by "
            'module-name pattern in [strategy.plan] (e.g. "layers.*.attn.q" = "colwise", '
            '"layers.*.attn.out" = "rowwise"); its projections include: '
            + (", ".join(candidates) or "none found")
        )
    if sequence_parallel:
        raise ShoalError(
            "strategy.sequence_parallel: a plan detected for a Hugging Face model shards its "
            "projections only; give the norms' sequence_parallel entries in [strategy.plan]"
        )
    plan = plan_from_patterns(model, patterns, sequence_parallel, missing_ok=True)
    for path, module in model.named_modules():  # GPT-2: each attention cuts its share
        if path and isinstance(getattr(module, "c_attn", None), FusedQKV):
            plan[path] = SplitSize()
    return plan


def head_counts(model: nn.Module) -> dict[str, int]:
    """The model's attention heads (and key/value heads) from its config, when it says."""
    config = getattr(model, "config", None)
    counts = {}
    for name in ("num_attention_heads", "num_key_value_heads", "n_head"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            counts[name] = value
    return counts


# ---------------------------------------------------------------- pipeline stages


@dataclass
class Cutter:
    """How a model cuts into stages: its blocks, and what runs before and after them."""

    model: nn.Module
    blocks: list[nn.Module]
    family: str

    @property
    def names(self) -> list[str]:
        """The blocks' paths in the model."""
        paths = {id(module): path for path, module in self.model.named_modules()}
        return [paths[id(block)] for block in self.blocks]

    def stage(self, first: int, last: int) -> nn.Module:
        if not 0 <= first <= last < len(self.blocks):
            raise ValueError(f"a stage is blocks first..last within 0..{len(self.blocks) - 1}")
        return CausalLMStage(self, first, last)


def cutter(model: nn.Module) -> Cutter:
    """The model's cut at its block list, for the families a stage knows how to run."""
    cut = known_cut(model)
    if cut is None:
        raise ShoalError(
            f"strategy pipeline: {type(model).__name__} cannot be cut into stages: a stage "
            "runs a Hugging Face causal LM's block list (Llama-style model.layers, GPT-2-style "
            "transformer.h); give the model that form, or train it with data_parallel or "
            "fully_sharded"
        )
    return cut


def known_cut(model: nn.Module) -> Cutter | None:
    """The cut of a family a stage knows how to run (None: another model)."""
    inner = getattr(model, "model", None)
    if hasattr(model, "lm_head") and all(
        hasattr(inner, name) for name in ("embed_tokens", "layers", "norm")
    ):
        return Cutter(model, list(inner.layers), "llama")  # type: ignore[union-attr]
    transformer = getattr(model, "transformer", None)
    if hasattr(model, "lm_head") and all(
        hasattr(transformer, name) for name in ("wte", "wpe", "h", "ln_f")
    ):
        return Cutter(model, list(transformer.h), "gpt2")  # type: ignore[union-attr]
    return None


class CausalLMStage(nn.Module):
    """Blocks first..last of a causal LM, with its embeddings on the first stage and its
    final norm and head on the last; the full model's modules (and names) shared."""

    blocks: list[nn.Module]
    config: Any
    _rotary: Any

    def __init__(self, cut: Cutter, first: int, last: int) -> None:
        super().__init__()
        model: Any = cut.model  # a transformers model: its parts are found by name
        family = cut.family
        self.family = family
        self.first, self.last = first == 0, last == len(cut.blocks) - 1
        self.offset = first
        names = {id(m): path for path, m in model.named_modules()}
        self._paths: list[str] = []
        for index in range(first, last + 1):
            self._adopt(names[id(cut.blocks[index])], cut.blocks[index])
        # not submodules: the config is data, the rotary table is buffers every stage computes
        self.__dict__["config"] = model.config
        if family == "llama":
            base = model.model
            self.__dict__["_rotary"] = getattr(base, "rotary_emb", None)
            if self.first:
                self._adopt(names[id(base.embed_tokens)], base.embed_tokens)
            if self.last:
                self._adopt(names[id(base.norm)], base.norm)
                self._adopt(names[id(model.lm_head)], model.lm_head)
        else:
            base = model.transformer
            if self.first:
                for part in (base.wte, base.wpe, base.drop):
                    self._adopt(names[id(part)], part)
            if self.last:
                self._adopt(names[id(base.ln_f)], base.ln_f)
                self._adopt(names[id(model.lm_head)], model.lm_head)
        self.__dict__["blocks"] = [cut.blocks[i] for i in range(first, last + 1)]

    def _adopt(self, path: str, module: nn.Module) -> None:
        """Register `module` at its path in the full model, so names stay the model's."""
        parent: nn.Module = self
        parts = path.split(".")
        for part in parts[:-1]:
            child = parent._modules.get(part)
            if child is None:
                child = nn.Module()
                parent.add_module(part, child)
            parent = child
        parent.add_module(parts[-1], module)
        self._paths.append(path)

    def _at(self, path: str) -> nn.Module:
        return self.get_submodule(path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask

        if self.family == "llama":
            h = self._at("model.embed_tokens")(x) if self.first else x
            positions = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
            mask = create_causal_mask(
                config=self.config,
                inputs_embeds=h,
                attention_mask=None,
                cache=None,
                position_ids=positions,
            )
            rotary = None if self._rotary is None else self._rotary(h, position_ids=positions)
            for block in self.blocks:
                h = block(
                    h, attention_mask=mask, position_ids=positions, position_embeddings=rotary
                )
            if self.last:
                h = self._at("lm_head")(self._at("model.norm")(h))
            return h
        if self.first:
            positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
            h = self._at("transformer.wte")(x) + self._at("transformer.wpe")(positions)
            h = self._at("transformer.drop")(h)
        else:
            h = x
            positions = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        mask = create_causal_mask(
            config=self.config, inputs_embeds=h, attention_mask=None, cache=None,
            position_ids=positions,
        )  # fmt: skip
        for block in self.blocks:
            h = block(h, None, mask, position_ids=positions)
        if self.last:
            h = self._at("lm_head")(self._at("transformer.ln_f")(h))
        return h


def stage_batch(config: Any, loss: Any, batch: Any) -> tuple[torch.Tensor, Any]:
    """(the first stage's input, the last stage's target) of a causal-LM batch."""
    if loss != "causal_lm":
        raise ShoalError(
            f"strategy pipeline: task.factory {config.factory} has loss {loss!r}; a pipeline "
            'of a user model trains loss = "causal_lm" (its last stage scores the tokens)'
        )
    ids = batch["input_ids"] if isinstance(batch, dict) else batch
    if isinstance(batch, dict) and batch.get("attention_mask") is not None:
        raise ShoalError(
            "strategy pipeline: the batches carry an attention_mask; a pipeline of a user "
            "model trains on whole sequences (no padding)"
        )
    return ids, ids


def stage_loss(loss: Any, logits: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    from shoal.tasks.module.losses import causal_lm_sum

    return causal_lm_sum(logits, ids, None), int(ids.shape[0])
