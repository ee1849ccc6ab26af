"""Which ranks share a machine: learnt once when the job starts, used wherever placement matters.

Placement by host is what makes a multi-host job fast (hierarchical aggregation
keeps most traffic inside a host, co-located parameter servers spread over the
hosts) and what makes a host failure nameable ("host node3 lost: ranks 6, 7").
Launchers do not say it reliably (torchrun's LOCAL_WORLD_SIZE is per host but
ranks need not be consecutive per host; Slurm's tasks per node can differ), so
every rank reports its host name and the address its peers reach it at, and the
ranks that report the same pair share a host. Hosts are numbered in the order
of their lowest rank; ranks of a host are listed in increasing order.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class Hosts:
    """The job's machines: `names[h]` and `addresses[h]` of host h, `host_of[r]` of rank r."""

    names: tuple[str, ...]
    addresses: tuple[str, ...]
    host_of: tuple[int, ...]

    @classmethod
    def single(cls, world_size: int, address: str = "127.0.0.1") -> Hosts:
        """Every rank on this machine (shoal's own launcher, the in-process run)."""
        return cls((socket.gethostname(),), (address,), (0,) * world_size)

    @classmethod
    def from_ranks(cls, entries: list[tuple[str, str]]) -> Hosts:
        """From each rank's (host name, address), in rank order."""
        keys: dict[tuple[str, str], int] = {}
        host_of = tuple(keys.setdefault(entry, len(keys)) for entry in entries)
        return cls(tuple(n for n, _ in keys), tuple(a for _, a in keys), host_of)

    @classmethod
    def consecutive(cls, world_size: int, per_host: int) -> Hosts:
        """Hosts of `per_host` consecutive ranks (the last may have fewer): for tests and tools."""
        count = -(-world_size // per_host)
        return cls(
            tuple(f"host{h}" for h in range(count)),
            tuple(f"host{h}" for h in range(count)),
            tuple(rank // per_host for rank in range(world_size)),
        )

    @property
    def count(self) -> int:
        return len(self.names)

    @property
    def world_size(self) -> int:
        return len(self.host_of)

    def ranks(self, host: int) -> list[int]:
        return [rank for rank, h in enumerate(self.host_of) if h == host]

    @property
    def groups(self) -> list[list[int]]:
        """The ranks of every host, hosts in order."""
        return [self.ranks(host) for host in range(self.count)]

    def label(self, host: int) -> str:
        """`name (address)`, or the name alone where the address says nothing more."""
        name, address = self.names[host], self.addresses[host]
        return name if address in ("127.0.0.1", "::1", name) else f"{name} ({address})"

    def describe(self) -> str:
        """One line for the log: every host and its ranks."""
        return "; ".join(
            f"{self.label(h)}: ranks {', '.join(map(str, self.ranks(h)))}"
            for h in range(self.count)
        )
