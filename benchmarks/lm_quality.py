"""Quality per strategy: the example lm's validation loss at fixed token counts, local vs each
strategy, from one seed and one global batch (issue 12).

Every strategy trains `examples/lm-tinyshakespeare.toml` as shipped (dim 128, 4 heads,
4 layers, context 128, 32 windows = 4,096 predicted characters a step, AdamW, warm-up
then cosine decay over its 1,000 steps, clipping, seed 0) with only `[strategy]`
changed (and `train.drop_last = true` for every run, which a pipeline needs), through
the CLI (`shoal train`). A checkpoint is kept every --every steps;
the run is stopped (SIGTERM: a clean stop with a checkpoint) once step --budget's
checkpoint exists, so each curve is the first --budget steps of the example's own
schedule. Afterwards every kept checkpoint is exported as a plain state dict and
evaluated here on the whole validation text (the last 10 % of tinyshakespeare,
every token once, as the task's evaluation does), so all strategies are scored by the
same code.

The work is cut into chunks for a shared machine: one call runs for at most
--chunk-s seconds (a run still going is stopped cleanly and resumed by the next call,
`shoal train --resume`, which continues exactly), so call it again until it prints the
table. Runs live under --dir (default runs/lm-quality, ignored by git).

    .venv/bin/python benchmarks/lm_quality.py [--budget 200] [--every 25] [--chunk-s 420]
        [--only NAME] [--figure benchmarks/figures/lm_quality.png]
"""

from __future__ import annotations

import argparse
import itertools
import json
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from shoal.checkpoint.manager import list_checkpoints
from shoal.checkpoint.sharded import export_model
from shoal.config.loading import load_config
from shoal.tasks.lm.corpus import eval_windows, load_corpus
from shoal.tasks.lm.model import build_lm
from shoal.tasks.lm.tokenizer import TOKENIZER_FILE, Tokenizer

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "lm-tinyshakespeare.toml"
SHOAL = REPO / ".venv" / "bin" / "shoal"
STOP_GRACE_S = 120

#: name -> the `[strategy]` table (global batch 32 windows everywhere)
STRATEGIES: dict[str, str] = {
    "local": '{ type = "local" }',
    "data_parallel 2": '{ type = "data_parallel", num_replicas = 2 }',
    "pipeline 2 (1f1b)": (
        '{ type = "pipeline", stages = 2, schedule = "1f1b", microbatches = 4, '
        "partitions = [[0, 1], [2, 3]] }"
    ),
    "tensor_parallel 2": '{ type = "tensor_parallel", degree = 2 }',
    "fully_sharded 2": '{ type = "fully_sharded", degree = 2 }',
    "hybrid data 2 x tensor 2": '{ type = "hybrid", mesh = { data = 2, tensor = 2 } }',
    "hybrid pipeline 2 x tensor 2": (
        '{ type = "hybrid", mesh = { pipeline = 2, tensor = 2 }, microbatches = 4, '
        "partitions = [[0, 1], [2, 3]] }"
    ),
}


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-")


def reached(run: Path, budget: int) -> bool:
    return any(p.name == f"step-{budget:08d}" for p in list_checkpoints(run / "checkpoints"))


def train_chunk(name: str, run: Path, args: argparse.Namespace, deadline: float) -> bool:
    """Start or resume `name`'s run; stop it at the budget or the deadline. True when the
    budget's checkpoint exists."""
    if run.exists() and reached(run, args.budget):
        return True
    if run.exists():
        command = [str(SHOAL), "train", "--resume", str(run)]
    else:
        command = [str(SHOAL), "train", str(EXAMPLE)]
        for override in (
            f"strategy={STRATEGIES[name]}",
            "train.drop_last=true",  # a pipeline's micro-batches keep one shape: every run alike
            f"checkpoint.every_steps={args.every}",
            "checkpoint.keep_last=1000",
            "checkpoint.keep_best=false",
            "monitor.progress=off",
            f"run.dir={run.parent}",
            f"run.name={run.name}",
        ):
            command += ["--set", override]
    print(f"{name}: {' '.join(command[1:3])} ...", flush=True)
    child = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL)
    while child.poll() is None and not reached(run, args.budget) and time.monotonic() < deadline:
        time.sleep(0.5)
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)  # a clean stop: the next checkpoint, then exit 143
        child.wait(timeout=STOP_GRACE_S)
    done = reached(run, args.budget)
    if child.returncode not in (0, 143) and not done:
        print(f"{name}: shoal train exited {child.returncode}; see {run}/logs", flush=True)
    return done


def evaluate(run: Path, every: int, budget: int, cache: dict[str, float]) -> dict[int, float]:
    """Validation loss (nats/char) of the run's checkpoints at multiples of `every` (cached)."""
    config = load_config(run / "config.toml").task
    tokens = load_corpus(config, Tokenizer.load(run / TOKENIZER_FILE)).valid
    assert tokens is not None
    losses: dict[int, float] = {}
    for folder in list_checkpoints(run / "checkpoints"):
        step = int(folder.name.split("-")[1])
        if step % every or step > budget:
            continue
        if folder.name not in cache:
            cache[folder.name] = validation_loss(folder, config, tokens, run)
        losses[step] = cache[folder.name]
    return losses


@torch.no_grad()
def validation_loss(folder: Path, config: Any, tokens: torch.Tensor, run: Path) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        export_model(folder, Path(scratch) / "model.pt")
        state = torch.load(Path(scratch) / "model.pt", weights_only=True)
    vocab = Tokenizer.load(run / TOKENIZER_FILE).vocab_size
    model = build_lm(config.model, vocab)
    model.load_state_dict(state)
    model.eval()
    total, count = 0.0, 0
    windows = eval_windows(len(tokens), config.model.context)
    for length, group in itertools.groupby(windows, key=lambda w: w[1]):  # the last is short
        starts = torch.tensor([start for start, _ in group])
        for part in starts.split(64):
            batch = tokens[part.unsqueeze(1) + torch.arange(length + 1)].long()
            logits = model(batch[:, :-1])
            flat = logits.reshape(-1, logits.shape[-1]).float()
            total += float(F.cross_entropy(flat, batch[:, 1:].reshape(-1), reduction="sum"))
            count += batch.shape[0] * length
    return total / count


def rate(run: Path) -> float | None:
    """Training tokens/s over the run's logged intervals but the first: steps x 4,096
    predicted characters over the step time (metrics.jsonl train records; counted from the
    steps, as an interval's `samples` under a tensor dimension counts each sample once per
    tensor rank)."""
    path = run / "metrics.jsonl"
    if not path.exists():
        return None
    train = [r for r in map(json.loads, path.read_text().splitlines()) if r["event"] == "train"]
    steps = sum(
        b["step"] - a["step"] for a, b in itertools.pairwise(train) if b["step"] > a["step"]
    )
    step_s = sum(b["step_s"] for a, b in itertools.pairwise(train) if b["step"] > a["step"])
    return steps * 4096 / step_s if step_s else None


def table(curves: dict[str, dict[int, float]], rates: dict[str, float | None]) -> None:
    steps = sorted(curves["local"])
    print("| strategy | " + " | ".join(f"{s * 4096 / 1e3:.0f}k" for s in steps) + " | max |dev| |")
    print("|---|" + "---|" * (len(steps) + 1))
    for name, curve in curves.items():
        cells = [f"{curve[s]:.4f}" if s in curve else "-" for s in steps]
        devs = [abs(curve[s] - curves["local"][s]) for s in steps if s in curve]
        dev = f"{max(devs):.1e}" if name != "local" and devs else ""
        print(f"| {name} | " + " | ".join(cells) + f" | {dev} |")
    print("\ntraining tokens/s (logged steps, the first log interval untimed):")
    for name, value in rates.items():
        print(f"  {name}: {value:,.0f}" if value else f"  {name}: -")


def figure(curves: dict[str, dict[int, float]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    local = curves["local"]
    for index, (name, curve) in enumerate(curves.items()):
        steps = [s for s in sorted(curve) if s in local]
        tokens = [s * 4096 / 1e6 for s in steps]
        color = f"C{index}"  # one colour per strategy in both panels
        top.plot(tokens, [curve[s] for s in steps], marker="o", ms=3, label=name, color=color)
        if name != "local":
            bottom.plot(tokens, [curve[s] - local[s] for s in steps], color=color)
    top.set_ylabel("validation loss (nats/char)")
    top.legend(fontsize=8)
    top.set_title("examples/lm-tinyshakespeare.toml: validation loss by strategy")
    bottom.set_ylabel("difference from local")
    bottom.set_xlabel("predicted characters (millions)")
    bottom.axhline(0, color="grey", lw=0.5)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=200, help="steps of 4,096 tokens")
    parser.add_argument("--every", type=int, default=25, help="steps between evaluated points")
    parser.add_argument("--chunk-s", type=float, default=420.0, help="seconds of training a call")
    parser.add_argument("--dir", type=Path, default=REPO / "runs" / "lm-quality")
    parser.add_argument("--only", action="append", help="strategy names (default: all)")
    parser.add_argument("--figure", type=Path, help="write a PNG of the curves here")
    args = parser.parse_args()
    names = args.only or list(STRATEGIES)
    deadline = time.monotonic() + args.chunk_s
    done = [n for n in names if train_chunk(n, args.dir / slug(n), args, deadline)]
    if len(done) < len(names):
        left = [n for n in names if n not in done]
        print(f"chunk over; not yet at step {args.budget}: {', '.join(left)} (call again)")
    cache_file = args.dir / "evaluations.json"
    cache = json.loads(cache_file.read_text()) if cache_file.exists() else {}
    curves, rates = {}, {}
    for name in names:
        run = args.dir / slug(name)
        if run.exists():
            curves[name] = evaluate(run, args.every, args.budget, cache.setdefault(name, {}))
            rates[name] = rate(run)
            cache_file.write_text(json.dumps(cache, indent=1))
    if "local" in curves:
        table(curves, rates)
        if args.figure:
            figure(curves, args.figure)


if __name__ == "__main__":
    main()
