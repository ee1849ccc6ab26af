"""A cluster of "hosts" on this machine: one network namespace per host, a bridge between them.

Multi-host behaviour (listeners reachable from other hosts, gloo picking the right
interface, ranks grouped by host, a host that disappears) cannot be tested on
127.0.0.1. The kernel can build the network of a small cluster instead:

    host namespace   <prefix>-h<i>   eth0 = 10.213.0.<i+1>/24, lo
    switch namespace <prefix>-sw     br0, a bridge with one port (p<i>) per host

Each host reaches the others through its veth pair and the bridge; two ranks on
one host talk over that host's own addresses (the kernel routes them through
its loopback, never over the veth), exactly as on a real machine. `shape()`
limits every host's link in both directions (host egress on eth0, switch egress
on the host's port): `tc netem` rate and delay where the kernel has netem, else
`tbf` (rate only; the description says that no delay was added).

Every host has its own host name, as a machine does: commands run in a UTS
namespace of their own whose host name is the host's, and a hosts file
(`/etc/netns/<ns>/hosts`, which `ip netns exec` mounts over /etc/hosts) maps every
host name to its address, so names resolve inside the cluster as torchrun's
rendezvous and a scheduler's node list expect.

Names carry a unique prefix with this process's id (`shoalnet<pid>`); the
cluster tears everything down on close (processes in its namespaces, the
namespaces, the hosts files), also when a test fails, and a new cluster first
removes what a killed earlier run left behind (prefixes whose process is gone).
All traffic stays inside namespaces created here: only the private 10.213.0.0/24
range is used, and no interface exists outside them. Needs root and iproute2.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "shoalnet"
SUBNET = "10.213.0"
NETNS_ETC = Path("/etc/netns")
_OWNED = re.compile(rf"^{PREFIX}(\d+)-")

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
c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); c.sendall(b"x" * (int(sys.argv[3]) << 20)); c.close()
"""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def unavailable() -> str | None:
    """Why namespace clusters cannot be built here (None: they can)."""
    if sys.platform != "linux":
        return "network-namespace cluster needs Linux"
    if os.geteuid() != 0:
        return "network-namespace cluster needs root (ip netns)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "network-namespace cluster needs iproute2 (ip, tc)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    _ip("netns", "del", probe, check=False)
    if made.returncode != 0:
        return f"network-namespace cluster: ip netns add fails here ({made.stderr.strip()})"
    return None


def namespaces() -> list[str]:
    listed = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_namespace(name: str) -> None:
    """Kill the processes inside a namespace of ours, then delete it and its hosts file."""
    pids = _ip("netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _ip("netns", "del", name, check=False)
    shutil.rmtree(NETNS_ETC / name, ignore_errors=True)


def remove_leftovers() -> list[str]:
    """Delete namespaces an earlier, killed run of these tests left behind (owner pid gone)."""
    removed = []
    for name in namespaces():
        owner = _OWNED.match(name)
        if owner and not _alive(int(owner.group(1))):
            _remove_namespace(name)
            removed.append(name)
    if NETNS_ETC.is_dir():
        for folder in NETNS_ETC.iterdir():
            owner = _OWNED.match(folder.name)
            if owner and not _alive(int(owner.group(1))):
                shutil.rmtree(folder, ignore_errors=True)
    return removed


@dataclass(frozen=True)
class Host:
    """One machine of the cluster."""

    index: int
    namespace: str
    name: str  # its host name, resolvable inside the cluster
    address: str
    interface: str = "eth0"


class Cluster:
    """`hosts` namespaces on one bridge; use as a context manager (always torn down)."""

    def __init__(self, hosts: int, tag: str = "c") -> None:
        if not 1 <= hosts <= 200:
            raise ValueError(f"hosts must be in 1..200, got {hosts}")
        self.prefix = f"{PREFIX}{os.getpid()}-{tag}"
        self.switch = f"{self.prefix}-sw"
        self.hosts = [
            Host(i, f"{self.prefix}-h{i}", f"{self.prefix}-h{i}", f"{SUBNET}.{i + 1}")
            for i in range(hosts)
        ]
        self.shaping = "none"
        self._processes: list[subprocess.Popen[bytes]] = []

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> Cluster:
        remove_leftovers()
        self.close()  # a namespace of this very name from an earlier cluster in this process
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{h.address} {h.name}\n" for h in self.hosts
        )
        for host in self.hosts:
            port = f"p{host.index}"
            _ip("netns", "add", host.namespace)
            _ip(
                "link", "add", host.interface, "netns", host.namespace, "type", "veth",
                "peer", "name", port, "netns", self.switch,
            )  # fmt: skip
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.interface)
            _ip("-n", host.namespace, "link", "set", host.interface, "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
            etc = NETNS_ETC / host.namespace
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)

    def close(self) -> None:
        """Stop every process started here, then remove every namespace and hosts file."""
        for process in self._processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        self._processes.clear()
        for name in [h.namespace for h in self.hosts] + [self.switch]:
            _remove_namespace(name)

    # ------------------------------------------------------------ links
    def shape(self, rate_mbit: float, delay_ms: float = 0.0) -> str:
        """Limit every host's link to `rate_mbit` each way (and add `delay_ms` between hosts).

        Returns (and keeps in `shaping`) what was applied: netem where the kernel has
        it, else tbf, which cannot delay (then said so, with the kernel's answer).
        """
        rate = f"{rate_mbit:g}mbit"
        netem_error = ""
        for host in self.hosts:
            for namespace, device in ((host.namespace, host.interface),
                                      (self.switch, f"p{host.index}")):  # fmt: skip
                netem_error = self._shape(namespace, device, rate, delay_ms / 2, netem_error)
        if netem_error:
            self.shaping = f"tbf rate {rate} per link direction"
            if delay_ms:
                self.shaping += f"; NO added delay (no netem in this kernel: {netem_error})"
        else:
            self.shaping = f"netem rate {rate}, delay {delay_ms / 2:g} ms per link direction"
        return self.shaping

    def _shape(self, namespace: str, device: str, rate: str, delay_ms: float, netem: str) -> str:
        tc = ["netns", "exec", namespace, "tc", "qdisc", "replace", "dev", device, "root"]
        if not netem:
            tried = _ip(*tc, "netem", "delay", f"{delay_ms:g}ms", "rate", rate,
                        "limit", "100000", check=False)  # fmt: skip
            if tried.returncode == 0:
                return ""
            netem = tried.stderr.strip() or "netem failed"
        _ip(*tc, "tbf", "rate", rate, "burst", "128kb", "limit", "4mb")
        return netem

    def measure_mbit(self, receiver: int, sender: int, megabytes: int = 3) -> tuple[float, str]:
        """Mbit/s of a TCP transfer from host `sender` to host `receiver` (reached by name),
        and the receiver's host name: proof that names resolve and that the shaping holds."""
        host = self.hosts[receiver]
        listening = subprocess.Popen(
            self.command(host, [sys.executable, "-c", RECEIVE, host.address]),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert listening.stdout is not None
            port = listening.stdout.readline().strip()
            send = [sys.executable, "-c", SEND, host.name, port, str(megabytes)]
            sent = self.run(self.hosts[sender], send)
            if sent.returncode != 0:
                raise RuntimeError(f"sending to {host.name} failed: {sent.stderr.strip()}")
            rate, name = listening.communicate(timeout=120)[0].split()
            return float(rate), name
        finally:
            listening.kill()
            listening.wait()

    def link_down(self, host: Host) -> None:
        """Cut a host off the network (its switch port goes down): its processes keep running."""
        _ip("-n", self.switch, "link", "set", f"p{host.index}", "down")

    def kill_host(self, host: Host) -> list[int]:
        """Kill every process in the host's namespace at once, as if the machine lost power."""
        pids = [int(p) for p in _ip("netns", "pids", host.namespace).stdout.split()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    # ------------------------------------------------------------ processes
    def command(self, host: Host, cmd: list[str]) -> list[str]:
        """`cmd` as run on `host`: in its network namespace, under its own host name."""
        named = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', host.name]
        return ["ip", "netns", "exec", host.namespace, *named, *cmd]

    def popen(
        self,
        host: Host,
        cmd: list[str],
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
        output: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start `cmd` on `host` (in its namespace, own process group); killed on close."""
        out = open(output, "wb") if output else subprocess.DEVNULL  # noqa: SIM115
        try:
            process = subprocess.Popen(
                self.command(host, cmd),
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            if output:
                out.close()  # type: ignore[union-attr]
        self._processes.append(process)
        return process

    def run(
        self, host: Host, cmd: list[str], timeout: float = 60, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run `cmd` on `host` to completion and return its output."""
        return subprocess.run(
            self.command(host, cmd),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )

    def free_port(self, host: Host) -> int:
        """A TCP port free on `host` right now (bound with port 0 there, then released).

        For listeners whose port must be known before they start (torchrun's
        rendezvous endpoint): another process could take it between release and
        reuse, a tiny race inside a namespace that only this cluster uses.
        """
        code = (
            "import socket; s = socket.socket(); "
            f"s.bind(({host.address!r}, 0)); print(s.getsockname()[1])"
        )
        done = self.run(host, [sys.executable, "-c", code])
        if done.returncode != 0:
            raise RuntimeError(f"no free port on {host.name}: {done.stderr.strip()}")
        return int(done.stdout)

    def wait_all(self, processes: list[subprocess.Popen[bytes]], timeout: float) -> list[int]:
        """Wait for processes to exit; any still running after `timeout` is killed (code -9)."""
        deadline = time.monotonic() + timeout
        for process in processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        return [p.returncode for p in processes]
