"""A process's peak memory, the one measure every strategy reports per rank."""

from __future__ import annotations

import resource
import sys

import torch


def peak_memory_bytes(device: torch.device) -> int:
    """The allocator's peak on CUDA; the process's peak resident set elsewhere (on Linux
    `ru_maxrss` is in KiB, on macOS in bytes)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
