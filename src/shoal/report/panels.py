"""The panels every run has: config, summary, curves, throughput, time, bytes, norm, memory.

A panel reads the records every strategy writes through the one driver (see
`training/driver.py`, `training/meter.py`): `train` lines of the step loop,
`round` lines of federated, `generation` lines of population_based, `eval`
lines of every validation, `checkpoint` lines. Several runs overlay: each run
has one colour in every chart, training solid, validation dashed.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from shoal.report.figures import Series, bars, lines, stacked_bars
from shoal.report.runs import UNIT_EVENTS, RunData

#: the records with a step's training figures, by strategy family
TRAIN_EVENTS = UNIT_EVENTS
#: where a unit's time goes, per rank (training/meter.py's RankPhases fields: the step
#: loop's phases, a generation's evaluation, the rest of a round or a generation); the
#: checkpoint's share comes from the checkpoint records
PHASES = {
    "data": "data_s",
    "forward/backward": "forward_backward_s",
    "communication wait": "comm_s",
    "optimizer": "optimizer_s",
    "evaluation": "eval_s",
    "other": "other_s",
}
#: the unit of a run's per-rank phases, by the event that records them
UNITS = {"train": "step", "round": "round", "generation": "generation"}
MAX_METRICS = 6  # metric charts per page; the rest are in the summary table


@dataclass
class Panel:
    key: str  # the section's data-panel attribute
    title: str
    body: str  # HTML: inline SVG, tables
    note: str = ""  # what is drawn, in one line


Build = Callable[[list[RunData]], Panel | None]


def color(index: int) -> str:
    return f"C{index % 10}"


def label(runs: list[RunData], run: RunData, what: str) -> str:
    return f"{run.name}: {what}" if len(runs) > 1 else what


def column(records: Iterable[dict[str, Any]], x: str, y: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for record in records:
        a, b = record.get(x), record.get(y)
        if isinstance(a, int | float) and isinstance(b, int | float):
            xs.append(float(a))
            ys.append(float(b))
    return xs, ys


def table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(fmt(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and (abs(value) >= 1e9 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if value is None:
        return "—"
    return str(value)


def charts(*svgs: str, wide: bool = False) -> str:
    """The panel's charts side by side; `wide`: one chart drawn wide, alone in its row."""
    kind = "chart wide" if wide else "chart"
    return "".join(f'<div class="{kind}">{svg}</div>' for svg in svgs if svg)


# ------------------------------------------------------------------ config and summary
def config_panel(runs: list[RunData]) -> Panel:
    blocks = "".join(
        f"<details{' open' if len(runs) == 1 else ''}><summary>{html.escape(r.name)}: "
        f"config.toml</summary>{_optimizer_note(r)}"
        f"<pre>{html.escape(r.config_text or '(no config.toml)')}</pre></details>"
        for r in runs
    )
    return Panel("config", "Resolved config", blocks, "the config each run ran with")


def optimizer_in_use(run: RunData) -> tuple[str, dict[str, Any]] | None:
    """(field, table) of the optimizer that trains the run: a strategy with an optimizer of
    its own (a parameter server's, for the rows it serves) uses it instead of
    `train.optimizer`, which the resolved config still lists with its defaults."""
    strategy, train = run.config.get("strategy"), run.config.get("train")
    if isinstance(strategy, dict) and isinstance(strategy.get("optimizer"), dict):
        return "strategy.optimizer", strategy["optimizer"]
    if isinstance(train, dict) and isinstance(train.get("optimizer"), dict):
        return "train.optimizer", train["optimizer"]
    return None


def _optimizer_text(run: RunData) -> str | None:
    found = optimizer_in_use(run)
    if found is None:
        return None
    field, table = found
    settings = ", ".join(f"{k} {v}" for k, v in table.items() if k != "kind" and _number(v))
    return (
        f"{table.get('kind', '?')} ({settings}; {field})"
        if settings
        else f"{table.get('kind', '?')} ({field})"
    )


def _optimizer_note(run: RunData) -> str:
    found = optimizer_in_use(run)
    if found is None or found[0] == "train.optimizer":
        return ""
    return (
        f"<p>The optimizer this run trains with is {html.escape(str(_optimizer_text(run)))}: "
        "its strategy's own. [train.optimizer] below is not used (the config lists every "
        "section's defaults).</p>"
    )


def summary_panel(runs: list[RunData]) -> Panel:
    rows = [(name, [get(r) for r in runs]) for name, get in SUMMARY]
    shown = [[name, *values] for name, values in rows if any(v is not None for v in values)]
    body = table(["", *(r.name for r in runs)], shown)
    return Panel(
        "summary", "Summary", body, "from results.json, or the newest records while running"
    )


def _final(run: RunData, key: str) -> Any:
    if run.results and key in run.results:
        return run.results[key]
    last = run.records(*TRAIN_EVENTS)
    return last[-1].get(key) if last else None


def _split(run: RunData, split: str) -> str | None:
    figures = (run.results or {}).get(split)
    if not figures:
        evals = [r for r in run.records("eval", "test") if r.get("split") == split]
        last = evals[-1] if evals else {}
        figures = {k: v for k, v in last.items() if k == "loss" or _metric(k, v)}
    if not isinstance(figures, dict) or not figures:
        return None
    return ", ".join(f"{k} {fmt(v)}" for k, v in figures.items() if _number(v))


def _peak(run: RunData) -> str | None:
    peaks = ((run.results or {}).get("ranks") or {}).get("peak_memory_mb") or run.per_rank(
        "peak_mb"
    )
    return f"{max(peaks):,.0f} MB (of {len(peaks)} ranks)" if peaks else None


def _counts(run: RunData, key: str) -> Any:
    counts = (run.results or {}).get("counts")
    if counts:
        return counts.get(key)
    if key == "checkpoints":
        return len(run.records("checkpoint"))
    return len(run.records("failure"))


SUMMARY: list[tuple[str, Callable[[RunData], Any]]] = [
    ("status", lambda r: r.status),
    ("strategy", lambda r: (r.results or {}).get("strategy_detail") or r.strategy),
    ("task", lambda r: (r.results or {}).get("task") or r.config.get("task", {}).get("type")),
    ("world size", lambda r: (r.results or {}).get("world_size")),
    ("optimizer", _optimizer_text),
    ("steps", lambda r: _final(r, "steps") or _final(r, "step")),
    ("wall time (s)", lambda r: (r.results or {}).get("wall_time_s")),
    ("train time (s)", lambda r: (r.results or {}).get("train_time_s")),
    ("samples/s", lambda r: _final(r, "samples_per_s")),
    ("train", lambda r: _split(r, "train") or _final(r, "loss")),
    ("valid", lambda r: _split(r, "valid")),
    ("test", lambda r: _split(r, "test")),
    ("best", lambda r: _best(r)),
    ("checkpoints", lambda r: _counts(r, "checkpoints")),
    ("failures", lambda r: _counts(r, "failures")),
    ("restarts", lambda r: (r.results or {}).get("restarts")),
    ("peak memory", _peak),
]


def _best(run: RunData) -> str | None:
    best = (run.results or {}).get("best")
    if not isinstance(best, dict) or "value" not in best:
        return None
    return f"{best.get('metric')} {fmt(best['value'])} at step {best.get('step')}"


# ------------------------------------------------------------------ curves
def loss_panel(runs: list[RunData]) -> Panel | None:
    by_step, by_time = [], []
    for i, run in enumerate(runs):
        train = run.records(*TRAIN_EVENTS)
        evals = [r for r in run.records("eval") if "loss" in r]
        start = run.start_time or 0.0
        for records, what, style in ((train, "train loss", "-"), (evals, "valid loss", "--")):
            xs, ys = column(records, "step", "loss")
            by_step.append(Series(label(runs, run, what), xs, ys, style, color(i)))
            ts, ys = column(records, "time", "loss")
            ts = [t - start for t in ts]
            by_time.append(Series(label(runs, run, what), ts, ys, style, color(i)))
    if not any(s.xs for s in by_step):
        return None
    body = charts(
        lines(by_step, "step", "loss", log_y=True), lines(by_time, "wall time (s)", "loss", True)
    )
    return Panel(
        "loss", "Loss", body, "training (solid) and validation (dashed), by step and by wall time"
    )


def metrics_panel(runs: list[RunData]) -> Panel | None:
    """One chart per metric (accuracy, mrr, ...): training `train_<m>` and each split's <m>."""
    names: dict[str, None] = {}
    for run in runs:
        for record in run.records(*TRAIN_EVENTS):
            names.update(dict.fromkeys(k[6:] for k in record if k.startswith("train_")))
        for record in run.records("eval"):
            names.update(dict.fromkeys(k for k, v in record.items() if _metric(k, v)))
        if run.records("generation"):
            names.update({"best_score": None, "median_score": None})
    svgs = []
    shown = [n for n in names if _has_metric(runs, n)][:MAX_METRICS]
    for name in shown:
        series = []
        for i, run in enumerate(runs):
            xs, ys = column(run.records(*TRAIN_EVENTS), "step", f"train_{name}")
            series.append(Series(label(runs, run, f"train {name}"), xs, ys, "-", color(i)))
            for split in _splits(run):
                evals = [r for r in run.records("eval") if r.get("split") == split]
                xs, ys = column(evals, "step", name)
                series.append(Series(label(runs, run, f"{split} {name}"), xs, ys, "--", color(i)))
            xs, ys = column(run.records("generation"), "step", name)
            series.append(Series(label(runs, run, name.replace("_", " ")), xs, ys, "o-", color(i)))
        if any(s.xs for s in series):
            svgs.append(lines([s for s in series if s.xs], "step", name, wide=len(shown) == 1))
    if not svgs:
        return None
    body = charts(*svgs, wide=len(svgs) == 1)
    return Panel("metrics", "Metrics", body, "training (solid) and validation (dashed) by step")


def _has_metric(runs: list[RunData], name: str) -> bool:
    """Whether any record draws metric `name` (a chart of it has a line)."""
    keys = (f"train_{name}", name)
    return any(
        any(isinstance(r.get(k), int | float) for k in keys)
        for run in runs
        for r in run.records(*TRAIN_EVENTS, "eval")
    )


@dataclass(frozen=True)
class Curve:
    """One field drawn per run: from the records of `events`, labelled `what`."""

    events: tuple[str, ...]
    field: str
    what: str
    style: str = "-"


def curve_series(runs: list[RunData], curves: list[Curve], x: str = "step") -> list[Series]:
    """Each curve once per run, in the run's colour, against record field `x`; the curves
    that no record has are left out."""
    series = [
        Series(
            label(runs, run, c.what), *column(run.records(*c.events), x, c.field), c.style, color(i)
        )
        for i, run in enumerate(runs)
        for c in curves
    ]
    return [s for s in series if s.xs]


def line_panel(
    runs: list[RunData],
    panel: tuple[str, str, str],
    y_label: str,
    curves: list[Curve],
    log_y: bool = False,
) -> Panel | None:
    """One wide chart of `curves` by step; None when no record has any of their fields.
    `panel`: the key, title and note of the Panel."""
    series = curve_series(runs, curves)
    if not series:
        return None
    key, title, note = panel
    return Panel(
        key, title, charts(lines(series, "step", y_label, log_y, wide=True), wide=True), note
    )


def throughput_panel(runs: list[RunData]) -> Panel | None:
    return line_panel(
        runs,
        ("throughput", "Throughput", "training samples per second of step time"),
        "samples/s",
        [Curve(TRAIN_EVENTS, "samples_per_s", "samples/s")],
    )


def bytes_panel(runs: list[RunData]) -> Panel | None:
    return line_panel(
        runs,
        (
            "bytes",
            "Bytes sent",
            "what went on the wire per step (the mean over ranks) or per round",
        ),
        "bytes",
        [
            Curve(("train", "generation"), "sent_bytes_per_step", "bytes sent per step, per rank"),
            Curve(("round",), "client_bytes_up", "client bytes up per round"),
            Curve(("round",), "client_bytes_down", "client bytes down per round", "--"),
        ],
    )


def grad_norm_panel(runs: list[RunData]) -> Panel | None:
    return line_panel(
        runs,
        ("grad_norm", "Gradient norm", "the global norm before clipping, at each logged step"),
        "global gradient norm",
        [Curve(("train",), "grad_norm", "gradient norm")],
        log_y=True,
    )


# ------------------------------------------------------------------ per rank
def time_panel(runs: list[RunData]) -> Panel | None:
    """Where a unit's time goes, one bar per rank: the phases every strategy records per
    rank (`training/meter.py`'s RankPhases; averaged over the logged steps, rounds or
    generations), plus checkpoint writing spread over the units. Runs without per-rank
    phases (older runs) show their whole-run split (results.json's `time_s`) or round time."""
    labels: list[str] = []
    parts: dict[str, list[float]] = {name: [] for name in [*PHASES, "checkpoint"]}
    units: dict[str, None] = {}
    for run in runs:
        unit, times = _rank_times(run)
        if times:
            units[f"{unit} ({run.strategy})" if len(runs) > 1 else unit] = None
        for rank_label, figures in times:
            labels.append(f"{run.name} {rank_label}" if len(runs) > 1 else rank_label)
            for name in parts:
                parts[name].append(figures.get(name, 0.0))
    if not labels:
        return None
    used = {k: v for k, v in parts.items() if any(v)}
    shades = {name: color(i) for i, name in enumerate(parts)}  # a phase keeps its colour
    per = ", ".join(units)
    body = charts(stacked_bars(labels, used, f"seconds per {per}", shades, wide=True), wide=True)
    return Panel(
        "time",
        "Where a step's time goes",
        body,
        "per rank: data, forward/backward, communication wait, optimizer, checkpoint (a "
        "federated run: per round, its clients' steps and the aggregation; a population: per "
        "generation, its members' steps, their evaluation and the exploit copies)",
    )


def _rank_times(run: RunData) -> tuple[str, list[tuple[str, dict[str, float]]]]:
    """The unit ("step", "round", "generation") and each rank's seconds per unit by part."""
    event = next((e for e in UNIT_EVENTS if any("rank0_comm_s" in r for r in run.records(e))), None)
    if event is not None:
        records = [r for r in run.records(event) if "rank0_comm_s" in r]
        ranks = len(run.per_rank("comm_s"))
        means = {name: per_rank_means(records, field_, ranks) for name, field_ in PHASES.items()}
        if event == "train":
            units = max(float(_final(run, "steps") or _final(run, "step") or 1), 1.0)
        else:
            units = float(max(len(run.records(event)), 1))
        checkpoint = _checkpoint_s(run, ranks)
        return UNITS[event], [
            (f"rank {r}", {**{n: means[n][r] for n in PHASES}, "checkpoint": checkpoint[r] / units})
            for r in range(ranks)
        ]
    steps = max(float(_final(run, "steps") or _final(run, "step") or 1), 1.0)
    time_s = (run.results or {}).get("time_s")
    if isinstance(time_s, dict) and time_s:
        named = {"compute": "forward/backward", "communication": "communication wait"}
        figures = {
            named.get(k, "other"): float(v) / steps for k, v in time_s.items() if k != "checkpoint"
        }
        figures["checkpoint"] = float(time_s.get("checkpoint", 0.0)) / steps
        return "step", [("all ranks", figures)]
    rounds = run.records("round")
    if rounds:
        spent = [float(r["round_s"]) for r in rounds if _number(r.get("round_s"))]
        writing = sum(_checkpoint_s(run, 1)) / max(len(rounds), 1)
        other = sum(spent) / max(len(spent), 1)
        return "round", [("a round", {"other": other, "checkpoint": writing})]
    return "step", []


def per_rank_means(records: list[dict[str, Any]], field_: str, ranks: int) -> list[float]:
    """Each rank's mean of `rank<r>_<field_>` over `records` (0 where never recorded)."""
    sums, counts = [0.0] * ranks, [0] * ranks
    for record in records:
        for r in range(ranks):
            value = record.get(f"rank{r}_{field_}")
            if isinstance(value, int | float):
                sums[r] += float(value)
                counts[r] += 1
    return [s / c if c else 0.0 for s, c in zip(sums, counts, strict=True)]


def _checkpoint_s(run: RunData, ranks: int) -> list[float]:
    """Each rank's seconds writing checkpoints (results.json); while running, rank 0's
    (the checkpoint records) for every rank."""
    measured = ((run.results or {}).get("ranks") or {}).get("checkpoint_s")
    if measured and len(measured) >= ranks:
        return [float(v) for v in measured[:ranks]]
    seconds = sum(float(r.get("seconds") or 0.0) for r in run.records("checkpoint"))
    return [seconds] * ranks


def memory_panel(runs: list[RunData]) -> Panel | None:
    labels, values = [], []
    for run in runs:
        peaks = ((run.results or {}).get("ranks") or {}).get("peak_memory_mb") or run.per_rank(
            "peak_mb"
        )
        for r, peak in enumerate(peaks):
            labels.append(f"{run.name} rank {r}" if len(runs) > 1 else f"rank {r}")
            values.append(float(peak))
    if not labels:
        return None
    body = charts(bars(labels, values, "peak memory (MB)", horizontal=True, wide=True), wide=True)
    return Panel(
        "memory", "Peak memory per rank", body, "resident set on CPU, the allocator's peak on CUDA"
    )


# ------------------------------------------------------------------ several runs
def differences_panel(runs: list[RunData]) -> Panel | None:
    """The config fields and results that differ between the runs."""
    if len(runs) < 2:
        return None
    flat = [(_flatten(r.config), _flatten(_comparable(r.results or {}))) for r in runs]
    rows = []
    for index, what in ((0, "config"), (1, "results")):
        keys = sorted(set().union(*(f[index] for f in flat)))
        for key in keys:
            values = [f[index].get(key) for f in flat]
            if len({repr(v) for v in values}) > 1:
                rows.append([f"{what}: {key}", *values])
    body = table(["", *(r.name for r in runs)], rows) if rows else "<p>no differences</p>"
    return Panel(
        "differences",
        "Differences between the runs",
        body,
        "config fields and results that are not the same in every run",
    )


def _comparable(results: dict[str, Any]) -> dict[str, Any]:
    skip = ("run_dir", "checkpoint", "plot", "ranks", "failures", "population")
    return {k: v for k, v in results.items() if k not in skip}


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and len(value) > 8:
        return {}
    return {prefix: value}


# ------------------------------------------------------------------ helpers
def _splits(run: RunData) -> list[str]:
    return list(dict.fromkeys(str(r.get("split")) for r in run.records("eval")))


def _metric(key: str, value: Any) -> bool:
    return _number(value) and key not in ("step", "epoch", "time", "loss", "model_step")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
