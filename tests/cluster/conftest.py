"""The `cluster` fixture: hosts as network namespaces, skipped with a reason where impossible."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import pytest

from tests.cluster.netns import Cluster, unavailable

_why_not = functools.cache(unavailable)  # probed once, when a cluster test first runs


@pytest.fixture
def make_cluster() -> Iterator[Callable[..., Cluster]]:
    """`make_cluster(hosts)`: a started Cluster, torn down after the test (also on failure)."""
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    made: list[Cluster] = []

    def make(hosts: int, tag: str = "c") -> Cluster:
        cluster = Cluster(hosts, tag=f"{tag}{len(made)}")
        made.append(cluster)
        return cluster.__enter__()

    try:
        yield make
    finally:
        for cluster in made:
            cluster.close()
