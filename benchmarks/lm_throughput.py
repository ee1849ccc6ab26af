"""Tokens per second of the language-model example: the baseline for the model-parallel benchmark.

Trains CONFIG (default examples/lm-tinyshakespeare.toml) for --steps steps, --rounds
times in a row, with evaluation and checkpoints cut to a minimum. Throughput is the
tokens of the timed steps over their step time (batch indexing, forward, backward,
gradient communication, clipping, optimizer), from metrics.jsonl's train lines; the
first logging interval is warm-up and not timed. Prints one row per round and the
median.

    .venv/bin/python benchmarks/lm_throughput.py [CONFIG] [--rounds 3] [--steps 60]
        [--workers N] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import shoal

REPO = Path(__file__).resolve().parents[1]
INTERVAL = 10  # steps per metrics line


def tokens_per_s(run_dir: Path, context: int) -> tuple[float, float]:
    """(tokens/s over the timed intervals, the last logged training loss)."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if r["event"] == "train"]
    timed = train[1:]
    if not timed:
        raise SystemExit("too few steps: give --steps of at least two logging intervals (20)")
    tokens = sum(r["samples"] for r in timed) * context
    return tokens / sum(r["step_s"] for r in timed), train[-1]["loss"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(REPO / "examples/lm-tinyshakespeare.toml"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--workers", type=int)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    rates = []
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(1, args.rounds + 1):
            overrides = [
                f"train.max_steps={args.steps}",
                f"monitor.log_every_steps={INTERVAL}",
                "monitor.progress=off",
                "checkpoint.every_epochs=0",
                "checkpoint.at_end=false",
                "checkpoint.keep_best=false",
                "task.evaluation.max_windows=1",
                f"run.dir={scratch}",
                f"run.name=round-{round_}",
                *args.set,
            ]
            results = shoal.train(args.config, workers=args.workers, overrides=overrides)
            context = results["data"]["tokens_per_sample"]
            rate, loss = tokens_per_s(Path(results["run_dir"]), context)
            rates.append(rate)
            print(
                f"| {round_} | {results['strategy_detail']} | {rate:,.0f} | {loss:.3f} |",
                flush=True,
            )
    print(f"| **median** | | **{statistics.median(rates):,.0f}** | |")


if __name__ == "__main__":
    main()
