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
    return max(int(peak if sys.platform == "darwin" else peak * 1024), _forgotten_peak[0])


#: the highest peak a `PeakGrowth` reset (bytes), so the process's peak still counts it
_forgotten_peak = [0]


def _status_kib(field: str) -> int | None:
    """A `/proc/self/status` line's value in KiB (None off Linux)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class PeakGrowth:
    """How far a stretch of code raised this process's resident set above where it began.

    Linux resets the peak (`VmHWM`) to the current resident set on writing 5 to
    `/proc/self/clear_refs`, so the growth is the peak over the stretch alone, not an
    earlier one (loading the data). `bytes` stays None where that is not possible. The
    peak it resets is kept for `peak_memory_bytes`, the process's peak as reported."""

    def __init__(self) -> None:
        self.bytes: int | None = None
        self._start: int | None = None

    def __enter__(self) -> PeakGrowth:
        before = _status_kib("VmHWM")
        if before is not None:
            _forgotten_peak[0] = max(_forgotten_peak[0], before * 1024)
        try:
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")
        except OSError:
            return self
        self._start = _status_kib("VmRSS")
        return self

    def __exit__(self, *exc: object) -> None:
        peak = _status_kib("VmHWM")
        if self._start is not None and peak is not None:
            self.bytes = max(0, peak - self._start) * 1024
