"""What a generation reports: lineage lines in metrics.jsonl, progress, the log."""

from __future__ import annotations

import math

import numpy as np

from shoal.shape.roles import RankRoles
from shoal.strategies.population.lineage import Generation
from shoal.strategies.population.member import GenerationStats, Member
from shoal.strategies.population.operators import fitness
from shoal.strategies.population.record import best_member
from shoal.training.loop import Run


class GenerationReport:
    """Writes what each generation did; built once the loop knows its run and its plan."""

    def __init__(
        self, run: Run, roles: RankRoles, metric: str, mode: str, split: str, generations: int
    ) -> None:
        self.run, self.roles, self.metric, self.mode = run, roles, metric, mode
        self.split, self.generations = split, generations
        self.default_lr = run.ctx.config.train.optimizer.lr

    def members(self, generation: Generation) -> None:
        """A `member` line per member (the lineage) and a `member_failed` line per failure,
        written before exploit and explore (which may end the run)."""
        g, step = generation.index, generation.end
        for m, record in enumerate(generation.members):
            self.run.metrics.write(
                {
                    "event": "member",
                    "generation": g,
                    "step": step,
                    "member": m,
                    "rank": self.roles.owner(m),
                    "hyperparameters": record.hyperparameters,
                    "parent": record.parent,
                    "score": record.score,
                    "metric": self.metric,
                    "status": "failed" if record.error else "ok",
                    "train_loss": record.train_loss,
                    self.split: record.metrics,
                    **({"error": record.error} if record.error else {}),
                }
            )
            if record.error:
                self.run.metrics.write(
                    {
                        "event": "member_failed",
                        "generation": g,
                        "step": step,
                        "member": m,
                        "error": record.error,
                    }
                )
                self.run.ctx.log.warning(
                    "member %d failed in generation %d (it will be replaced): %s",
                    m,
                    g,
                    record.error,
                )

    def summary(
        self,
        generation: Generation,
        everyone: dict[int, GenerationStats],
        members: dict[int, Member],
        sent_bytes_per_step: float = 0.0,
        seconds: float = 0.0,
        phases: dict[str, float] | None = None,
    ) -> None:
        """The `generation` summary, which the progress display shows. `members`: this
        worker's; `sent_bytes_per_step`: what this rank sent to peers (states, exploit
        copies); `seconds`: wall time since the previous generation's summary (or the first
        start); `phases`: every worker's `rank<r>_<phase>` seconds of the generation."""
        g, step = generation.index, generation.end
        fit = fitness([r.score for r in generation.members], self.mode)
        good = [m for m in range(len(generation.members)) if not math.isnan(fit[m])]
        best = best_member(generation, self.mode)
        samples = sum(s.samples for s in everyone.values())
        busy = max(
            sum(s.compute_s for m, s in everyone.items() if self.roles.owner(m) == r)
            for r in range(self.run.ctx.world_size)
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
            "failed": len(generation.members) - len(good),
            "loss": float(np.mean(loss)) if loss else math.nan,
            "samples_per_s": samples / busy if busy else 0.0,
            "sent_bytes_per_step": sent_bytes_per_step,
            "generation_s": seconds,
            "lr": generation.members[best].hyperparameters.get("lr", self.default_lr),
            **(phases or {}),
        }
        self.run.metrics.write(summary)
        epoch = min(member.progress.last_step_epoch for member in members.values())
        self.run.reporter.update(step, epoch, summary)
        shown = ", ".join(
            f"{k} {v:.4g}" for k, v in generation.members[best].hyperparameters.items()
        )
        self.run.reporter.note(
            f"generation {g + 1}/{self.generations} step {step}: best member {best} "
            f"{self.metric} {summary['best_score']:.4f} ({shown}); median "
            f"{summary['median_score']:.4f}; {summary['failed']} failed"
        )
