"""The language-model task: next-token prediction on a text file, loss per token.

A sample is a window of context + 1 tokens (see :mod:`shoal.tasks.lm.corpus`).
Its loss is the *mean* cross-entropy over its `context` targets, and a batch's
`loss_sum` sums that over windows: every training window has exactly `context`
targets, so this is sum-over-tokens / context. The trainer divides by the global
number of windows, so the objective is the mean loss per token of the global
batch, its learning rate does not change with the context length, and N workers
still reproduce one exactly (the contract of :mod:`shoal.protocols.task`). Reported
`loss` is in nats per token (per character with the char tokenizer).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from shoal.protocols.task import LossOutput, Task, rank_slice
from shoal.runtime.collectives import all_reduce_sum
from shoal.runtime.context import WorkerContext
from shoal.tasks.lm.config import LMTaskConfig
from shoal.tasks.lm.corpus import TrainWindows, eval_windows, load_corpus
from shoal.tasks.lm.model import TransformerLM, build_lm
from shoal.tasks.lm.parallel import tensor_parallel_plan
from shoal.tasks.lm.tokenizer import TOKENIZER_FILE, Tokenizer


def saved_tokenizer(ctx: WorkerContext) -> Tokenizer | None:
    """A resumed run's tokenizer: the checkpoint's copy, else the run directory's."""
    if not ctx.resume_from:
        return None
    for folder in (Path(ctx.resume_from), ctx.paths.root):
        if (folder / TOKENIZER_FILE).is_file():
            return Tokenizer.load(folder / TOKENIZER_FILE)
    return None


class LMTask(Task):
    """A decoder-only transformer trained to predict the next token of a text."""

    config_class: ClassVar[type[LMTaskConfig]] = LMTaskConfig

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        config = ctx.config.task
        assert isinstance(config, LMTaskConfig)
        self.config = config
        saved = saved_tokenizer(ctx)
        self.corpus = load_corpus(config, saved)
        self.tokenizer = self.corpus.tokenizer
        self.context = config.model.context
        self.windows = TrainWindows(
            self.corpus.train, self.context, ctx.config.train.seed, "task.data.train"
        )
        if ctx.is_main and saved is None:
            self.tokenizer.save(ctx.paths.root / TOKENIZER_FILE)
        valid = self.corpus.valid
        ctx.log.info(
            "lm data: %s tokenizer, %d tokens in the vocabulary, %d training tokens "
            "(%d windows of %d + 1 per epoch), %s validation tokens",
            self.tokenizer.kind,
            self.tokenizer.vocab_size,
            len(self.corpus.train),
            self.windows.count,
            self.context,
            len(valid) if valid is not None else "no",
        )

    # ------------------------------------------------------------ the Task contract
    @property
    def train_size(self) -> int:
        return self.windows.count

    def build_model(self) -> nn.Module:
        return build_lm(self.config.model, self.tokenizer.vocab_size)

    def set_epoch(self, epoch: int) -> None:
        self.windows.set_epoch(epoch)

    def train_batch(self, indices: torch.Tensor) -> torch.Tensor:
        return self.windows.fetch(indices).to(self.ctx.device, non_blocking=True)

    def loss(self, model: nn.Module, batch: torch.Tensor) -> LossOutput:
        inputs, targets = self.pipeline_batch(batch)
        return self.pipeline_loss(model(inputs), targets)

    # ------------------------------------------------------------ capabilities
    def pipeline_block_names(self, model: nn.Module) -> list[str]:
        return [f"blocks.{index}" for index in _transformer(model).blocks]

    def pipeline_stage(self, model: nn.Module, first: int, last: int) -> nn.Module:
        return _transformer(model).stage(first, last)

    def tensor_plan(self, model: nn.Module, sequence_parallel: bool) -> dict[str, Any]:
        """Megatron's plan, keyed by this model's module names (`parallel.py`)."""
        return tensor_parallel_plan(model, sequence_parallel)

    def shard_units(self, model: nn.Module) -> list[nn.Module]:
        """FSDP gathers one transformer block at a time."""
        return list(_transformer(model).blocks.children())

    def pipeline_batch(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs of the first stage, targets of the last) of a batch of windows."""
        return batch[:, :-1], batch[:, 1:]

    def pipeline_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> LossOutput:
        """The loss of the last stage's output: `loss` is exactly this of the whole model."""
        token_sum = _cross_entropy_sum(logits, targets)
        return LossOutput(token_sum / self.context, int(targets.shape[0]))

    def eval_splits(self) -> list[str]:
        return ["valid"] if self.corpus.valid is not None else []

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        """Loss per token over the validation text (or its first `max_windows` windows).

        Windows are split over the ranks; sums of losses and of tokens are added up.
        """
        tokens = self.corpus.valid
        if tokens is None or split != "valid":
            return {}
        was_training = model.training
        model.eval()
        windows = eval_windows(len(tokens), self.context, self.config.evaluation.max_windows)
        mine = windows[rank_slice(len(windows), self.ctx.rank, self.ctx.world_size)]
        train = self.ctx.config.train
        batch_size = train.eval_batch_size or train.batch_size
        loss_sum, count = 0.0, 0.0
        for group in _same_length_batches(mine, batch_size):
            length = group[0][1]
            starts = torch.tensor([start for start, _ in group])
            batch = tokens[starts.unsqueeze(1) + torch.arange(length + 1)].to(torch.int64)
            loss_sum += float(_token_loss_sum(model, batch.to(self.ctx.device)))
            count += batch.shape[0] * length
        model.train(was_training)
        loss_sum, count = all_reduce_sum(self.ctx, [loss_sum, count])
        loss = loss_sum / max(count, 1.0)
        return {
            "loss": loss,
            "perplexity": math.exp(min(loss, 700.0)),
            "bits_per_token": loss / math.log(2),
        }

    def checkpoint_files(self, folder: Path) -> dict[str, str]:
        """Every checkpoint carries the tokenizer its model's ids belong to."""
        return {TOKENIZER_FILE: self.tokenizer.save(folder / TOKENIZER_FILE)}

    def summary(self) -> dict[str, Any]:
        valid = self.corpus.valid
        return {
            "tokenizer": self.tokenizer.kind,
            "vocab_size": self.tokenizer.vocab_size,
            "train_tokens": len(self.corpus.train),
            "valid_tokens": len(valid) if valid is not None else 0,
            "windows_per_epoch": self.windows.count,
            "tokens_per_sample": self.context,
        }


def _token_loss_sum(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross-entropy of windows (batch, length + 1)."""
    return _cross_entropy_sum(model(batch[:, :-1]), batch[:, 1:])


def _cross_entropy_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction="sum"
    )


def _same_length_batches(
    windows: list[tuple[int, int]], batch_size: int
) -> list[list[tuple[int, int]]]:
    """Consecutive windows in batches of at most `batch_size`, each of one length."""
    batches: list[list[tuple[int, int]]] = []
    for window in windows:
        if batches and len(batches[-1]) < batch_size and batches[-1][0][1] == window[1]:
            batches[-1].append(window)
        else:
            batches.append([window])
    return batches


def _transformer(model: nn.Module) -> TransformerLM:
    if not isinstance(model, TransformerLM):
        raise TypeError(f"the lm task's model is a TransformerLM, got {type(model).__name__}")
    return model
