"""results.json of a population: the best member, its schedule and checkpoint, the population."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from shoal.checkpoint.atomic import atomic_write_json
from shoal.strategies.population.lineage import schedule
from shoal.strategies.population.operators import fitness

if TYPE_CHECKING:
    from shoal.strategies.population.loop import PopulationTrainer


def population_results(trainer: PopulationTrainer, wall_s: float) -> dict[str, Any]:
    """Rank 0 writes results.json and the plot; every rank returns the same results."""
    ctx, history = trainer.ctx, trainer.history
    last = history[-1]
    fit = fitness([r.score for r in last.members], trainer.mode)
    good = [m for m in range(len(fit)) if not math.isnan(fit[m])]
    best = max(good, key=lambda m: (fit[m], -m)) if good else 0
    record = last.members[best]
    checkpoint = str(trainer.last_checkpoint) if trainer.last_checkpoint else None
    samples = trainer.samples
    results: dict[str, Any] = {
        "status": "stopped" if trainer.stopped else "completed",
        "run_dir": str(ctx.paths.root),
        "task": ctx.config.task.type,
        "strategy": ctx.config.strategy.type,
        "strategy_detail": trainer.describe,
        "world_size": ctx.world_size,
        "population_size": trainer.size,
        "generations": len(history),
        "steps": last.end,
        "samples": samples,
        "wall_time_s": wall_s,
        "samples_per_s": samples / trainer.times["compute"] if trainer.times["compute"] else 0.0,
        "time_s": dict(trainer.times),
        "metric": trainer.metric,
        "mode": trainer.mode,
        "best": {
            "member": best,
            "score": record.score,
            "hyperparameters": record.hyperparameters,
            "schedule": schedule(history, best),
            "checkpoint": checkpoint,
            "state": f"members[{best}]",
        },
        "population": [
            {
                "member": m,
                "score": r.score,
                "hyperparameters": r.hyperparameters,
                "parent": r.parent,
                "status": "failed" if r.error else "ok",
            }
            for m, r in enumerate(last.members)
        ],
        "failures": trainer.failures,
        "replaced": trainer.replaced,
        "train": {"loss": record.train_loss},
        trainer.config.split: record.metrics,
        "checkpoint": checkpoint,
        "plot": str(trainer.plot.path),
    }
    if trainer.stopped:
        results["stop"] = trainer.stopped
    if ctx.is_main:
        trainer.plot.write(history)
        atomic_write_json(ctx.paths.results, _finite(results))
    return results


def _finite(value: Any) -> Any:
    """JSON has no NaN: a failed member's score is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
