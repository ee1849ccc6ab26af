"""The strategies' own panels, each drawn when its records are there.

- parameter server: pulls and pushes per second (the interval's `ps_pulls`,
  `ps_pushes` over `interval_s`), the servers' apply and hold time so far, the
  staleness histogram (results.json's, or the newest `ps_staleness_<k>` counts);
- federated: participants and dropped clients, the global and mean client update
  norms, and the validation metrics, per round;
- population: the strategy's own `population.svg` (scores and hyperparameters by
  member, lineage as dashed copies; `strategies/population/plot.py` draws it and
  the report shows that file rather than drawing it twice), the newest generation
  by member and the exploit copies;
- model parallel: the pipeline's measured bubble beside the schedule's theory, each
  rank's compute and idle seconds per step and peak memory (`rank<r>_*` fields,
  results.json's `pipeline.ranks`); a tensor-parallel / sharded / hybrid run's
  per-rank step time split into compute and the gradient sync (the step loop's
  `rank<r>_forward_backward_s`, `_comm_s`, `_optimizer_s`: the collectives inside the
  layers' DTensor ops and FSDP's gathers run inside forward and backward and cannot be
  told apart from the compute there; the sync after backward is timed on its own), its
  peak memory, results.json's per-rank state bytes, and the mesh.
"""

from __future__ import annotations

import html
from typing import Any

from shoal.report.figures import Series, bars, lines, stacked_bars
from shoal.report.panels import Curve, Panel, charts, color, column, curve_series, label, table
from shoal.report.panels import per_rank_means as means
from shoal.report.runs import RunData
from shoal.report.svg import UnsafeSvg, sanitized_svg

MESH_STRATEGIES = ("pipeline", "tensor_parallel", "fully_sharded", "hybrid")
#: an SPMD rank's step: the step loop's phases, named for what they hold under a mesh
SPMD_PARTS = {
    "compute (forward/backward with the layers' collectives)": "forward_backward_s",
    "gradient sync (after backward)": "comm_s",
    "optimizer": "optimizer_s",
    "data": "data_s",
}


def parameter_server_panel(runs: list[RunData]) -> Panel | None:
    runs = [r for r in runs if any("ps_pulls" in t for t in r.records("train"))]
    if not runs:
        return None
    rates = []
    for i, run in enumerate(runs):
        train = run.records("train")
        for name, style in (("pulls", "-"), ("pushes", "--")):
            xs, ys = [], []
            for record in train:
                count, seconds = record.get(f"ps_{name}"), record.get("interval_s")
                if (
                    isinstance(count, int | float)
                    and isinstance(seconds, int | float)
                    and seconds > 0
                ):
                    xs.append(float(record["step"]))
                    ys.append(count / seconds)
            rates.append(Series(label(runs, run, f"{name}/s"), xs, ys, style, color(i)))
    servers = curve_series(
        runs,
        [
            Curve(("train",), f"ps_server_{name}_s", f"server {name} time", style)
            for name, style in (("apply", "-"), ("held", "--"))
        ],
    )
    svgs = [
        lines(rates, "step", "per second (all workers)"),
        lines(servers, "step", "seconds so far (all servers)"),
    ]
    for run in runs:
        histogram = _staleness(run)
        if histogram:
            title = f"{run.name}: staleness" if len(runs) > 1 else "staleness"
            svgs.append(
                bars(list(histogram), list(histogram.values()), "pulls", title + " (clocks)")
            )
    return Panel(
        "parameter_server",
        "Parameter server",
        charts(*svgs),
        "pulls and pushes per second, server apply and hold time, staleness of the pulls served",
    )


def _staleness(run: RunData) -> dict[str, float]:
    section = (run.results or {}).get("parameter_server") or {}
    histogram = section.get("staleness_histogram")
    if histogram:
        return {str(k): float(v) for k, v in histogram.items()}
    for record in reversed(run.records("train")):
        found = {
            k[len("ps_staleness_") :]: float(v)
            for k, v in record.items()
            if k.startswith("ps_staleness_")
        }
        if found:
            return dict(sorted(found.items(), key=lambda kv: int(kv[0])))
    return {}


def federated_panel(runs: list[RunData]) -> Panel | None:
    runs = [r for r in runs if r.records("round")]
    if not runs:
        return None
    rounds = ("round",)
    clients = curve_series(
        runs,
        [
            Curve(rounds, "participants", "participants", "o-"),
            Curve(rounds, "dropped", "dropped", "--"),
        ],
        x="round",
    )
    norms = curve_series(
        runs,
        [
            Curve(rounds, "update_norm", "global update", "o-"),
            Curve(rounds, "client_update_norm_mean", "client update (mean)", "--"),
        ],
        x="round",
    )
    metrics = []
    for i, run in enumerate(runs):
        for record_name in _eval_metrics(run):
            split, name = record_name
            evals = [r for r in run.records("eval") if r.get("split") == split]
            xs, ys = column(evals, "step", name)
            metrics.append(Series(label(runs, run, f"{split} {name}"), xs, ys, "o-", color(i)))
    body = charts(
        lines(clients, "round", "clients"),
        lines(norms, "round", "update norm"),
        lines([s for s in metrics if s.xs], "round", "validation")
        if any(s.xs for s in metrics)
        else "",
    )
    return Panel(
        "federated",
        "Federated rounds",
        body,
        "participants and dropped clients, update norms and validation per round",
    )


def _eval_metrics(run: RunData) -> list[tuple[str, str]]:
    """(split, metric) of the validation records, the loss left to the loss panel."""
    found: dict[tuple[str, str], None] = {}
    for record in run.records("eval"):
        for key, value in record.items():
            if key not in ("step", "epoch", "time", "loss") and isinstance(value, int | float):
                found[(str(record.get("split")), key)] = None
    return list(found)


def population_panel(runs: list[RunData]) -> Panel | None:
    runs = [r for r in runs if r.records("member")]
    if not runs:
        return None
    parts = []
    for run in runs:
        title = f"<h3>{html.escape(run.name)}</h3>" if len(runs) > 1 else ""
        plot = _read_svg(run)
        members = _newest_generation(run.records("member"))
        rows = [
            [
                m.get("member"),
                m.get("score"),
                _hyper(m.get("hyperparameters")),
                m.get("parent"),
                m.get("status"),
            ]
            for m in members
        ]
        copies = [
            [
                e.get("generation"),
                e.get("member"),
                e.get("parent"),
                _hyper(e.get("hyperparameters")),
            ]
            for e in run.records("exploit")[-20:]
        ]
        generation = members[0].get("generation") if members else "?"
        parts.append(
            title
            + (plot or "<p>population.svg not written yet</p>")
            + f"<h4>generation {html.escape(str(generation))}, by member</h4>"
            + table(["member", "score", "hyperparameters", "copied from", "status"], rows)
            + (
                "<h4>lineage: the newest exploit copies</h4>"
                + table(["generation", "member", "copied from", "new hyperparameters"], copies)
                if copies
                else ""
            )
        )
    return Panel(
        "population",
        "Population",
        "".join(parts),
        "scores and hyperparameters by member; a dashed line is a copy from its parent",
    )


def _read_svg(run: RunData) -> str:
    """population.svg as safe inline SVG (`svg.py`), or a line saying why it is not shown."""
    path = run.root / "population.svg"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8
        return f"<p>{html.escape(f'{path}: unreadable ({exc})')}</p>"
    try:
        return f'<div class="chart wide">{sanitized_svg(text)}</div>'
    except UnsafeSvg as exc:
        return f"<p>{html.escape(f'{path}: not shown: {exc}')}</p>"


def _newest_generation(members: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def generation(member: dict[str, Any]) -> int:
        value = member.get("generation", 0)
        return value if isinstance(value, int) else -1  # a line shoal did not write

    newest = max(generation(m) for m in members)
    return [m for m in members if generation(m) == newest]


def _hyper(values: Any) -> str:
    if not isinstance(values, dict):
        return ""
    return ", ".join(
        f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in values.items()
    )


def model_parallel_panel(runs: list[RunData]) -> Panel | None:
    runs = [r for r in runs if r.strategy in MESH_STRATEGIES or _bubble_records(r)]
    if not runs:
        return None
    svgs, notes = [], []
    bubble = []
    for i, run in enumerate(runs):
        records = _bubble_records(run)
        for name, what, style in (
            ("pipeline_bubble", "bubble (measured)", "-"),
            ("pipeline_bubble_theory", "bubble (schedule's theory)", "--"),
        ):
            xs, ys = column(records, "step", name)
            bubble.append(Series(label(runs, run, what), xs, ys, style, color(i)))
    if any(s.xs for s in bubble):
        svgs.append(lines([s for s in bubble if s.xs], "step", "idle fraction of a step"))
    labels: list[str] = []
    parts: dict[str, list[float]] = {"compute": [], "idle": []}
    for run in runs:
        compute, idle = run.per_rank("compute_s"), run.per_rank("idle_s")
        for r, (c, d) in enumerate(zip(compute, idle, strict=False)):
            labels.append(f"{run.name} rank {r}" if len(runs) > 1 else f"rank {r}")
            parts["compute"].append(c)
            parts["idle"].append(d)
    if labels:
        svgs.append(stacked_bars(labels, parts, "seconds per step"))
    svgs += _spmd_charts(runs)
    rows = []
    for run in runs:
        section = (run.results or {}).get("pipeline") or {}
        for rank in section.get("ranks", []):
            rows.append(
                [
                    run.name,
                    rank.get("rank"),
                    rank.get("stages"),
                    rank.get("bubble"),
                    rank.get("peak_mb"),
                    rank.get("parameters_gradients_optimizer_mb"),
                ]
            )
        strategy = run.config.get("strategy", {})
        mesh = strategy.get("mesh") or {
            k: v for k, v in strategy.items() if k.endswith("_degree") or k in ("degree", "stages")
        }
        if mesh:
            notes.append(f"{run.name}: {run.strategy} {mesh}")
    body = charts(*svgs)
    if rows:
        body += table(
            ["run", "rank", "stages", "bubble", "peak MB", "parameters+gradients+optimizer MB"],
            rows,
        )
    memory = _spmd_memory_rows(runs)
    if memory:
        body += table(
            ["run", "rank", "parameters MB", "gradients MB", "optimizer MB", "peak MB"], memory
        )
    if notes:
        body += "".join(f"<p>{html.escape(n)}</p>" for n in notes)
    if not body:
        body = "<p>no per-stage figures recorded yet</p>"
    return Panel(
        "model_parallel",
        "Model parallel",
        body,
        "per-stage compute and idle time, memory, and the pipeline bubble; per-rank compute, "
        "gradient sync and memory of a tensor-parallel, sharded or hybrid mesh",
    )


def _spmd(run: RunData) -> bool:
    """An SPMD mesh run (a pipeline, also one in a hybrid mesh, records compute and idle)."""
    return run.strategy in MESH_STRATEGIES[1:] and not run.per_rank("compute_s")


def _spmd_charts(runs: list[RunData]) -> list[str]:
    """Each SPMD rank's seconds per step by part, and its peak memory."""
    labels: list[str] = []
    parts: dict[str, list[float]] = {name: [] for name in SPMD_PARTS}
    peaks: list[float] = []
    for run in (r for r in runs if _spmd(r)):
        records = [r for r in run.records("train") if "rank0_comm_s" in r]
        ranks = len(run.per_rank("comm_s"))
        split = {name: means(records, field_, ranks) for name, field_ in SPMD_PARTS.items()}
        peak = run.per_rank("peak_mb")
        for r in range(ranks):
            labels.append(f"{run.name} rank {r}" if len(runs) > 1 else f"rank {r}")
            for name in SPMD_PARTS:
                parts[name].append(split[name][r])
            peaks.append(peak[r] if r < len(peak) else 0.0)
    if not labels:
        return []
    used = {k: v for k, v in parts.items() if any(v)}
    return [
        stacked_bars(labels, used, "seconds per step"),
        bars(labels, peaks, "peak memory (MB)", horizontal=True),
    ]


def _spmd_memory_rows(runs: list[RunData]) -> list[list[Any]]:
    """results.json's `memory.per_rank` of SPMD runs: each rank's local shards, in MB."""
    rows = []
    for run in (r for r in runs if _spmd(r)):
        for rank, entry in enumerate(((run.results or {}).get("memory") or {}).get("per_rank", [])):
            mb = [entry.get(f"{k}_bytes", 0) / 2**20 for k in ("parameters", "gradients")]
            mb += [entry.get(f"{k}_bytes", 0) / 2**20 for k in ("optimizer", "peak_rss")]
            rows.append([run.name, rank, *mb])
    return rows


def _bubble_records(run: RunData) -> list[dict[str, Any]]:
    return [r for r in run.records("train") if "pipeline_bubble" in r]
