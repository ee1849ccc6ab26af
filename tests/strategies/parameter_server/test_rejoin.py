"""A server restarted alone (rejoin.py): what a worker waits for, and what it keeps to send again.

The restart itself, in processes under the launcher: tests/recovery/test_parameter_server.py.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time

import pytest
import torch
import torch.distributed as dist

from shoal.comm.links import CommGroup, PeerTimeout
from shoal.errors import JobFailed
from shoal.shape.hosts import Hosts
from shoal.strategies.parameter_server.rejoin import Announcement, PushLog, Rejoin, announce
from shoal.strategies.parameter_server.transport import RemoteLink
from shoal.strategies.parameter_server.wire import Header, Op


def _store() -> dist.TCPStore:
    return dist.TCPStore(
        "127.0.0.1", 0, 1, is_master=True, timeout=datetime.timedelta(seconds=5),
        wait_for_workers=False,
    )  # fmt: skip


def test_a_server_that_does_not_come_back_is_named_within_the_wait() -> None:
    store = _store()
    rejoin = Rejoin(store, 0, Hosts.single(4), 0.5, 5.0, logging.getLogger("test"))
    announce(store, 1, Announcement(generation=2, clock=6))  # an earlier restart's word
    started = time.monotonic()
    with pytest.raises(PeerTimeout) as caught:
        rejoin.wait_for(1, 3, 2, RuntimeError("Connection closed by peer\nmore"))
    assert time.monotonic() - started < 2.0
    assert str(caught.value) == (
        "server 1 (rank 3) failed (Connection closed by peer) and did not come back within "
        "0.5 s (faults.start_timeout_s); rank 0 waited for it"
    )


def test_a_newer_announcement_is_taken_with_its_clock() -> None:
    store = _store()
    rejoin = Rejoin(store, 0, Hosts.single(4), 5.0, 5.0, logging.getLogger("test"))
    announce(store, 1, Announcement(generation=3, clock=6))
    assert rejoin.announced(1, 3) is None  # not newer than what the link has
    assert rejoin.wait_for(1, 3, 2, RuntimeError("gone")) == Announcement(3, 6)
    group = rejoin.pairs(1, 3)
    assert group.pairs is not None and group.pairs.prefix == "shoal/ps/pairs/1/3"


def _push(clock: int, more: int = 0) -> tuple[Header, torch.Tensor, torch.Tensor]:
    header = Header(Op.PUSH, 0, clock, 1, 0, more=more)
    return header, torch.tensor([clock]), torch.full((2,), float(clock))


def test_the_push_log_keeps_back_to_the_previous_saved_state() -> None:
    log = PushLog()
    for clock in range(6):
        log.add(*_push(clock, more=1))  # a push in two chunks: both are kept
        log.add(*_push(clock))
    log.saved(2)
    assert [p.header.clock for p in log.since(0, 1, 0)] == [c for c in range(6) for _ in "ab"]
    log.saved(4)  # a state of clock 4 was written: the one of clock 2 may still be needed
    assert log.start == 2
    replay = log.since(3, 1, 0)
    assert [(p.header.clock, p.header.more) for p in replay] == [
        (3, 1), (3, 0), (4, 1), (4, 0), (5, 1), (5, 0)
    ]  # fmt: skip
    assert torch.equal(replay[0].values, torch.full((2,), 3.0))
    with pytest.raises(JobFailed, match="server 1 came back at clock 1, but worker 0 kept its "
                       "pushes only from clock 2 on"):  # fmt: skip
        log.since(1, 1, 0)


class _Unsignalled:
    """A send gloo neither completes nor fails until its deadline (a server that died in the
    instant it was posted; see RemoteLink._wait_unless_reconnected)."""

    def __init__(self) -> None:
        self.released = threading.Event()

    def wait(self, timeout_s: float | None = None) -> None:
        if not self.released.wait(timeout_s):
            raise PeerTimeout("Application timeout caused pair closure")


def _link(wait_s: float) -> RemoteLink:
    rejoin = Rejoin(_store(), 0, Hosts.single(4), wait_s, 5.0, logging.getLogger("test"))
    return RemoteLink(1, 3, CommGroup(0, 4, Hosts.single(4), 5.0), rejoin)


def test_a_flush_stuck_on_a_dead_servers_send_goes_on_once_the_watcher_reconnected() -> None:
    link = _link(wait_s=5.0)
    stuck = _Unsignalled()
    link._sends = [stuck]  # type: ignore[list-item]
    reconnected = threading.Timer(0.3, lambda: setattr(link, "generation", 1))  # the watcher
    reconnected.start()
    started = time.monotonic()
    link.flush(timeout_s=60.0)
    assert 0.25 < time.monotonic() - started < 3.0  # not the send's own minute
    stuck.released.set()


def test_a_flush_whose_send_failed_still_waits_for_the_server_and_names_it() -> None:
    link = _link(wait_s=0.3)
    failed = _Unsignalled()
    link._sends = [failed]  # type: ignore[list-item]
    with pytest.raises(PeerTimeout, match=r"server 1 \(rank 3\) failed .* did not come back"):
        link.flush(timeout_s=0.2)
