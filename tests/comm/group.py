"""Run a function in N fresh processes joined by a gloo group, as the aggregator tests need.

Rendezvous is a FileStore in the test's temporary folder (no port at all); gloo
listens on loopback on ports the OS picks. Every process must exit 0, or the
test fails with the failing rank's traceback.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shoal.launch.process_group import loopback_interface
from shoal.launch.start import forkserver_context

TIMEOUT_S = 60.0
#: a rank still running after this long prints every thread's stack to its stderr (shown by
#: pytest when the test fails): a rare hang then says where each rank was waiting
STACKS_AFTER_S = 25.0


def run_in_group(world_size: int, fn: Callable[..., None], tmp_path: Path, *args: Any) -> list[int]:
    """Call `fn(rank, world_size, *args)` in `world_size` processes of one gloo group.

    `fn` asserts inside its process (a failed assertion there fails the spawn here);
    returns the ranks whose `fn` returned, so a test can also assert that every rank
    ran to the end.
    """
    store = tmp_path / f"store-{world_size}-{fn.__name__}"
    forkserver_context()  # shoal preloaded: a process starts in milliseconds, not seconds
    mp.start_processes(
        _entry,
        args=(world_size, fn, str(store), args),
        nprocs=world_size,
        join=True,
        start_method="forkserver",
    )
    return sorted(int(p.suffix[1:]) for p in tmp_path.glob(f"{store.name}.done.*"))


def _entry(
    rank: int, world_size: int, fn: Callable[..., None], store_path: str, args: tuple[Any, ...]
) -> None:
    loopback = loopback_interface()
    if loopback:
        os.environ["GLOO_SOCKET_IFNAME"] = loopback
    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(STACKS_AFTER_S, exit=False)
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(
        "gloo",
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=TIMEOUT_S),
    )
    fn(rank, world_size, *args)
    Path(f"{store_path}.done.{rank}").touch()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter finalization while gloo threads may still hold tensors


def fails_naming(action: Callable[[], Any], start: str, within_s: float) -> str:
    """Run `action`, which must raise PeerTimeout within `within_s` seconds with a message that
    starts with `start` and carries no backend source location; returns the message."""
    from shoal.comm.links import PeerTimeout

    started = time.monotonic()
    try:
        action()
    except PeerTimeout as exc:
        message = str(exc)
    else:
        raise AssertionError(f"no PeerTimeout; expected {start!r}")
    assert time.monotonic() - started < within_s, message
    assert message.startswith(start) and ".cc:" not in message, message
    return message
