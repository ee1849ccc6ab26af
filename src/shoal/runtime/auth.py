"""Authenticated values between the processes of one job: HMAC-SHA256 with a per-job secret.

The job's TCP store listens on 127.0.0.1, but any local process can connect to
it and read or write any key. So a value whose meaning matters (a heartbeat, a
worker's error report) is sealed: `shoal1 <counter> <mac> <payload>`, where the
MAC covers the store key, the counter and the payload under a secret that the
launcher draws (`secrets`) and hands to its workers in their environment
(`SHOAL_JOB_SECRET`), never through the store. A reader opens a value only if
the MAC matches (so nobody without the secret can forge one, nor move a value
from one key to another) and the counter is newer than the last it accepted on
that key (so a copy of an old valid value, replayed later, is refused). The
counter starts at the writer's clock in nanoseconds, so a restarted writer
still counts upwards. The keys themselves carry a tag derived from the secret
(`Signer.key_name`), which keeps two jobs' keys apart but hides nothing: any
client lists a store's keys (`TCPStore.list_keys()`). What it writes there is
refused, never believed.

The environment of a process can be read by other processes of the same user
(`/proc/<pid>/environ`): the secret keeps out other users' processes and
anything that only reaches the port, not the user's own processes.

The same key and `Signer.mac` serve any later challenge (e.g. a join handshake
for multi-host rendezvous): a verifier sends a fresh nonce, the joiner answers
`mac("join", nonce)`, the verifier checks it with `Signer.check`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time

SECRET_ENV = "SHOAL_JOB_SECRET"
MAGIC = b"shoal1"
#: the largest sealed value a reader accepts (a one-line report fits many times over)
MAX_VALUE_BYTES = 64 * 1024
_MAC_HEX = 64


class BadValue(ValueError):
    """A store value that is malformed, not authentic, or a replay; the text says which."""


def new_secret() -> str:
    """A fresh per-job secret: 256 random bits, hex-encoded."""
    return secrets.token_hex(32)


class Signer:
    """HMAC-SHA256 under one job's secret."""

    def __init__(self, secret: str | bytes) -> None:
        key = secret.encode() if isinstance(secret, str) else secret
        if len(key) < 16:
            raise ValueError("a job secret must be at least 16 bytes")
        self._key = key
        self._counter = time.time_ns()
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls) -> Signer | None:
        """The job's signer, if this process was given a secret (by shoal's launcher)."""
        secret = os.environ.get(SECRET_ENV)
        return cls(secret) if secret else None

    def mac(self, *parts: str | bytes) -> str:
        """The hex MAC of `parts`, each length-prefixed so that no two splits collide."""
        digest = hmac.new(self._key, digestmod=hashlib.sha256)
        for part in parts:
            data = part.encode() if isinstance(part, str) else part
            digest.update(len(data).to_bytes(8, "big"))
            digest.update(data)
        return digest.hexdigest()

    def check(self, mac: str | bytes, *parts: str | bytes) -> bool:
        """True if `mac` is the MAC of `parts` (constant-time comparison)."""
        given = mac.decode("ascii", "replace") if isinstance(mac, bytes) else mac
        return hmac.compare_digest(given, self.mac(*parts))

    def next_counter(self) -> int:
        """A counter that only grows, across threads and (by the clock) across restarts."""
        with self._lock:
            self._counter = max(self._counter + 1, time.time_ns())
            return self._counter

    def key_name(self, name: str) -> str:
        """`name` with a tag derived from the secret: a process without the secret cannot tell
        which store key to overwrite, let alone forge its value."""
        return f"{name}/{self.mac('key name', name)[:16]}"

    def seal(self, key: str, payload: bytes) -> bytes:
        """The value to store under `key`: payload with counter and MAC."""
        counter = self.next_counter()
        mac = self.mac(key, str(counter), payload)
        return b"%s %d %s %s" % (MAGIC, counter, mac.encode(), payload)


class Opener:
    """Checks sealed values read from a store; remembers each key's newest counter."""

    def __init__(self, signer: Signer) -> None:
        self.signer = signer
        self._newest: dict[str, int] = {}

    def open(self, key: str, value: bytes) -> bytes:
        """The payload of `value` read under `key`; raises BadValue if it is not authentic or
        not newer than the last value accepted under that key."""
        counter, payload = self._verify(key, value)
        last = self._newest.get(key)
        if last is not None and counter < last:
            raise BadValue(f"a replayed value (counter {counter}, newest seen {last})")
        self._newest[key] = counter
        return payload

    def _verify(self, key: str, value: bytes) -> tuple[int, bytes]:
        if len(value) > MAX_VALUE_BYTES:
            raise BadValue(f"{len(value)} bytes, more than {MAX_VALUE_BYTES}")
        parts = value.split(b" ", 3)
        if len(parts) != 4 or parts[0] != MAGIC:
            raise BadValue("not a sealed shoal value")
        _, counter_text, mac, payload = parts
        if not counter_text.isdigit() or len(counter_text) > 20 or len(mac) != _MAC_HEX:
            raise BadValue("a malformed header")
        if not self.signer.check(mac, key, counter_text, payload):
            raise BadValue("its MAC does not match (written without the job's secret)")
        return int(counter_text), payload
