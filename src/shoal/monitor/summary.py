"""The table printed when a run ends."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def print_summary(results: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"shoal run {results.get('run_dir', '')}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    for key in ("status", "strategy", "world_size", "epochs", "steps", "samples"):
        if key in results:
            table.add_row(key, _fmt(results[key]))
    table.add_row("wall time", f"{results.get('wall_time_s', 0.0):,.1f} s")
    if "samples_per_s" in results:
        throughput = f"{results['samples_per_s']:,.0f} samples/s"
        tokens = (results.get("data") or {}).get("tokens_per_sample")
        if tokens:  # language models: a sample is a window of tokens
            throughput += f" ({results['samples_per_s'] * tokens:,.0f} tokens/s)"
        table.add_row("throughput", throughput)
    timing = results.get("time_s", {})
    if timing:
        table.add_row(
            "compute / comm",
            f"{timing.get('compute', 0.0):,.1f} s / {timing.get('communication', 0.0):,.1f} s",
        )
    ps = results.get("parameter_server")
    if ps:  # seed 000's describe_server: how often the workers talked to the servers
        table.add_row("parameter server", f"{ps['pulls']:,.0f} pulls, {ps['pushes']:,.0f} pushes")
    counts = results.get("counts")
    if counts:
        table.add_row("checkpoints / failures", f"{counts['checkpoints']} / {counts['failures']}")
    peaks = (results.get("ranks") or {}).get("peak_memory_mb")
    if peaks:
        table.add_row("peak memory", f"{max(peaks):,.0f} MB (largest of {len(peaks)} ranks)")
    for split in ("train", "valid", "test"):
        for name, value in (results.get(split) or {}).items():
            table.add_row(f"{split} {name}", _fmt(value))
    if results.get("checkpoint"):
        table.add_row("last checkpoint", str(results["checkpoint"]))
    console.print(table)
