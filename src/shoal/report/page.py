"""The HTML page: a header per run, then the panels in a fixed order, then a footer."""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from pathlib import Path

from shoal.checkpoint.atomic import atomic_write_bytes
from shoal.report import panels as common
from shoal.report import strategy_panels as own
from shoal.report.panels import Build, Panel
from shoal.report.runs import RunData, load_run

#: the page's panels, in order (each returns None when it has nothing to draw)
PANELS: list[Build] = [
    common.summary_panel,
    common.differences_panel,
    common.loss_panel,
    common.metrics_panel,
    common.throughput_panel,
    common.time_panel,
    common.bytes_panel,
    common.grad_norm_panel,
    common.memory_panel,
    own.parameter_server_panel,
    own.federated_panel,
    own.population_panel,
    own.model_parallel_panel,
    common.config_panel,
]

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
  color: #1d2430; background: #f4f5f7; }
header { background: #1d2430; color: #fff; padding: 14px 24px; }
header h1 { font-size: 20px; margin: 0 0 4px; }
header .run { display: inline-block; margin: 4px 12px 0 0; font-size: 13px; opacity: .9; }
main { padding: 12px 24px 32px; }
section.panel { background: #fff; border-radius: 8px; padding: 12px 16px; margin: 0 0 16px;
  box-shadow: 0 1px 3px rgba(0,0,0,.08); }
section.panel h2 { font-size: 16px; margin: 0 0 2px; }
section.panel .note { color: #5b6472; font-size: 12px; margin: 0 0 8px; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
.chart { flex: 1 1 460px; max-width: 720px; }
.chart.wide { max-width: 100%; flex-basis: 100%; }
.chart svg { width: 100%; height: auto; }
table { border-collapse: collapse; font-size: 13px; margin: 6px 0; }
th, td { border-bottom: 1px solid #e3e6ea; padding: 3px 10px; text-align: left;
  vertical-align: top; }
thead th { background: #f0f2f5; }
pre { background: #f6f8fa; padding: 8px; overflow-x: auto; font-size: 12px; }
footer { color: #5b6472; font-size: 12px; padding: 0 24px 24px; }
"""


def write_report(run_dirs: Sequence[Path], output: Path | None = None) -> Path:
    """Render the runs' page into `output` (default: RUN_DIR/report.html for one run,
    ./report.html for several); returns where it was written."""
    runs = [load_run(Path(d)) for d in run_dirs]
    if output is None:
        output = runs[0].root / "report.html" if len(runs) == 1 else Path("report.html")
    atomic_write_bytes(output, render(runs).encode("utf-8"))
    return output


def render(runs: list[RunData]) -> str:
    built = [panel for build in PANELS if (panel := build(runs)) is not None]
    title = "shoal report: " + ", ".join(r.name for r in runs)
    heads = "".join(
        f'<span class="run">{html.escape(r.name)} — {html.escape(r.strategy)}, '
        f"{html.escape(r.status)}</span>"
        for r in runs
    )
    body = "".join(_section(p) for p in built)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    sources = ", ".join(html.escape(str(r.root)) for r in runs)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{html.escape(title)}</h1>{heads}</header><main>{body}</main>"
        f"<footer>written {stamp} from {sources}; re-run shoal report to refresh</footer>"
        "</body></html>\n"
    )


def _section(panel: Panel) -> str:
    body = panel.body
    if '<div class="chart' in body and not body.startswith("<h3>"):
        body = f'<div class="charts">{body}</div>'
    note = f'<p class="note">{html.escape(panel.note)}</p>' if panel.note else ""
    return (
        f'<section class="panel" id="{panel.key}" data-panel="{panel.key}">'
        f"<h2>{html.escape(panel.title)}</h2>{note}{body}</section>"
    )
