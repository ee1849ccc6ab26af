"""Joining a multi-host job: only processes that know the job's secret are admitted.

Every process here is a thread with its own client of one real TCP store on
127.0.0.1 (port chosen by the OS), as the processes of a job would be.
"""

from __future__ import annotations

import datetime
import threading
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from shoal.config.sections import RunConfig
from shoal.errors import ShoalError
from shoal.launch.admission import Admission, Claim, Doorkeeper, job_signer, join
from shoal.runtime.auth import SECRET_ENV, Signer

SECRET = "a" * 32
SCOPE = "shoal/join/test"


@pytest.fixture
def store() -> Any:
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield master
    del master


def client(master: dist.TCPStore) -> dist.TCPStore:
    return dist.TCPStore(
        "127.0.0.1",
        master.port,
        is_master=False,
        timeout=datetime.timedelta(seconds=10),
        wait_for_workers=False,
    )


def join_in_thread(
    master: dist.TCPStore, rank: int, secret: str | None, out: dict[str, Any], key: str,
    world_size: int = 3, timeout_s: float = 10.0,
) -> threading.Thread:  # fmt: skip
    def go() -> None:
        signer = Signer(secret) if secret else None
        claim = Claim(rank, f"host{rank}", f"10.213.0.{rank + 1}")
        try:
            out[key] = join(client(master), SCOPE, signer, claim, world_size, timeout_s, "h0:1")
        except ShoalError as exc:
            out[key] = exc

    thread = threading.Thread(target=go)
    thread.start()
    return thread


def test_the_job_admits_its_ranks_and_refuses_and_names_a_stray(store: Any) -> None:
    out: dict[str, Any] = {}
    threads = [join_in_thread(store, 0, SECRET, out, "rank0")]
    # the stray claims rank 2 before the genuine rank 2, with a wrong secret, then one without
    threads.append(join_in_thread(store, 2, "b" * 32, out, "stray"))
    threads[-1].join(timeout=15)
    threads.append(join_in_thread(store, 2, None, out, "stray without"))
    threads[-1].join(timeout=15)
    threads += [join_in_thread(store, r, SECRET, out, f"rank{r}") for r in (1, 2)]
    for thread in threads:
        thread.join(timeout=15)
    admissions = [out[f"rank{r}"] for r in range(3)]
    assert all(isinstance(a, tuple) and isinstance(a[0], Admission) for a in admissions), out
    prefixes = {a[0].prefix for a in admissions}
    assert len(prefixes) == 1 and SECRET not in prefixes.pop()
    doors = admissions[0][1]
    assert isinstance(doors, Doorkeeper) and doors.admitted == {0, 1, 2}
    assert (
        doors.refusals
        == [
            "refused a process that asked to join as rank 2 from host host2 (10.213.0.3): it does "
            "not prove it knows the job's secret",
        ]
        * 2
    )
    for key in ("stray", "stray without"):
        assert str(out[key]) == (
            "the job at h0:1 refused this process as rank 2: it does not prove it knows the "
            f"job's secret; export the job's {SECRET_ENV} (or set run.secret_file) alike on "
            "every host"
        )


def test_claims_after_the_start_and_twice_the_same_rank_are_refused(store: Any) -> None:
    out: dict[str, Any] = {}
    threads = [join_in_thread(store, r, SECRET, out, f"rank{r}", world_size=2) for r in (0, 1)]
    for thread in threads:
        thread.join(timeout=15)
    doors = out["rank0"][1]
    late = join_in_thread(store, 1, SECRET, out, "late", world_size=2)
    for _ in range(100):  # rank 0's watch thread answers like this while the job runs
        doors.answer(store)
        if "late" in out:
            break
        late.join(timeout=0.05)
    late.join(timeout=15)
    assert "the job has started with all 2 ranks" in str(out["late"])
    assert doors.refusals[-1].endswith("the job has started with all 2 ranks")


def test_a_missing_rank_is_named_after_the_start_timeout(store: Any) -> None:
    out: dict[str, Any] = {}
    join_in_thread(store, 0, SECRET, out, "rank0", world_size=3, timeout_s=0.5).join(timeout=15)
    assert str(out["rank0"]).startswith("ranks 1, 2 did not join within 0.5 s")


def test_without_a_secret_every_well_formed_claim_is_admitted(store: Any) -> None:
    out: dict[str, Any] = {}
    threads = [join_in_thread(store, r, None, out, f"rank{r}", world_size=2) for r in (0, 1)]
    for thread in threads:
        thread.join(timeout=15)
    assert out["rank0"][0].prefix == out["rank1"][0].prefix
    assert out["rank0"][0].derived_signer("heartbeats") is None


def test_the_secret_comes_from_the_environment_or_a_file(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    from_file = job_signer(RunConfig(secret_file=str(path)), {})
    assert from_file is not None and from_file.check(Signer(SECRET).mac("x"), "x")
    from_env = job_signer(RunConfig(secret_file=str(path)), {SECRET_ENV: "c" * 20})
    assert from_env is not None and from_env.check(Signer("c" * 20).mac("x"), "x")
    assert job_signer(RunConfig(), {}) is None
    with pytest.raises(ShoalError, match=r"^run.secret_file: cannot read .*missing on this host"):
        job_signer(RunConfig(secret_file=str(tmp_path / "missing")), {})
    with pytest.raises(ShoalError, match=rf"^{SECRET_ENV}: the job's secret is 5 bytes"):
        job_signer(RunConfig(), {SECRET_ENV: "short"})
