"""Where a kge training step spends its time: torch.profiler over a few steps of a config.

    python benchmarks/kge_train_profile.py examples/kge-fb15k237-distmult.toml --steps 30 \
        --set task.negatives.chunk_size=32

Runs `shoal.train` in this process (strategy local) for --steps steps, skipping the first
--warmup, with no evaluation and no checkpoints, and prints the operators by self CPU time.
"""

from __future__ import annotations

import argparse
import tempfile

from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.profiler import ProfilerActivity, profile, schedule

import shoal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rows", type=int, default=25, help="operators to list")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    args = parser.parse_args()
    total = args.warmup + args.steps
    with tempfile.TemporaryDirectory() as runs:
        overrides = [
            f"train.max_steps={total}",
            "train.eval_every_epochs=100000",
            "task.evaluation.max_triples=1",
            "checkpoint.every_steps=0",
            "checkpoint.every_epochs=0",
            "checkpoint.at_end=false",
            "monitor.progress=off",
            f"run.dir={runs}",
            *args.overrides,
        ]
        plan = schedule(wait=0, warmup=args.warmup, active=args.steps, repeat=1)
        with profile(activities=[ProfilerActivity.CPU], schedule=plan) as prof:
            hook = _StepHook(prof)
            handle = register_optimizer_step_post_hook(hook)
            results = shoal.train(args.config, overrides=overrides)
            handle.remove()
    print(f"{results['samples_per_s']:.0f} samples/s over {results['steps']} steps")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


class _StepHook:
    """Advances the profiler's schedule after every optimizer step."""

    def __init__(self, prof: profile) -> None:
        self.prof = prof

    def __call__(self, *_: object) -> None:
        self.prof.step()


if __name__ == "__main__":
    main()
