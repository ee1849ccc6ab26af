"""A bound on what a stray client can park in the launcher's store.

The launcher hosts its job's TCP store in its own process, and the store keeps
whatever any client that reaches its port sets (torch's store takes values of
up to 8 MiB each, and any number of keys). A process outside the job could so
fill the launcher's memory until the machine swaps or the kernel kills someone.
The job itself parks only heartbeats, reports and rendezvous values (kilobytes),
so the launcher watches its own resident memory: grown by more than
`PARKED_LIMIT_BYTES` since the attempt's store started, the job is stopped with
one line that names the store. The bound is that limit plus what a client can
write within one check (`launcher.HEARTBEAT_CHECK_S`).
"""

from __future__ import annotations

import os

#: what the launcher may grow by while its job runs before the store counts as abused
PARKED_LIMIT_BYTES = 512 << 20


def resident_bytes() -> int | None:
    """This process's resident memory (Linux: /proc/self/statm), None where unknown."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class StoreGuard:
    """Created with the attempt's store; `check()` once a heartbeat check."""

    def __init__(self, where: str, limit: int = PARKED_LIMIT_BYTES) -> None:
        self.where, self.limit = where, limit
        self.baseline = resident_bytes()

    def check(self) -> str | None:
        """The one line that stops the job, or None while the launcher's memory is bounded."""
        now = resident_bytes()
        if now is None or self.baseline is None or now - self.baseline <= self.limit:
            return None
        return (
            f"{self.where}: the launcher that hosts it grew by {(now - self.baseline) >> 20} MiB "
            f"while the job keeps kilobytes there: another process that reaches the store is "
            f"parking data in it, so the job was stopped (find it with ss -tnp; the limit is "
            f"{self.limit >> 20} MiB)"
        )
