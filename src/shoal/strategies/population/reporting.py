"""What a generation reports: lineage lines in metrics.jsonl, progress, the log."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from shoal.strategies.population.lineage import Generation
from shoal.strategies.population.member import GenerationStats
from shoal.strategies.population.operators import fitness
from shoal.strategies.population.record import best_member

if TYPE_CHECKING:
    from shoal.strategies.population.loop import PopulationLoop


def log_generation(
    loop: PopulationLoop, generation: Generation, everyone: dict[int, GenerationStats]
) -> None:
    """A `member` line per member (the lineage), a `member_failed` line per failure, and a
    `generation` summary, which the progress display shows."""
    g, step = generation.index, generation.end
    for m, record in enumerate(generation.members):
        loop.run.metrics.write(
            {
                "event": "member",
                "generation": g,
                "step": step,
                "member": m,
                "rank": loop.roles.owner(m),
                "hyperparameters": record.hyperparameters,
                "parent": record.parent,
                "score": record.score,
                "metric": loop.metric,
                "status": "failed" if record.error else "ok",
                "train_loss": record.train_loss,
                loop.config.split: record.metrics,
                **({"error": record.error} if record.error else {}),
            }
        )
        if record.error:
            loop.run.metrics.write(
                {
                    "event": "member_failed",
                    "generation": g,
                    "step": step,
                    "member": m,
                    "error": record.error,
                }
            )
            loop.ctx.log.warning(
                "member %d failed in generation %d (it will be replaced): %s",
                m,
                g,
                record.error,
            )
    fit = fitness([r.score for r in generation.members], loop.mode)
    good = [m for m in range(loop.size) if not math.isnan(fit[m])]
    best = best_member(generation, loop.mode)
    samples = sum(s.samples for s in everyone.values())
    busy = max(
        sum(s.compute_s for m, s in everyone.items() if loop.roles.owner(m) == r)
        for r in range(loop.ctx.world_size)
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
        "failed": loop.size - len(good),
        "loss": float(np.mean(loss)) if loss else math.nan,
        "samples_per_s": samples / busy if busy else 0.0,
        "lr": generation.members[best].hyperparameters.get("lr", loop.train.optimizer.lr),
    }
    loop.run.metrics.write(summary)
    epoch = min(member.progress.last_step_epoch for member in loop.members.values())
    loop.run.reporter.update(step, epoch, summary)
    shown = ", ".join(f"{k} {v:.4g}" for k, v in generation.members[best].hyperparameters.items())
    loop.run.reporter.note(
        f"generation {g + 1}/{loop.generations} step {step}: best member {best} "
        f"{loop.metric} {summary['best_score']:.4f} ({shown}); median "
        f"{summary['median_score']:.4f}; {summary['failed']} failed"
    )
