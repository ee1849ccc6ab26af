"""What the federated strategy hands to torch.distributed, recorded for inspection.

Every tensor of the federated strategy crosses through its CommGroup
(`comm/links.py`: counted collectives with a deadline that names the group), which
counts the bytes this worker sends and receives (the "bytes up and down" of each
round). With `strategy.audit_wire = true` this recorder is the group's audit hook:
it keeps a copy of every payload, so that what left a worker can be inspected after
the run: the tests read these files to show that no training sample ever crossed
the wire. Only tensors cross; byte strings (public keys) travel as uint8 tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


class WireAudit:
    """The audit hook of a CommGroup: every tensor sent or received, with its label."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def __call__(self, what: str, direction: str, tensor: torch.Tensor) -> None:
        self.records.append(
            {"what": what, "direction": direction, "tensor": tensor.detach().cpu().clone()}
        )

    def save(self, path: Path) -> None:
        """Write the recorded payloads (tensors and their labels only: loadable weights_only)."""
        torch.save(self.records, path)
