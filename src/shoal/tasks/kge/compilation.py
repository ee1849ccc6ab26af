"""Static-shape torch.compile of the KGE task's kernels, within a budget of shapes.

Two places compile kernels of their own: RotatE's distances (rotate_distance.py) and the
negative-sampling step's scoring (compiled_scoring.py). Both compile for static shapes
(with dynamic ones Inductor's loops ran 20x slower here), each shape a compilation of
seconds, so only the first `max_shapes` shapes a process sees are compiled and any other
runs by the caller's own path: a run resumed from a checkpoint then takes the same kernel
for each shape as the run it continues. `SHOAL_KGE_COMPILE=0` turns every such kernel off
(the test suite does, but in the tests of the kernels); a failure to compile (no C++
compiler) turns one set off for the process, with one warning.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)

#: SHOAL_KGE_COMPILE=0: no KGE kernel is compiled in this process
ENABLED = os.environ.get("SHOAL_KGE_COMPILE", "1") != "0"


class CompiledKernels:
    """Functions compiled on first use for static shapes, within a budget of shapes.

    `enabled` is False after SHOAL_KGE_COMPILE=0 or a failure; `shapes` holds the keys
    admitted so far (a caller's choice of what specialises a compilation)."""

    def __init__(self, name: str, fallback: str, max_shapes: int = 8) -> None:
        self.name, self.fallback = name, fallback  # for the warning: who, and what runs then
        self.enabled = ENABLED
        self.max_shapes = max_shapes
        self.shapes: set[Any] = set()
        self._compiled: dict[Callable[..., Any], Callable[..., Any]] = {}

    def admit(self, key: Any) -> bool:
        """Whether shape `key` runs compiled (it counts against the budget if new)."""
        if not self.enabled:
            return False
        if key not in self.shapes:
            if len(self.shapes) >= self.max_shapes:
                return False
            self.shapes.add(key)
        return True

    def run(self, function: Callable[..., Any], *args: Any) -> Any | None:
        """`function(*args)` compiled; None (and no compiled kernel from now on) where it
        cannot be compiled."""
        compiled = self._compiled.get(function)
        if compiled is None:
            compiled = self._compiled[function] = torch.compile(function, dynamic=False)
        try:
            return compiled(*args)
        except Exception as exc:  # a missing or failing C++ compiler surfaces as many types
            self.enabled = False
            log.warning("%s: torch.compile unavailable (%s); %s", self.name, exc, self.fallback)
            return None
