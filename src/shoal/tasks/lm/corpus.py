"""The text as token ids, and the windows that are the task's samples.

A training sample is a window of `context + 1` consecutive tokens: the model reads
the first `context` and predicts the last `context`. An epoch tiles the training
text with windows that overlap by one token, so every token is a target once per
epoch; the tiling starts at an offset drawn from (seed, epoch), so window borders
move from epoch to epoch while every worker, and a resumed run, computes the
same windows. One window is left out of the tiling to make room for the offset
(when the text holds at least two), so an epoch has
`(tokens - 1) // context - 1` windows. The trainer shuffles their order.

Validation reads the validation text once, in consecutive windows of `context`
targets (the last one shorter), so its loss is the exact mean over every token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from shoal.errors import DataError, ShoalError
from shoal.tasks.lm.config import LMTaskConfig
from shoal.tasks.lm.tokenizer import Tokenizer, UnknownCharacter
from shoal.textfile import read_text

EXPECTED = "expected a UTF-8 text file"
OFFSET_SALT = 0x4C4D  # keeps the offset stream apart from other (seed, epoch) streams


@dataclass
class Corpus:
    """Token ids of the training and (optional) validation text, with their tokenizer."""

    tokenizer: Tokenizer
    train: torch.Tensor  # int32
    valid: torch.Tensor | None  # int32; None without validation


def load_corpus(config: LMTaskConfig, saved: Tokenizer | None = None) -> Corpus:
    """Read the task's files and tokenize them with `saved` (a resumed run's) or a new tokenizer."""
    data = config.data
    texts = {data.train: read_text(Path(data.train), EXPECTED)}
    if data.valid is not None:
        texts[data.valid] = read_text(Path(data.valid), EXPECTED)
    tokenizer = saved or Tokenizer.build(config.tokenizer, list(texts.values()))
    if tokenizer.kind != config.tokenizer:
        raise ShoalError(
            f"task.tokenizer: this run was trained with the {tokenizer.kind} tokenizer, the config "
            f"says {config.tokenizer}; set it back to {tokenizer.kind!r} or start a new run"
        )
    ids = {path: torch.from_numpy(_encode(tokenizer, text, path)) for path, text in texts.items()}
    train = ids[data.train]
    if data.valid is not None:
        return Corpus(tokenizer, train, ids[data.valid])
    cut = int(len(train) * data.train_fraction)
    valid = train[cut:] if cut < len(train) - 1 else None  # a target needs two tokens
    return Corpus(tokenizer, train[:cut], valid)


def _encode(tokenizer: Tokenizer, text: str, path: str) -> np.ndarray:
    try:
        return tokenizer.encode(text)
    except UnknownCharacter as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise DataError(
            f"{path}:{line}: character {exc.char!r} is not in this run's vocabulary of "
            f"{tokenizer.vocab_size} characters (built from the text it was first trained on); "
            "restore that text or start a new run"
        ) from None


class TrainWindows:
    """The training samples of each epoch: windows of context + 1 tokens tiling the text."""

    def __init__(self, tokens: torch.Tensor, context: int, seed: int, source: str) -> None:
        fit = (len(tokens) - 1) // context
        if fit < 1:
            raise ShoalError(
                f"{source}: {len(tokens)} training tokens, fewer than one window of "
                f"task.model.context + 1 = {context + 1}; lower task.model.context or give "
                "more text"
            )
        self.tokens = tokens
        self.context = context
        self.seed = seed
        self.count = fit - 1 if fit >= 2 else fit
        self.slack = len(tokens) - 1 - self.count * context
        self.offset = 0
        self._span = torch.arange(context + 1)

    def set_epoch(self, epoch: int) -> None:
        rng = np.random.default_rng([self.seed, epoch, OFFSET_SALT])
        self.offset = int(rng.integers(0, self.slack + 1))

    def fetch(self, indices: torch.Tensor) -> torch.Tensor:
        """The windows `indices` of this epoch, (len(indices), context + 1) int64."""
        starts = self.offset + indices.to(torch.int64) * self.context
        return self.tokens[starts.unsqueeze(1) + self._span].to(torch.int64)


def eval_windows(num_tokens: int, context: int, limit: int | None = None) -> list[tuple[int, int]]:
    """(start, targets) of the consecutive windows that predict every token of a text once."""
    windows = [
        (start, min(context, num_tokens - 1 - start)) for start in range(0, num_tokens - 1, context)
    ]
    return windows[:limit] if limit is not None else windows
