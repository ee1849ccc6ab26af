"""shoal: one training job, every way to distribute it.

The names below are imported on first use (PEP 562), so `shoal --help` and
`import shoal.config` do not import torch and every strategy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["ShoalConfig", "ShoalError", "__version__", "load_config", "train"]

if TYPE_CHECKING:
    from shoal.api import train
    from shoal.config import ShoalConfig, load_config
    from shoal.errors import ShoalError

_LAZY = {
    "train": "shoal.api",
    "ShoalConfig": "shoal.config",
    "load_config": "shoal.config",
    "ShoalError": "shoal.errors",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'shoal' has no attribute {name!r}")
