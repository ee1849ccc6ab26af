"""Where a worker of a multi-host job listens: `[run] bind`, and gloo's interface.

gloo listens on one address per process and tells its peers that address, so
it must be one they can reach. Left to itself, gloo uses the address the host
name resolves to, which on many machines is 127.0.1.1 or an address of the
wrong network: the job then hangs until the collective timeout. shoal picks the
address instead, and hands gloo the interface that holds it (GLOO_SOCKET_IFNAME,
the only choice torch's gloo takes):

- `bind` unset: the address this host uses to reach the job's store
  (MASTER_ADDR), as the routing table says; on one host (MASTER_ADDR 127.0.0.1)
  that is 127.0.0.1, so a single-host job stays on loopback. A GLOO_SOCKET_IFNAME
  the user exported is kept.
- `bind = "eth0"`: that interface (the same name on every host, like a
  cluster's fast interconnect `ib0`).
- `bind = "10.1.0.0/16"`: this host's address in that network (one config for
  every host of a cluster with several networks).
- `bind = "10.1.0.7"`: that address (one host's; pass it per host with
  `--set run.bind=...`).

Every host checks its own choice when it joins, and a wrong one is a one-line
error naming the host and what exists there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import ipaddress
import os
import socket
import sys
from dataclasses import dataclass

from shoal.errors import ShoalError

GLOO_IFNAME = "GLOO_SOCKET_IFNAME"


@dataclass(frozen=True)
class Binding:
    """The address this worker's peers reach it at, and the interface holding it."""

    address: str
    interface: str
    reason: str  # how it was chosen, for the log

    def describe(self) -> str:
        return f"{self.address} on {self.interface} ({self.reason})"


# ------------------------------------------------------------------ this host's addresses
class _SockAddr(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("data", ctypes.c_char * 14)]


class _SockAddrBSD(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ubyte), ("family", ctypes.c_ubyte), ("data", ctypes.c_char * 14)]


class _IfAddrs(ctypes.Structure):
    pass


_IfAddrs._fields_ = [
    ("next", ctypes.POINTER(_IfAddrs)),
    ("name", ctypes.c_char_p),
    ("flags", ctypes.c_uint),
    ("addr", ctypes.c_void_p),
    ("netmask", ctypes.c_void_p),
    ("ifu", ctypes.c_void_p),
    ("data", ctypes.c_void_p),
]


def interfaces() -> dict[str, list[str]]:
    """Every interface of this host (network namespace) and its IPv4/IPv6 addresses.

    Read with getifaddrs(3), which lists every address, secondary ones included.
    """
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    head = ctypes.POINTER(_IfAddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        raise OSError(ctypes.get_errno(), "getifaddrs failed")
    bsd = sys.platform == "darwin"
    found: dict[str, list[str]] = {name: [] for _, name in socket.if_nameindex()}
    try:
        entry = head
        while entry:
            item = entry.contents
            name = item.name.decode()
            found.setdefault(name, [])
            if item.addr:
                family = (_SockAddrBSD if bsd else _SockAddr).from_address(item.addr).family
                if family == socket.AF_INET:  # sockaddr_in: family, port, address
                    raw = ctypes.string_at(item.addr, 8)
                    found[name].append(socket.inet_ntop(socket.AF_INET, raw[4:8]))
                elif family == socket.AF_INET6:  # sockaddr_in6: family, port, flow, address
                    raw = ctypes.string_at(item.addr, 24)
                    found[name].append(socket.inet_ntop(socket.AF_INET6, raw[8:24]))
            entry = item.next
    finally:
        libc.freeifaddrs(head)
    return found


def _listing(found: dict[str, list[str]]) -> str:
    return "; ".join(
        f"{name} {', '.join(addrs) or '(no address)'}" for name, addrs in found.items()
    )


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def route_address(host: str) -> str:
    """The local address this host sends from to reach `host` (no packet is sent)."""
    infos = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)
    family, _, _, _, target = infos[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(target)
        return str(probe.getsockname()[0])


def _interface_of(address: str, found: dict[str, list[str]]) -> str | None:
    wanted = ipaddress.ip_address(address)
    for name, addresses in found.items():
        if any(ipaddress.ip_address(a.split("%")[0]) == wanted for a in addresses):
            return name
    return None


def resolve_bind(bind: str | None, master_addr: str) -> Binding:
    """This host's binding for `run.bind` (see the module docstring); ShoalError if impossible."""
    found = interfaces()
    where = f"on host {socket.gethostname()}"
    if bind is None:
        exported = os.environ.get(GLOO_IFNAME, "").split(",")[0]
        if exported:
            if exported not in found:
                raise ShoalError(
                    f"{GLOO_IFNAME}={exported}: no such interface {where}; interfaces: "
                    f"{_listing(found)}; unset it or set run.bind"
                )
            addresses = found[exported] or ["(no address)"]
            return Binding(addresses[0], exported, f"{GLOO_IFNAME} from the environment")
        try:
            address = route_address(master_addr)
        except OSError as exc:
            raise ShoalError(
                f"MASTER_ADDR={master_addr}: not reachable {where} ({exc}); check the address, "
                "or set run.bind to this host's address or interface"
            ) from None
        name = _interface_of(address, found)
        if name is None:  # a route through an address no interface lists: let gloo decide
            return Binding(address, "", f"the route to MASTER_ADDR {master_addr}")
        return Binding(address, name, f"the route to MASTER_ADDR {master_addr}")
    if "/" in bind:
        network = ipaddress.ip_network(bind, strict=False)
        for name, addresses in found.items():
            for address in addresses:
                if ipaddress.ip_address(address.split("%")[0]) in network:
                    return Binding(address, name, f"run.bind = {bind}")
        raise ShoalError(
            f"run.bind: no address in {bind} {where}; its interfaces: {_listing(found)}; "
            "give a network every host has an address in, or an interface name"
        )
    if not _is_address(bind):
        if bind not in found:
            raise ShoalError(
                f"run.bind: no interface {bind!r} {where}; its interfaces: {_listing(found)}"
            )
        if not found[bind]:
            raise ShoalError(f"run.bind: interface {bind!r} has no address {where}")
        return Binding(found[bind][0], bind, f"run.bind = {bind}")
    name = _interface_of(bind, found)
    if name is None:
        raise ShoalError(
            f"run.bind: {bind} is not an address of host {socket.gethostname()} (a config shared "
            f"by every host should name an interface or a network); its interfaces: "
            f"{_listing(found)}"
        )
    return Binding(bind, name, f"run.bind = {bind}")


def use_for_gloo(binding: Binding) -> None:
    """Make every gloo process group of this process listen on the binding's interface."""
    if binding.interface:
        os.environ[GLOO_IFNAME] = binding.interface
