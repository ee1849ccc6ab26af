"""Who may join a job that torchrun or Slurm started: only processes that know the job's secret.

The job's store (torchrun's, or the one rank 0 of a Slurm step hosts) accepts
any client that reaches its port, and torch's process-group rendezvous trusts
every key in it: a stray process could take a rank's place. So, before the
process group forms:

1. rank 0 writes a fresh nonce under `shoal/join/<attempt>/nonce`, with a MAC
   under the job's secret (runtime/auth.py) and whether the job has a secret;
2. every other process takes a slot (an `add` on a counter: no two share one)
   and writes its claim there: rank, host name, address, and
   `mac("join", nonce, rank, host, address)`;
3. rank 0 checks the claims in slot order: a valid claim for a rank not yet
   admitted is answered `admitted`, with a MAC of its own (a stray cannot admit
   anybody); anything else is refused, named in rank 0's log and answered with
   the reason, and the refused process ends with that line (exit 2);
4. the process group then meets under a key prefix derived from the secret and
   the nonce, its rendezvous values sealed (`runtime/sealed_store.py`): a process
   without the secret can list those keys (any store client can) and overwrite
   them, which ends the job in one line, but cannot feed the backend a value.

Rank 0 keeps answering claims while the job runs (launch/hostwatch.py), so a
late stray is refused and named too. Without a secret (neither SHOAL_JOB_SECRET
nor `[run] secret_file`) every well-formed claim is admitted: the job is as open
as torch's own store. The secret proves membership; it encrypts nothing: the
store's values and gloo's tensors cross the network in clear (put the hosts on a
private network or a VPN: docs/operations/several-machines.md).

A claim names its host and address as the claimant says them: rank 0 cannot
check them, so a refusal names the process as it presented itself.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist

from shoal.config.sections import RunConfig
from shoal.errors import ShoalError
from shoal.runtime.auth import SECRET_ENV, Signer

#: the largest claim or verdict read from the store (a claim is ~200 bytes)
MAX_RECORD_BYTES = 4096
MIN_SECRET_BYTES = 16
_POLL_S = 0.05


def job_signer(run: RunConfig, env: Mapping[str, str] | None = None) -> Signer | None:
    """The job's secret from SHOAL_JOB_SECRET (first) or `run.secret_file`; None: no secret."""
    env = os.environ if env is None else env
    where = SECRET_ENV
    secret = env.get(SECRET_ENV, "").strip()
    if not secret and run.secret_file:
        where = f"run.secret_file ({run.secret_file})"
        try:
            secret = Path(run.secret_file).expanduser().read_text(errors="strict").strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ShoalError(
                f"run.secret_file: cannot read {run.secret_file} on this host ({why}); every "
                f"host needs the file, or export {SECRET_ENV} instead"
            ) from None
    if not secret:
        return None
    if len(secret.encode()) < MIN_SECRET_BYTES:
        raise ShoalError(
            f"{where}: the job's secret is {len(secret.encode())} bytes, fewer than "
            f"{MIN_SECRET_BYTES}; use a long random one (python -c 'import secrets; "
            "print(secrets.token_hex(32))')"
        )
    return Signer(secret)


@dataclass(frozen=True)
class Claim:
    """What a process says about itself when it asks to join."""

    rank: int
    host: str
    address: str

    def describe(self) -> str:
        return f"rank {self.rank} from host {self.host} ({self.address})"


@dataclass(frozen=True)
class Admission:
    """The outcome of joining: the nonce of this attempt and where the process group meets."""

    nonce: str
    signer: Signer | None
    prefix: str

    def derived_signer(self, purpose: str) -> Signer | None:
        """A key of this attempt for `purpose` (e.g. heartbeats); None without a job secret."""
        if self.signer is None:
            return None
        return Signer(self.signer.mac(purpose, self.nonce))


def _parse_record(value: bytes, fields: dict[str, type]) -> dict[str, Any]:
    """A JSON object with exactly the typed `fields` (never unpickled); ValueError otherwise."""
    if len(value) > MAX_RECORD_BYTES:
        raise ValueError(f"{len(value)} bytes, more than {MAX_RECORD_BYTES}")
    record = json.loads(value.decode("utf-8"))
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    for name, kind in fields.items():
        item = record.get(name)
        if not isinstance(item, kind) or (kind is int and isinstance(item, bool)):
            raise ValueError(f"field {name!r} missing or not {kind.__name__}")
    return {name: record[name] for name in fields}


_NONCE_FIELDS = {"nonce": str, "secured": bool, "mac": str}
_CLAIM_FIELDS = {"rank": int, "host": str, "address": str, "mac": str}
_VERDICT_FIELDS = {"admitted": bool, "reason": str, "mac": str}


@dataclass
class Doorkeeper:
    """Rank 0's side: opens the doors (the nonce) and answers every claim, in slot order.

    `refusals` keeps what was refused (one line each) until a logger exists;
    `log` set, each refusal is logged as it happens.
    """

    scope: str
    signer: Signer | None
    world_size: int
    nonce: str = field(default_factory=lambda: secrets.token_hex(16))
    admitted: set[int] = field(default_factory=lambda: {0})
    refusals: list[str] = field(default_factory=list)
    log: logging.Logger | None = None
    _next: int = 1
    _waiting_since: dict[int, float] = field(default_factory=dict)

    def open(self, store: dist.Store) -> None:
        mac = self.signer.mac("nonce", self.scope, self.nonce) if self.signer else ""
        record = {"nonce": self.nonce, "secured": self.signer is not None, "mac": mac}
        store.set(f"{self.scope}/nonce", json.dumps(record))

    def admit_all(self, store: dist.Store, timeout_s: float) -> None:
        """Wait until every rank joined (a one-line error naming the missing ones after
        `timeout_s`), refusing what does not belong."""
        deadline = time.monotonic() + timeout_s
        while len(self.admitted) < self.world_size:
            self.answer(store, started=False)
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.world_size)) - self.admitted)
                refused = f"; refused: {'; '.join(self.refusals)}" if self.refusals else ""
                raise ShoalError(
                    f"ranks {', '.join(map(str, missing))} did not join within {timeout_s:g} s "
                    f"(faults.start_timeout_s){refused}; start every host's launcher with the "
                    f"same secret ({SECRET_ENV} or run.secret_file)"
                )
            time.sleep(_POLL_S)

    def answer(self, store: dist.Store, started: bool = True) -> None:
        """Answer every claim written so far (`started`: the job runs, every claim is refused)."""
        taken = store.add(f"{self.scope}/slots", 0)
        while self._next <= taken:
            slot = self._next
            key = f"{self.scope}/slot/{slot}"
            if not store.check([key]):  # taken, claim not written yet: give it a few seconds
                first = self._waiting_since.setdefault(slot, time.monotonic())
                if time.monotonic() - first < 5.0:
                    return
                self._refuse(store, slot, f"the process in join slot {slot} wrote no claim", "")
            else:
                self._judge(store, slot, store.get(key), started)
            self._next += 1

    def _judge(self, store: dist.Store, slot: int, value: bytes, started: bool) -> None:
        try:
            claim = _parse_record(value, _CLAIM_FIELDS)
        except (ValueError, UnicodeDecodeError) as exc:
            self._refuse(store, slot, f"a process in join slot {slot}: its claim is unreadable "
                         f"({exc})", "its claim is unreadable")  # fmt: skip
            return
        who = Claim(claim["rank"], claim["host"][:200], claim["address"][:100])
        named = f"a process that asked to join as {who.describe()}"
        if self.signer is not None and not self.signer.check(
            claim["mac"], "join", self.nonce, str(who.rank), who.host, who.address
        ):
            why = "it does not prove it knows the job's secret"
            self._refuse(store, slot, f"{named}: {why}", why)
        elif started:
            why = f"the job has started with all {self.world_size} ranks"
            self._refuse(store, slot, f"{named}: {why}", why)
        elif not 0 < who.rank < self.world_size:
            why = f"the job has ranks 0 to {self.world_size - 1}"
            self._refuse(store, slot, f"{named}: {why}", why)
        elif who.rank in self.admitted:
            why = f"rank {who.rank} has joined already"
            self._refuse(store, slot, f"{named}: {why}", why)
        else:
            self.admitted.add(who.rank)
            mac = ""
            if self.signer is not None:
                mac = self.signer.mac("admitted", self.nonce, str(slot), str(who.rank))
            verdict = {"admitted": True, "reason": "", "mac": mac}
            store.set(f"{self.scope}/verdict/{slot}", json.dumps(verdict))

    def _refuse(self, store: dist.Store, slot: int, line: str, why: str) -> None:
        line = f"refused {line}"
        self.refusals.append(line)
        if self.log is not None:
            self.log.warning("%s", line)
        verdict = {"admitted": False, "reason": why, "mac": ""}
        store.set(f"{self.scope}/verdict/{slot}", json.dumps(verdict))


def _wait(store: dist.Store, key: str, timeout_s: float, what: str) -> bytes:
    try:
        store.wait([key], datetime.timedelta(seconds=timeout_s))
        return store.get(key)
    except Exception as exc:  # torch raises DistStoreError / RuntimeError on a timeout
        raise ShoalError(f"{what} ({str(exc).splitlines()[0][:200]})") from None


def join(
    store: dist.Store,
    scope: str,
    signer: Signer | None,
    claim: Claim,
    world_size: int,
    timeout_s: float,
    where: str,
) -> tuple[Admission, Doorkeeper | None]:
    """Join the job as `claim.rank`; rank 0 admits the others. Returns the admission and, on
    rank 0, its doorkeeper (to keep answering late claims). `where`: the store, for messages."""
    if claim.rank == 0:
        doors = Doorkeeper(scope, signer, world_size)
        doors.open(store)
        doors.admit_all(store, timeout_s)
        return Admission(doors.nonce, signer, _prefix(scope, signer, doors.nonce)), doors
    fix = f"export the job's {SECRET_ENV} (or set run.secret_file) alike on every host"
    value = _wait(store, f"{scope}/nonce", timeout_s,
                  f"no join record from rank 0 in the job's store at {where} after "
                  f"{timeout_s:g} s (faults.start_timeout_s): is rank 0 running?")  # fmt: skip
    try:
        record = _parse_record(value, _NONCE_FIELDS)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ShoalError(f"the join record in the job's store at {where} is unreadable "
                         f"({exc}): another process wrote it; {fix}") from None  # fmt: skip
    nonce = record["nonce"][:64]
    if signer is not None and not record["secured"]:
        raise ShoalError(f"this process has a job secret but rank 0 (store at {where}) has "
                         f"none; {fix}")  # fmt: skip
    # a record not sealed with this process's secret: the secrets differ (or a stray wrote
    # it). The claim goes in anyway, so that rank 0 names this process when it refuses it.
    mac = signer.mac("join", nonce, str(claim.rank), claim.host, claim.address) if signer else ""
    slot = store.add(f"{scope}/slots", 1)
    mine = {"rank": claim.rank, "host": claim.host, "address": claim.address, "mac": mac}
    store.set(f"{scope}/slot/{slot}", json.dumps(mine))
    answer = _wait(store, f"{scope}/verdict/{slot}", timeout_s,
                   f"rank 0 did not answer this process's claim to join as rank {claim.rank} "
                   f"within {timeout_s:g} s (store at {where})")  # fmt: skip
    try:
        verdict = _parse_record(answer, _VERDICT_FIELDS)
    except (ValueError, UnicodeDecodeError):
        verdict = {"admitted": False, "reason": "an unreadable answer", "mac": ""}
    genuine = signer is None or signer.check(
        verdict["mac"], "admitted", nonce, str(slot), str(claim.rank)
    )
    if not (verdict["admitted"] and genuine):
        reason = verdict["reason"][:300] or "an answer not sealed with this host's secret"
        hint = fix if "secret" in reason else "check the job's world size and ranks"
        raise ShoalError(f"the job at {where} refused this process as rank {claim.rank}: "
                         f"{reason}; {hint}")  # fmt: skip
    return Admission(nonce, signer, _prefix(scope, signer, nonce)), None


def _prefix(scope: str, signer: Signer | None, nonce: str) -> str:
    """Where the process group meets: unguessable without the secret."""
    tag = signer.mac("process group", nonce)[:32] if signer is not None else nonce
    return f"{scope}/group/{tag}"
