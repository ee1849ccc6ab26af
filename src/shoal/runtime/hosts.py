"""Learning which ranks share a machine, once, when the job starts (`shape/hosts.py` holds
the answer: a torch-free value the job's shape is laid out by)."""

from __future__ import annotations

import json
import socket

from shoal.runtime.collectives import Peers, gather_bytes
from shoal.shape.hosts import Hosts


def gather_hosts(peers: Peers, address: str) -> Hosts:
    """Collective: every rank reports its host name and the address its peers reach it at
    (JSON over uint8 tensors); ranks that report the same pair share a host."""
    mine = json.dumps([socket.gethostname(), address]).encode()
    entries = []
    for blob in gather_bytes(peers, mine):
        name, where = json.loads(blob.decode())
        entries.append((str(name), str(where)))
    return Hosts.from_ranks(entries)
