"""Plugins: the registries of strategies, tasks, aggregation methods, compressors... by name.

`registry.py` is the one mechanism (built-ins, entry points, dotted paths, and the
errors when one is broken); `kinds.py` lists the families and shoal's own members.
"""
