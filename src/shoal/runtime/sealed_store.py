"""The process groups' rendezvous through a store whose values are sealed with the job's secret.

A TCP store accepts any client that reaches its port, and such a client can list
every key (`TCPStore.list_keys()`): key names derived from the secret hide
nothing. torch's process groups trust whatever they read there: gloo parses a
peer's address from it, and a value overwritten by a stray client in a loop made
both ranks of a job die with `MemoryError: std::bad_alloc` (gloo read a length
from the garbage and allocated it). So every group of a job with a secret meets
through this store: what a rank sets is sealed (`runtime/auth.py`: an HMAC over
the key, a counter and the value), what a rank gets is opened, and a value that
does not open (not sealed, sealed under another key or secret, replayed, larger
than any rendezvous value) is never handed to torch: the rank ends with one line
that names the store and the likely cause. A stray client can still end the job
(it can delete or overwrite keys); it can no longer feed the backend its bytes.

Counters (`add`) cannot be sealed (the store adds to them itself) and pass as
they are: a forged counter makes a rendezvous wait, which its timeout ends.
"""

from __future__ import annotations

import datetime

import torch.distributed as dist

from shoal.errors import EXIT_FAILURE, ShoalError
from shoal.runtime.auth import BadValue, Opener, Signer

#: every SealedStore made in this process, kept alive: torch holds only the C++ half of a
#: store written in Python (the group's, its clones), and one whose Python object was
#: collected answers every call with "Not implemented"; a process makes a few
_ALIVE: list[SealedStore] = []


class StoreTampered(ShoalError):
    """A value of the job's store does not carry the job's MAC: another process wrote it."""

    exit_code = EXIT_FAILURE


class SealedStore(dist.Store):
    """`store` with every value sealed on `set` and opened on `get` (see the module)."""

    def __init__(self, store: dist.Store, signer: Signer, where: str) -> None:
        """`where`: the store as messages name it ("the job's store at 127.0.0.1:41234")."""
        super().__init__()
        self._store, self._signer, self._opener, self._where = store, signer, Opener(signer), where
        _ALIVE.append(self)

    def set(self, key: str, value: bytes | str) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        self._store.set(key, self._signer.seal(key, data))  # type: ignore[arg-type]

    def get(self, key: str) -> bytes:
        return self._open(key, self._store.get(key))

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        """torch's compare-and-set on the opened values: `desired` is set (sealed) if the
        value is `expected` (b"": the key is missing); returns the value then held."""
        expected = expected.encode() if isinstance(expected, str) else bytes(expected)
        desired = desired.encode() if isinstance(desired, str) else bytes(desired)
        held = self._store.get(key) if self._store.check([key]) else None
        current = None if held is None else self._open(key, held)
        if current != expected and not (current is None and expected == b""):
            return expected if current is None else current
        sealed = self._signer.seal(key, desired)
        result = self._store.compare_set(key, held or b"", sealed)  # type: ignore[arg-type]
        return desired if result == sealed else self._open(key, result)

    def _open(self, key: str, raw: bytes) -> bytes:
        try:
            return self._opener.open(key, raw)
        except BadValue as exc:
            raise StoreTampered(
                f"{self._where}: the value under {key!r} is not one this job wrote ({exc}): "
                "another process that reaches the store overwrote a process group's key, so "
                "the job stopped; find it (ss -tnp | grep the store's port)"
            ) from None

    # torch calls the methods below by their C++ names (getNumKeys, deleteKey, clone:
    # the trampoline's pure overloads); the Python names are kept for Python callers
    def add(self, key: str, amount: int) -> int:
        return int(self._store.add(key, amount))

    def check(self, keys: list[str]) -> bool:
        return bool(self._store.check(keys))

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        if timeout is None:
            self._store.wait(keys)
        else:
            self._store.wait(keys, timeout)

    def clone(self) -> SealedStore:
        """A new connection to the same store (gloo opens one per group), sealed alike."""
        return SealedStore(self._store.clone(), self._signer, self._where)  # type: ignore[attr-defined]

    def delete_key(self, key: str) -> bool:
        return bool(self._store.delete_key(key))

    deleteKey = delete_key

    def num_keys(self) -> int:
        return int(self._store.num_keys())

    getNumKeys = num_keys

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._store.set_timeout(timeout)

    @property
    def timeout(self) -> datetime.timedelta:
        return self._store.timeout  # type: ignore[attr-defined]
