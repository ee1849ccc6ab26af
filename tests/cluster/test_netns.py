"""The namespace cluster itself: hosts reach each other by name, shaping holds, nothing is left."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import pytest

from tests.cluster.netns import Cluster, namespaces, unavailable


def test_hosts_talk_by_name_over_a_shaped_link_and_leave_nothing(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(3)
    names = [h.namespace for h in cluster.hosts] + [cluster.switch]
    assert set(names) <= set(namespaces())
    shaping = cluster.shape(40)
    assert "40mbit" in shaping
    rate, receiver_name = cluster.measure_mbit(receiver=0, sender=2)
    assert receiver_name == cluster.hosts[0].name  # every host has its own host name
    assert 25 < rate < 44, f"{rate:.1f} Mbit/s over a link shaped to 40 ({shaping})"
    hostname = cluster.run(cluster.hosts[1], ["hostname"]).stdout.strip()
    assert hostname == cluster.hosts[1].name
    cluster.close()
    assert not set(names) & set(namespaces())


def test_without_root_cluster_tests_skip_with_a_one_line_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CI that is not root still passes `make test`: every cluster test skips with this reason."""
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert unavailable() == "network-namespace cluster needs root (ip netns)"
