"""What state.pt holds in place of a sharded model's and optimizer's state.

Shared by the light side of sharded checkpoints (:mod:`shoal.checkpoint.sharded`, imported
by every strategy) and the DCP side (:mod:`shoal.checkpoint.dcp_io`, imported only when a
sharded model is in use), so that neither imports the other for it.
"""

from __future__ import annotations

from typing import Any

#: the folder of a checkpoint that holds the DCP pieces, and the marker state.pt keeps
SHARDED_DIR = "sharded"
MARKER = {"sharded": SHARDED_DIR}


def is_marker(state: Any) -> bool:
    return isinstance(state, dict) and state == MARKER
