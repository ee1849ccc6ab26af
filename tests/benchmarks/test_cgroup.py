"""benchmarks/_cgroup.py: a job in a memory cgroup is counted there, held to its limit, and
leaves nothing behind (neither the group nor a process of its own)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _cgroup import joiner, memory_cgroup, unavailable, usage

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
MIB = 1 << 20


def take(mib: int) -> list[str]:
    """A Python process that writes `mib` MiB (every page touched) and exits."""
    return [sys.executable, "-c", f"b = bytearray({mib} << 20); b[::4096] = b'1' * len(b[::4096])"]


def test_a_process_in_the_group_is_counted_and_the_group_goes() -> None:
    with memory_cgroup("test", 512 * MIB) as group:
        done = subprocess.run(take(64), preexec_fn=joiner(group), timeout=60)
        used = usage(group)
    assert done.returncode == 0
    assert used.peak_bytes >= 64 * MIB
    assert used.oom_kills in (0, None)
    assert not group.exists()


def test_a_process_over_the_limit_is_killed_by_the_kernel() -> None:
    with memory_cgroup("test", 64 * MIB) as group:
        done = subprocess.run(take(256), preexec_fn=joiner(group), timeout=60)
        used = usage(group)
    assert done.returncode == -9  # SIGKILL
    assert used.failcnt > 0
    assert used.oom_kills is None or used.oom_kills >= 1


def test_a_process_left_in_the_group_is_killed_on_the_way_out() -> None:
    with memory_cgroup("test", None) as group:
        left = subprocess.Popen(["sleep", "60"], preexec_fn=joiner(group))
    assert left.wait(timeout=10) == -9
    assert not group.exists()
