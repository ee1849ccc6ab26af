"""Snapshots that survive the loss of their host: a copy on a rank of the next host (a ring).

Under torchrun or Slurm a job spans machines and no launcher outlives them all.
Each host keeps snapshots in its own memory (`/dev/shm`, a folder named by the run
and the host); rank 0 writes the snapshot there (recovery/snapshots.py says why
rank 0 alone: it gathers the per-rank parts) and sends the folder's files to the
first rank of the next host, which keeps the same folder in its host's memory. The
state of every rank is in that one folder, so one replica on another host is the
ring: whichever single host is lost, a copy of the newest snapshot survives on
another. On one host the ring is the launcher's tmpfs folder (snapshots.py).

The files travel as one uint8 tensor over torch.distributed p2p (send/recv), never
pickled: each file is its name (checked: a plain file name, no path) and its
bytes; the receiver writes them into a hidden temporary folder and renames it, as
a checkpoint is installed, and the sealed meta.json with its checksums is
verified like a checkpoint's when the replica is read.

On restart every rank looks in its own host's folder; the ranks agree on the
newest step any of them holds (newer than the disk checkpoint), the rank holding
it broadcasts it, and one rank per host writes it where that host's ranks read it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import struct
from pathlib import Path

import torch
import torch.distributed as dist

from shoal.checkpoint.integrity import read_meta
from shoal.checkpoint.manager import list_checkpoints
from shoal.errors import ShoalError
from shoal.recovery.snapshots import SHM
from shoal.run import RunPaths
from shoal.runtime.collectives import World, barrier, broadcast_bytes, gather_bytes
from shoal.shape.hosts import Hosts

_NAME = struct.Struct("<H")
_SIZE = struct.Struct("<Q")


def host_snapshot_dir(paths: RunPaths, create: bool = False, host: str | None = None) -> Path:
    """A host's snapshot folder of the run (this host's by default; private, created on
    demand). Named by the host too: hosts that share a file system keep theirs apart."""
    key = f"{paths.root.resolve()}@{host or socket.gethostname()}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    base = SHM if SHM.is_dir() and os.access(SHM, os.W_OK) else Path("/tmp")
    folder = base / f"shoal-{os.getuid()}-{digest}"
    if create:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def replica_peer(hosts: Hosts) -> int | None:
    """The rank that keeps rank 0's snapshots: the first rank of the next host (None: one
    host, where the machine's memory is the only member of the ring)."""
    if hosts.count < 2:
        return None
    return hosts.ranks((hosts.host_of[0] + 1) % hosts.count)[0]


def pack(folder: Path) -> bytes:
    """A snapshot folder's files as bytes: (name length, name, size, data) per file."""
    out = bytearray()
    for path in sorted(folder.iterdir()):
        name, data = path.name.encode(), path.read_bytes()
        out += _NAME.pack(len(name)) + name + _SIZE.pack(len(data)) + data
    return bytes(out)


def unpack_into(payload: bytes, directory: Path, folder_name: str) -> Path:
    """Write a packed folder as `directory/folder_name`, installed atomically; the older
    snapshots there are removed (the newest alone is kept)."""
    files: dict[str, bytes] = {}
    at = 0
    while at < len(payload):
        (length,) = _NAME.unpack_from(payload, at)
        at += _NAME.size
        name = payload[at : at + length].decode()
        at += length
        (size,) = _SIZE.unpack_from(payload, at)
        at += _SIZE.size
        if name in ("", ".", "..") or "/" in name or at + size > len(payload):
            raise ShoalError(f"a snapshot replica holds a bad file entry {name!r}")
        files[name] = payload[at : at + size]
        at += size
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    final = directory / folder_name
    tmp = directory / f".{folder_name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in list_checkpoints(directory):
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def send_replica(rank: int, hosts: Hosts, written: Path | None, paths: RunPaths) -> None:
    """Rank 0 sends the snapshot it just wrote (`written`) to its peer, which keeps it;
    every other rank returns at once. Called by every rank after the snapshot."""
    peer = replica_peer(hosts)
    if peer is None or rank not in (0, peer):
        return
    if rank == 0:
        assert written is not None
        payload = torch.frombuffer(bytearray(pack(written)), dtype=torch.uint8)
        header = torch.tensor([len(payload), int(written.name.split("-")[1])], dtype=torch.int64)
        dist.send(header, dst=peer)
        dist.send(payload, dst=peer)
        return
    header = torch.zeros(2, dtype=torch.int64)
    dist.recv(header, src=0)
    payload = torch.zeros(int(header[0]), dtype=torch.uint8)
    dist.recv(payload, src=0)
    folder = f"step-{int(header[1]):08d}"
    unpack_into(payload.numpy().tobytes(), host_snapshot_dir(paths, create=True), folder)


def _newest_here(directory: Path) -> tuple[int, Path | None]:
    for snapshot in reversed(list_checkpoints(directory) if directory.is_dir() else []):
        try:
            return int(read_meta(snapshot).get("step", -1)), snapshot
        except ShoalError:
            continue  # a damaged one is passed over: the disk checkpoint remains
    return -1, None


def newest_replica(peers: World, hosts: Hosts, paths: RunPaths, floor: int) -> Path | None:
    """Collective, on restart: the newest snapshot any host holds, if newer than step
    `floor` (the disk checkpoint), made present on every host; returns its folder on
    this host (None: resume from the checkpoint)."""
    directory = host_snapshot_dir(paths)
    step, mine = _newest_here(directory)
    steps = [int(b.decode()) for b in gather_bytes(peers, str(step).encode())]
    best = max(steps)
    if best <= floor:
        return None
    source = steps.index(best)
    payload = broadcast_bytes(peers, pack(mine) if peers.rank == source and mine else None, source)
    name = f"step-{best:08d}"
    first_here = hosts.ranks(hosts.host_of[peers.rank])[0] == peers.rank
    if first_here and step != best:
        unpack_into(payload, directory, name)
    barrier(peers)
    return directory / name


def remove_host_snapshots(paths: RunPaths) -> None:
    shutil.rmtree(host_snapshot_dir(paths), ignore_errors=True)
