"""The namespace cluster itself: hosts reach each other by name, shaping holds, nothing is left."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from tests.cluster.netns import Cluster, _namespaces

RECEIVE = """
import socket, sys, time
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1); print(s.getsockname()[1], flush=True)
c, _ = s.accept(); n = 0; t = None
while True:
    d = c.recv(1 << 20)
    if not d: break
    t = t or time.monotonic(); n += len(d)
print(n * 8 / (time.monotonic() - t) / 1e6, socket.gethostname(), flush=True)
"""
SEND = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); c.sendall(b"x" * (3 << 20)); c.close()
"""


def _mbit(cluster: Cluster, receiver: int, sender: int) -> tuple[float, str]:
    """Mbit/s of a 3 MB TCP transfer from host `sender` to host `receiver` (by host name)."""
    host = cluster.hosts[receiver]
    listening = subprocess.Popen(
        cluster.command(host, [sys.executable, "-c", RECEIVE, host.address]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert listening.stdout is not None
        port = listening.stdout.readline().strip()
        sent = cluster.run(cluster.hosts[sender], [sys.executable, "-c", SEND, host.name, port])
        assert sent.returncode == 0, sent.stderr
        rate, name = listening.communicate(timeout=60)[0].split()
        return float(rate), name
    finally:
        listening.kill()
        listening.wait()


def test_hosts_talk_by_name_over_a_shaped_link_and_leave_nothing(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(3)
    names = [h.namespace for h in cluster.hosts] + [cluster.switch]
    assert set(names) <= set(_namespaces())
    shaping = cluster.shape(40)
    assert "40mbit" in shaping
    rate, receiver_name = _mbit(cluster, 0, 2)
    assert receiver_name == cluster.hosts[0].name  # every host has its own host name
    assert 25 < rate < 44, f"{rate:.1f} Mbit/s over a link shaped to 40 ({shaping})"
    hostname = cluster.run(cluster.hosts[1], ["hostname"]).stdout.strip()
    assert hostname == cluster.hosts[1].name
    cluster.close()
    assert not set(names) & set(_namespaces())
