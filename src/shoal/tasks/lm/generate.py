"""`shoal generate RUN_DIR --prompt ...`: sample text from a run's best language model.

Reads only the run directory: the best checkpoint's weights and config (the model's
sizes) and the tokenizer saved with it, so the data files need not exist any more.
Sampling is autoregressive over the last `context` tokens, with a temperature and
optional top-k truncation, from a generator seeded by `seed`: the same command
prints the same text.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import torch
from pydantic import ValidationError

from shoal.checkpoint.manager import list_checkpoints, load_checkpoint
from shoal.checkpoint.sharded import plain_model_state
from shoal.errors import ShoalError
from shoal.run import RunPaths
from shoal.tasks.lm.config import LMModelConfig
from shoal.tasks.lm.model import TransformerLM, build_lm
from shoal.tasks.lm.tokenizer import TOKENIZER_FILE, Tokenizer, UnknownCharacter


def load_best_model(run_dir: Path) -> tuple[TransformerLM, Tokenizer, Path]:
    """The best checkpoint's model (in eval mode), its tokenizer and the checkpoint's folder."""
    if not run_dir.is_dir():
        raise ShoalError(f"{run_dir}: no such run directory")
    paths = RunPaths(run_dir)
    found = list_checkpoints(paths.best)
    if not found:
        raise ShoalError(
            f"{run_dir}: no best checkpoint ({paths.best}/step-*/); it is written when a "
            "validation improves: train with a validation split (task.data.valid or split < 1) "
            "and checkpoint.keep_best = true"
        )
    checkpoint = found[-1]
    state, _ = load_checkpoint(checkpoint)
    task = tomllib.loads(state["config"]).get("task", {})
    if task.get("type") != "lm":
        raise ShoalError(
            f"{run_dir}: a {task.get('type')} run; generate samples from language models "
            '(task type "lm")'
        )
    try:
        config = LMModelConfig.model_validate(task.get("model", {}))
    except ValidationError as exc:
        raise ShoalError(
            f"{checkpoint}: task.model of the saved config is invalid: {exc}"
        ) from None
    tokenizer_file = checkpoint / TOKENIZER_FILE
    if not tokenizer_file.is_file():
        tokenizer_file = paths.root / TOKENIZER_FILE
    if not tokenizer_file.is_file():
        raise ShoalError(f"{run_dir}: no {TOKENIZER_FILE} in {checkpoint} or in the run directory")
    tokenizer = Tokenizer.load(tokenizer_file)
    model = build_lm(config, tokenizer.vocab_size)
    # a tensor_parallel / fully_sharded / hybrid run's model is in DCP's pieces (state.pt
    # holds a marker): read whole, by this process alone
    model.load_state_dict(plain_model_state(checkpoint, state["model"]))
    model.eval()
    return model, tokenizer, checkpoint


@torch.no_grad()
def sample(
    model: TransformerLM,
    prompt: torch.Tensor,
    tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """`prompt` (1-D token ids) followed by `tokens` sampled ones."""
    out = prompt.clone()
    for _ in range(tokens):
        logits = model(out[-model.context :].unsqueeze(0))[0, -1].float() / temperature
        if top_k is not None and top_k < logits.numel():
            threshold = torch.topk(logits, top_k).values[-1]
            logits = logits.masked_fill(logits < threshold, float("-inf"))
        probabilities = torch.softmax(logits, dim=-1)
        following = torch.multinomial(probabilities, 1, generator=generator)
        out = torch.cat([out, following])
    return out


def generate(
    run_dir: str | Path,
    prompt: str,
    tokens: int = 200,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
) -> str:
    """The prompt and its continuation, sampled from the run's best checkpoint."""
    if tokens < 1:
        raise ShoalError(f"--tokens: must be >= 1, got {tokens}")
    if not temperature > 0:
        raise ShoalError(f"--temperature: must be > 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ShoalError(f"--top-k: must be >= 1, got {top_k}")
    if not prompt:
        raise ShoalError('--prompt: empty; give at least one character, e.g. --prompt "\\n"')
    model, tokenizer, _ = load_best_model(Path(run_dir))
    try:
        ids = tokenizer.encode(prompt)
    except UnknownCharacter as exc:
        raise ShoalError(
            f"--prompt: character {exc.char!r} (at {exc.position}) is not in the model's "
            f"vocabulary of {tokenizer.vocab_size} characters; use only characters of the "
            "training text"
        ) from None
    except UnicodeEncodeError as exc:
        raise ShoalError(f"--prompt: not valid Unicode text ({exc.reason})") from None
    generator = torch.Generator().manual_seed(seed)
    out = sample(model, torch.from_numpy(ids).long(), tokens, temperature, top_k, generator)
    return tokenizer.decode(out.tolist())
