"""Telling a DTensor apart without importing torch.distributed.tensor.

That import brings DTensor's operator tables, torch.fx and sympy: about 0.7 s for every
launcher and worker that makes it, although only the tensor-parallel, fully sharded and
hybrid strategies ever create a DTensor. No tensor can be a DTensor before the module
defining the class was imported, so looking it up in `sys.modules` answers the question
for every other strategy at no cost.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor


def is_dtensor(value: Any) -> TypeGuard[DTensor]:
    """True when `value` is a torch DTensor (sharded or replicated over a device mesh)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(value, module.DTensor)
