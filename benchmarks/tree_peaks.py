"""Peak memory of every process of a command's tree: run as a launcher prefix.

    .venv/bin/python benchmarks/tree_peaks.py OUT.json [--limit-mb N] -- COMMAND [ARGS...]

Starts COMMAND, and every `--every` seconds reads /proc/PID/status of it and of all its
descendants (shoal's launcher, its forkserver, workers, dedicated servers; PBG's parent
and its Hogwild pool): `VmHWM` (the kernel's peak resident set, which only grows, so the
last reading before a process ends is its peak up to the final interval) and `RssAnon`
(resident anonymous memory, the largest reading: heap and tensors, without the
memory-mapped files and shared memory that VmHWM also counts in each process that
touches them). Writes one entry per process to OUT.json and exits with COMMAND's status,
so benchmarks prefix their command with it (kge_vs_pykeen's and kge_vs_pbg's runners
take such a `launcher`).

`--limit-mb N` runs the tree in a fresh cgroup v1 memory controller limited to N MiB
(root only, as kge_out_of_core.py): a contender that does not fit is killed by the
kernel there, not by the machine's OOM killer among other people's jobs. The entry
`{"role": "cgroup", ...}` then gives the limit, the group's peak and its OOM kills.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from _cgroup import Usage, joiner, memory_cgroup, usage

from shoal.launch.processes import descendants, rank_of

EVERY_S = 0.1
MARKERS = {  # command-line words of Python's helper processes
    "forkserver": "forkserver",
    "resource_tracker": "resource tracker",
    "spawn_main": "pool worker",  # PBG's Hogwild processes
}


def _status_kib(pid: int) -> dict[str, int]:
    """The kB fields of /proc/PID/status ({} once it has ended)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            fields[name] = int(value.split()[0])
    return fields


def _role(pid: int, root: int) -> str:
    if pid == root:
        return "launcher"
    rank = rank_of(pid)
    if rank >= 0:
        return f"rank {rank}"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "ended"
    words = [a.decode(errors="replace") for a in argv if a]
    text = " ".join(words)
    for marker, role in MARKERS.items():
        if marker in text:
            return role
    return " ".join(words[-2:])[-60:]


class TreePeaks:
    """Samples the peaks of `root` and its descendants in a thread until `stop()`."""

    def __init__(self, root: int, every_s: float = EVERY_S) -> None:
        self.root = root
        self.every_s = every_s
        self.peaks: dict[int, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        for pid in [self.root, *descendants(self.root)]:
            status = _status_kib(pid)
            if "VmHWM" not in status:
                continue
            entry = self.peaks.setdefault(pid, {"pid": pid, "role": _role(pid, self.root)})
            entry["peak_rss_mib"] = max(entry.get("peak_rss_mib", 0.0), status["VmHWM"] / 1024)
            anon = status.get("RssAnon", 0) / 1024
            entry["peak_anon_mib"] = max(entry.get("peak_anon_mib", 0.0), anon)
            if entry["role"] != "launcher" and not entry["role"].startswith("rank"):
                entry["role"] = _role(pid, self.root)  # a forked worker retitles itself

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join()
        rounded = ("peak_rss_mib", "peak_anon_mib")
        return [
            {**p, **{k: round(p[k], 1) for k in rounded}}
            for p in sorted(self.peaks.values(), key=lambda p: p["pid"])
            if p["role"] != "ended"
        ]


def cgroup_entry(used: Usage, limit_mb: int) -> dict[str, Any]:
    """The entry of the tree's cgroup: its limit, its peak and its OOM kills."""
    return {
        "role": "cgroup",
        "limit_mib": limit_mb,
        "peak_mib": used.peak_bytes / 2**20,
        "oom_kills": used.oom_kills,
    }


def main() -> None:
    args = sys.argv[1:]
    limit_mb = None
    if len(args) > 2 and args[1] == "--limit-mb":
        limit_mb = int(args.pop(2))
        args.pop(1)
    if len(args) < 3 or args[1] != "--":
        sys.exit("usage: tree_peaks.py OUT.json [--limit-mb N] -- COMMAND [ARGS...]")
    out, command = Path(args[0]), args[2:]
    # the group goes on the way out, with anything of the tree left in it
    with memory_cgroup("tree-peaks", limit_mb << 20) if limit_mb else nullcontext() as group:
        child = subprocess.Popen(command, preexec_fn=joiner(group) if group else None)
        peaks = TreePeaks(child.pid)
        code = child.wait()
        entries = peaks.stop()
        if group is not None and limit_mb is not None:
            entries.append(cgroup_entry(usage(group), limit_mb))
    out.write_text(json.dumps(entries, indent=1))
    sys.exit(code)


if __name__ == "__main__":
    main()
