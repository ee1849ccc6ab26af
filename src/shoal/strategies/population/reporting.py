"""What a generation reports: lineage lines in metrics.jsonl, progress, the log."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from shoal.strategies.population.lineage import Generation
from shoal.strategies.population.member import GenerationStats
from shoal.strategies.population.operators import fitness

if TYPE_CHECKING:
    from shoal.strategies.population.loop import PopulationTrainer


def log_generation(
    trainer: PopulationTrainer, generation: Generation, everyone: dict[int, GenerationStats]
) -> None:
    """A `member` line per member (the lineage), a `member_failed` line per failure, and a
    `generation` summary, which the progress display shows."""
    g, step = generation.index, generation.end
    for m, record in enumerate(generation.members):
        trainer.metrics.write(
            {
                "event": "member",
                "generation": g,
                "step": step,
                "member": m,
                "rank": trainer.owner(m),
                "hyperparameters": record.hyperparameters,
                "parent": record.parent,
                "score": record.score,
                "metric": trainer.metric,
                "status": "failed" if record.error else "ok",
                "train_loss": record.train_loss,
                trainer.config.split: record.metrics,
                **({"error": record.error} if record.error else {}),
            }
        )
        if record.error:
            trainer.metrics.write(
                {
                    "event": "member_failed",
                    "generation": g,
                    "step": step,
                    "member": m,
                    "error": record.error,
                }
            )
            trainer.ctx.log.warning(
                "member %d failed in generation %d (it will be replaced): %s",
                m,
                g,
                record.error,
            )
    fit = fitness([r.score for r in generation.members], trainer.mode)
    good = [m for m in range(trainer.size) if not math.isnan(fit[m])]
    best = max(good, key=lambda m: (fit[m], -m)) if good else 0
    samples = sum(s.samples for s in everyone.values())
    busy = max(
        sum(s.compute_s for m, s in everyone.items() if trainer.owner(m) == r)
        for r in range(trainer.ctx.world_size)
    )
    loss = [r.train_loss for r in generation.members if math.isfinite(r.train_loss)]
    summary = {
        "event": "generation",
        "generation": g,
        "step": step,
        "best_member": best,
        "best_score": generation.members[best].score,
        "median_score": float(np.median([generation.members[m].score for m in good]))
        if good
        else math.nan,
        "failed": trainer.size - len(good),
        "loss": float(np.mean(loss)) if loss else math.nan,
        "samples_per_s": samples / busy if busy else 0.0,
        "lr": generation.members[best].hyperparameters.get("lr", trainer.train.optimizer.lr),
    }
    trainer.metrics.write(summary)
    epoch = min(member.progress.last_step_epoch for member in trainer.members.values())
    trainer.reporter.update(step, epoch, summary)
    shown = ", ".join(f"{k} {v:.4g}" for k, v in generation.members[best].hyperparameters.items())
    trainer.reporter.note(
        f"generation {g + 1}/{trainer.generations} step {step}: best member {best} "
        f"{trainer.metric} {summary['best_score']:.4f} ({shown}); median "
        f"{summary['median_score']:.4f}; {summary['failed']} failed"
    )
