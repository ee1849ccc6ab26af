"""`shoal plugins`: what is registered, kind by kind, with where each comes from."""

from __future__ import annotations

from shoal.plugins.kinds import KINDS
from shoal.plugins.registry import PluginError


def plugin_lines() -> list[str]:
    """One block per kind: `  name  doc  [origin]`; a broken plugin shows its error instead."""
    lines: list[str] = []
    for registry in KINDS:
        kind = registry.kind
        lines.append(
            f"{kind.noun} plugins (entry-point group {kind.group}, config field `{kind.tag}`):"
        )
        plugins = list(registry.plugins.values())
        width = max(len(p.name) for p in plugins)
        for plugin in plugins:
            try:
                doc = plugin.doc()
            except PluginError as exc:
                doc = f"BROKEN: {exc}"
            lines.append(f"  {plugin.name:<{width}}  {doc}  [{plugin.origin}]")
        lines.append("")
    lines.append(
        'One-off classes need no registration: [strategy] or [task] type = "custom", '
        'class = "module:Class", settings in [strategy.config] / [task.config].'
    )
    return lines
