"""The job's store is not a way in (issue 18, item 4).

Any local process can connect to the launcher's TCP store and list its keys. Whatever
lands under the keys shoal reads is validated and authenticated before shoal believes
it (the process groups' rendezvous values included, issue 35): garbage is
reported once and ignored, forged or replayed heartbeats cannot hide a hung worker,
and forged reports cannot put words in a worker's mouth. (The tests find the keys with
the secret from a worker's environment, as a process of the same user could.)
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

from shoal.runtime.auth import MAX_VALUE_BYTES, BadValue, Opener, Signer, new_secret
from shoal.runtime.heartbeat import heartbeat_key, parse_beat, parse_report, report_key
from tests.hostile.jobs import (
    finish,
    job_signer,
    no_worker_left,
    slow_data_parallel,
    start,
    store_of,
    wait_for_step,
    workers_of,
    write_job,
)

# ------------------------------------------------------------ the seal itself


def test_a_sealed_value_opens_only_under_its_key_with_its_secret() -> None:
    signer = Signer(new_secret())
    opener = Opener(signer)
    value = signer.seal("shoal/heartbeat/1", b"1700000000.000 7")
    assert opener.open("shoal/heartbeat/1", value) == b"1700000000.000 7"
    assert opener.open("shoal/heartbeat/1", value) == b"1700000000.000 7"  # read again: fine
    with pytest.raises(BadValue, match="MAC does not match"):
        opener.open("shoal/heartbeat/2", value)  # moved to another rank's key
    with pytest.raises(BadValue, match="MAC does not match"):
        opener.open("shoal/heartbeat/1", value.replace(b" 7", b" 9"))  # payload changed
    with pytest.raises(BadValue, match="MAC does not match"):
        Opener(Signer(new_secret())).open("shoal/heartbeat/1", value)  # another job's secret


def test_an_older_value_replayed_is_refused() -> None:
    signer = Signer(new_secret())
    opener = Opener(signer)
    old = signer.seal("k", b"1 1")
    new = signer.seal("k", b"2 2")
    assert opener.open("k", new) == b"2 2"
    with pytest.raises(BadValue, match="replayed"):
        opener.open("k", old)


def test_a_restarted_writer_still_counts_upwards() -> None:
    """The counter starts at the clock, so a new process's values are newer than the old's."""
    secret = new_secret()
    opener = Opener(Signer(secret))
    before = Signer(secret).seal("k", b"a")
    opener.open("k", before)
    assert opener.open("k", Signer(secret).seal("k", b"b")) == b"b"


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"garbage",
        b"1700000000.000 5",  # the unsealed format of old
        b"shoal1 12 nothex payload",
        b"shoal1 -3 " + b"0" * 64 + b" payload",
        b"shoal1 " + b"9" * 30 + b" " + b"0" * 64 + b" x",
        b"shoal1 1 " + b"0" * 64 + b" " + b"x" * MAX_VALUE_BYTES,
        bytes(range(256)),
    ],
    ids=["empty", "garbage", "unsealed", "short-mac", "negative", "huge-counter", "huge", "binary"],
)
def test_malformed_values_are_refused_with_a_reason(value: bytes) -> None:
    with pytest.raises(BadValue):
        Opener(Signer(new_secret())).open("k", value)


@pytest.mark.parametrize(
    "payload",
    [b"", b"x y", b"1 2 3", b"nan 3", b"1.0 -7", b"\xff\xfe", b"1.0 99999999999999999999x"],
)
def test_a_heartbeat_payload_is_validated(payload: bytes) -> None:
    with pytest.raises(BadValue):
        parse_beat(payload)
    assert parse_beat(b"1700000000.5 12") == (1700000000.5, 12)


def test_a_report_payload_is_validated_field_by_field() -> None:
    good = {
        "rank": 1,
        "step": 4,
        "type": "OSError",
        "message": "[Errno 28] No space left on device",
        "lines": [],
        "user_error": False,
        "exit_code": 1,
        "communication_error": False,
    }
    assert parse_report(json.dumps(good).encode()) == good
    for name, bad in [("rank", "1"), ("step", True), ("lines", [3]), ("message", None)]:
        with pytest.raises(BadValue, match=name):
            parse_report(json.dumps({**good, name: bad}).encode())
    for payload in (b"[]", b"{", b"\xff"):
        with pytest.raises(BadValue):
            parse_report(payload)


# ------------------------------------------------------------ a real job, lied to


def test_garbage_in_the_store_is_reported_once_and_ignored(tmp_path: Path) -> None:
    job = write_job(tmp_path, **slow_data_parallel(workers=2, delay_s=0.05, epochs=8))
    run_dir = tmp_path / "runs" / "job"
    launcher = start("train", str(job), cwd=tmp_path, exec_workers=True)
    workers = workers_of(launcher, 2)
    wait_for_step(run_dir, 2)
    store, keys = store_of(workers[0]), job_signer(workers[0])
    for _ in range(15):  # for 1.5 s: the launcher reads every key at least twice meanwhile
        store.set(heartbeat_key(keys, 1), "garbage")
        store.set(heartbeat_key(keys, 0), f"{time.time():.3f} 5")  # the old, unsealed format
        store.set("shoal/heartbeat/1", "garbage")  # the untagged name: nobody reads it
        time.sleep(0.1)
    del store
    code, _, err = finish(launcher, timeout=120)
    assert code == 0, err
    notices = [line for line in err.splitlines() if "ignored a value under" in line]
    assert len(notices) == 2, err
    assert len([n for n in notices if heartbeat_key(keys, 1) in n]) == 1, err
    assert len([n for n in notices if heartbeat_key(keys, 0) in n]) == 1, err
    assert all("another process on this machine" in n for n in notices)
    assert "Traceback" not in err
    assert json.loads((run_dir / "results.json").read_text())["status"] == "completed"


@pytest.mark.slow  # 8 s; garbage and forged reports in the store stay in make test
def test_forged_heartbeats_do_not_hide_a_hung_worker(tmp_path: Path) -> None:
    """Rank 1 hangs at step 5; a local process keeps writing fresh-looking heartbeats for it
    (in the format the launcher once believed). The launcher still names rank 1 as lost,
    after faults.heartbeat_timeout_s, not after the collective timeout of 60 s. (A replayed
    genuine value cannot help either: it carries its own, old, time; see the unit tests.)"""
    sections = slow_data_parallel(workers=2, delay_s=0.05, heartbeat_timeout_s=3, timeout_s=60)
    sections["faults"]["inject"] = {"rank": 1, "step": 5, "kind": "hang"}
    job = write_job(tmp_path, **sections)
    run_dir = tmp_path / "runs" / "job"
    launcher = start("train", str(job), cwd=tmp_path, exec_workers=True)
    workers = workers_of(launcher, 2)
    store, key = store_of(workers[0]), heartbeat_key(job_signer(workers[0]), 1)
    wait_for_step(run_dir, 2)  # the launcher has seen rank 1's genuine heartbeats
    started = time.monotonic()
    stop = threading.Event()

    def lie() -> None:
        while not stop.is_set():
            try:
                store.set(key, f"{time.time():.3f} 999")
            except Exception:  # the job is over: its store is gone
                return
            time.sleep(0.1)

    liar = threading.Thread(target=lie, daemon=True)
    liar.start()
    try:
        code, _, err = finish(launcher, timeout=90)
    finally:
        stop.set()
        liar.join()
    elapsed = time.monotonic() - started
    assert code == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("rank 1 stopped responding: no heartbeat for"), err
    assert "its heartbeat key also held values that failed authentication" in last
    assert elapsed < 30, f"detected after {elapsed:.0f} s (faults.timeout_s is 60)"
    no_worker_left(run_dir)


def test_a_forged_report_does_not_speak_for_a_worker(tmp_path: Path) -> None:
    """Rank 1 exits without a word; a local process has left a report in its name claiming a
    user error. The launcher refuses it and says what it knows: exit code 17, no report."""
    sections = slow_data_parallel(workers=2, delay_s=0.2)
    sections["faults"]["inject"] = {"rank": 1, "step": 8, "kind": "exit"}
    job = write_job(tmp_path, **sections)
    run_dir = tmp_path / "runs" / "job"
    launcher = start("train", str(job), cwd=tmp_path, exec_workers=True)
    workers = workers_of(launcher, 2)
    store, key = store_of(workers[0]), report_key(job_signer(workers[0]), 1)
    forged = {
        "rank": 1,
        "step": 3,
        "type": "ConfigError",
        "message": "forged",
        "lines": ["run rm -rf / to fix this"],
        "user_error": True,
        "exit_code": 2,
        "communication_error": False,
    }
    store.set(key, json.dumps(forged))
    del store
    code, _, err = finish(launcher, timeout=90)
    assert code == 1, err
    assert "rm -rf" not in err and f"ignored a value under {key}" in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("rank 1 exited with code 17 without an error report"), last
    no_worker_left(run_dir)


def test_key_names_depend_on_the_secret() -> None:
    a, b = Signer(new_secret()), Signer(new_secret())
    assert heartbeat_key(a, 1) != heartbeat_key(b, 1) != heartbeat_key(b, 2)
    assert heartbeat_key(a, 1).startswith("shoal/heartbeat/1/")


# ------------------------------------------------------------ the process groups' keys


def test_a_stray_client_that_overwrites_the_group_keys_ends_the_job_in_one_line(
    tmp_path: Path,
) -> None:
    """Any client of the store lists its keys (the secret-derived names hide nothing) and
    overwrites every key of the process groups in a loop, from before the workers meet.
    Before, gloo parsed the garbage and both ranks died of `std::bad_alloc`; now no rank
    hands torch a value the job did not seal: the job ends in one line naming the store."""
    job = write_job(tmp_path, **slow_data_parallel(workers=2, delay_s=0.05, epochs=2))
    launcher = start("train", str(job), cwd=tmp_path, exec_workers=True)
    store = store_of(workers_of(launcher, 2)[0])
    stop = threading.Event()
    seen: set[str] = set()

    def jam() -> None:
        while not stop.is_set():
            try:
                for key in store.list_keys():
                    seen.add(key)
                    if not key.startswith("shoal/"):
                        store.set(key, bytes(range(256)) * 4)
            except Exception:  # the job is over: its store is gone
                return

    jammer = threading.Thread(target=jam, daemon=True)
    jammer.start()
    try:
        code, _, err = finish(launcher, timeout=120)
    finally:
        stop.set()
        jammer.join()
    assert any(not k.startswith("shoal/") for k in seen), seen  # the group keys were listed
    assert code == 1, err
    last = err.strip().splitlines()[-1]
    assert re.search(
        r"the job's store at 127\.0\.0\.1:\d+: the value under '[^']+' is not one this job "
        r"wrote \(.+\): another process that reaches the store overwrote a process group's key",
        last,
    ), err[-3000:]
    assert "bad_alloc" not in err and "Traceback" not in err
    no_worker_left(tmp_path / "runs" / "job")


@pytest.mark.slow  # 7 s
def test_a_stray_client_cannot_park_unbounded_data_in_the_launcher_s_store(
    tmp_path: Path,
) -> None:
    """A client parks 8 MiB values under new keys: past the launcher's bound (512 MiB) the
    job stops with one line naming the store, instead of the machine running out of memory."""
    job = write_job(tmp_path, **slow_data_parallel(workers=2, delay_s=0.1, epochs=40))
    run_dir = tmp_path / "runs" / "job"
    launcher = start("train", str(job), cwd=tmp_path, exec_workers=True)
    store = store_of(workers_of(launcher, 2)[0])
    wait_for_step(run_dir, 2)
    chunk = b"x" * (8 << 20)
    parked = 0
    try:
        while launcher.poll() is None and parked < 4 << 30:
            store.set(f"parked/{parked}", chunk)
            parked += len(chunk)
    except Exception:  # the job stopped: its store is gone
        pass
    code, _, err = finish(launcher, timeout=120)
    assert code == 1, err
    assert parked < 2 << 30, f"{parked >> 20} MiB parked before the job stopped"
    last = err.strip().splitlines()[-1]
    assert re.search(
        r"the job's store at 127\.0\.0\.1:\d+: the launcher that hosts it grew by \d+ MiB while "
        r"the job keeps kilobytes there: another process that reaches the store is parking data",
        last,
    ), err[-3000:]
    assert "Traceback" not in err
    no_worker_left(run_dir)
