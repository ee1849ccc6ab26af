"""The parameter-server protocol against a hostile peer: every message it can send is either
answered and survived, with the next request served exactly, or refused with a named reason.

Real processes (gloo on loopback), as in tests/strategies/parameter_server/test_transport.py.
A server (async, so nothing waits on a barrier) serves a 40 x 4 table whose rows are known,
and each test checks the rows a worker pulls after something bad, value for value.
"""

from __future__ import annotations

import datetime
import json
import logging
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from shoal.comm.links import CommGroup
from shoal.shape.hosts import Hosts
from shoal.strategies.parameter_server.client import RowClient
from shoal.strategies.parameter_server.config import RowSGDConfig
from shoal.strategies.parameter_server.endpoint import ServerEndpoint
from shoal.strategies.parameter_server.row_optimizers import build_row_optimizer
from shoal.strategies.parameter_server.server import ShardServer
from shoal.strategies.parameter_server.shards import build_shard
from shoal.strategies.parameter_server.transport import RemoteLink, ServerRefused
from shoal.strategies.parameter_server.wire import (
    HEADER_LEN,
    MAX_BLOB,
    UNBOUNDED,
    Header,
    Op,
    Tag,
    pack_payload,
)
from tests.comm.group import run_in_group

ENTITIES, RELATIONS, WIDTH, MAX_ROWS, LR = 40, 3, 4, 16, 0.5
INITIAL = torch.arange(ENTITIES * WIDTH, dtype=torch.float32).view(ENTITIES, WIDTH) / 100
NONE = torch.zeros(0, dtype=torch.int64)


def peers(group: Any, timeout_s: float) -> CommGroup:
    """This rank's place in `group` (the world's ranks), waits timing out after `timeout_s`."""
    world = dist.get_world_size()
    return CommGroup(dist.get_rank(), world, Hosts.single(world), timeout_s, group)


def serve(workers: int, timeout_s: float = 30.0) -> ShardServer:
    """The last rank: one server of every row, async, SGD."""
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=60))
    optimizer = build_row_optimizer(RowSGDConfig(lr=LR))
    owners = {"entity": torch.zeros(ENTITIES, dtype=torch.int32).numpy()}
    owners["relation"] = torch.zeros(RELATIONS, dtype=torch.int32).numpy()
    tables = {
        "entity": build_shard(owners["entity"], 0, WIDTH, INITIAL.__getitem__, optimizer),
        "relation": build_shard(
            owners["relation"], 0, WIDTH, lambda ids: torch.zeros(len(ids), WIDTH), optimizer
        ),
    }
    server = ShardServer(0, 1, workers, tables, optimizer, "async", None, 30.0)
    log = logging.getLogger("test")
    ServerEndpoint(server, peers(group, timeout_s), (WIDTH, WIDTH), MAX_ROWS, log).serve()
    return server


def client(rank: int, server_rank: int) -> RowClient:
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=60))
    owners = {
        "entity": torch.zeros(ENTITIES, dtype=torch.int32).numpy(),
        "relation": torch.zeros(RELATIONS, dtype=torch.int32).numpy(),
    }
    link = RemoteLink(0, server_rank, peers(group, 30.0))
    return RowClient(rank, [link], owners, (WIDTH, WIDTH), MAX_ROWS, timeout_s=30.0)


def refused(client: RowClient, header: Header, ids: torch.Tensor, reply_values: int) -> str:
    """Send one request through the worker's own link; the server must refuse it."""
    try:
        client.links[0].request(header, ids, b"", reply_values).wait(30.0)
    except ServerRefused as exc:
        return str(exc)
    raise AssertionError(f"the server answered {header}")


# ---------------------------------------------------------------- the requests a link can send
def _rejected_then_served(rank: int, world_size: int, out: str) -> None:
    if rank == 1:
        serve(workers=1)
        return
    worker = client(rank, server_rank=1)
    ids = torch.tensor([3, 5, 7])
    other = torch.tensor([30, 31, 32])  # as many rows as the rejected request carries
    errors, exact = [], []
    for bad, reply_values in (
        (Header(Op.PULL, 1, 0, 3, 0), 3 * WIDTH),  # names another worker
        (Header(Op.REPLY, 0, 0, 3, 0), 0),  # an op that is no request, with row ids
        (Header(Op.PULL, 0, 0, 3, 0), 3 * WIDTH),  # with a row id out of range (below)
    ):
        bad_ids = torch.tensor([3, 5, 99]) if bad.op == Op.PULL and bad.sender == 0 else ids
        errors.append(refused(worker, bad, bad_ids, reply_values))
        rows, _ = worker.pull(other, NONE, 0).wait()
        exact.append(bool(torch.equal(rows, INITIAL[other])))
    worker.bye()
    Path(out, "result.json").write_text(json.dumps({"errors": errors, "exact": exact}))


def test_after_a_rejected_request_the_next_pull_gets_exactly_its_rows(tmp_path: Path) -> None:
    """A rejected request's payload is read to its end: the next pull of as many rows does
    not read the rejected one's ids (the wrong rows), nor wait for rows that went elsewhere."""
    assert run_in_group(2, _rejected_then_served, tmp_path, str(tmp_path)) == [0, 1]
    result: dict[str, Any] = json.loads((tmp_path / "result.json").read_text())
    assert "header names worker 1, sent by rank 0" in result["errors"][0]
    assert "op REPLY is not a request" in result["errors"][1]
    assert "entity id out of range" in result["errors"][2]
    assert result["exact"] == [True, True, True]


# ---------------------------------------------------------------- raw messages
class Raw:
    """A rank that writes the wire format by hand, as a careless or hostile peer would."""

    def __init__(self, rank: int, server_rank: int) -> None:
        self.rank = rank
        self.server_rank = server_rank
        self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=60))
        self.seq = 0
        self._in_flight: list[Any] = []  # sends the server may never read

    def header(self, op: int, rows: int = 0, **fields: int) -> torch.Tensor:
        """A well-formed header with the next sequence number; `fields` overwrite by name."""
        self.seq += 1
        header = Header(Op.PULL, self.rank, 0, rows, 0, seq=self.seq)
        tensor = header.tensor()
        tensor[FIELDS["op"]] = op
        for name, value in fields.items():
            tensor[FIELDS[name]] = value
        return tensor

    def send(self, header: torch.Tensor, payload: torch.Tensor | None = None) -> None:
        for tag, tensor in ((Tag.HEADER, header), (Tag.PAYLOAD, payload)):
            if tensor is not None:
                work = dist.isend(tensor, self.server_rank, group=self.group, tag=tag)
                self._in_flight.append((work, tensor))

    def ask(
        self, header: torch.Tensor, payload: torch.Tensor | None = None, values: int = 0
    ) -> tuple[int, int, str, torch.Tensor]:
        """Send a request, wait for its reply: (op, seq, error text, values). `values`: the
        floats of the values message the reply has (an error to a readable pull has one)."""
        raw = torch.zeros(HEADER_LEN, dtype=torch.int64)
        timeout = datetime.timedelta(seconds=30)
        header_work = dist.irecv(raw, self.server_rank, group=self.group, tag=Tag.REPLY_HEADER)
        rows = torch.full((max(values, 1),), float("nan"))
        rows_work = (
            dist.irecv(rows, self.server_rank, group=self.group, tag=Tag.REPLY_VALUES)
            if values
            else None
        )
        self.send(header, payload)
        header_work.wait(timeout)
        reply = Header.parse(raw, UNBOUNDED)
        text = ""
        if reply.blob_len:
            blob = torch.empty(reply.blob_len, dtype=torch.uint8)
            dist.recv(blob, self.server_rank, group=self.group, tag=Tag.REPLY_BLOB)
            text = bytes(blob.numpy().tobytes()).decode()
        if rows_work is not None:
            rows_work.wait(timeout)
        return int(reply.op), reply.seq, text, rows

    def pull(self, ids: torch.Tensor) -> torch.Tensor:
        """A valid pull of entity rows: they must come back exactly."""
        header = self.header(Op.PULL, len(ids))
        op, seq, text, rows = self.ask(header, payload(header, ids), len(ids) * WIDTH)
        assert op == Op.REPLY and seq == self.seq, text
        return rows.view(len(ids), WIDTH)

    def refused(
        self, header: torch.Tensor, payload: torch.Tensor | None = None, values: int = 0
    ) -> str:
        op, seq, text, _ = self.ask(header, payload, values)
        assert op == Op.ERROR and seq == int(header[FIELDS["seq"]]), (op, seq, text)
        return text

    def bye(self) -> None:
        """Say goodbye and wait until gloo has handed it over (the server reads a goodbye
        from every channel, closed or not). Once, the server never read a closed rank's
        goodbye that the rank had sent before its final barrier (not reproduced in 39 runs
        since); should it recur, this says whether the send itself never completed."""
        self.send(self.header(Op.BYE))
        work, _ = self._in_flight[-1]
        assert work.wait(datetime.timedelta(seconds=30)), "the server never took the goodbye"


FIELDS = {
    name: i
    for i, name in enumerate(
        [
            "magic",
            "op",
            "sender",
            "seq",
            "clock",
            "fresh",
            "more",
            "entity_rows",
            "relation_rows",
            "values",
            "blob_len",
            "end",
        ]
    )
}


def payload(
    header: torch.Tensor,
    ids: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    blob: bytes = b"",
    seq: int | None = None,
) -> torch.Tensor:
    """The payload a header's sizes call for, stamped for `seq` (default: the header's)."""
    stamped = Header(Op.PULL, int(header[FIELDS["sender"]]), 0)
    stamped.seq = int(header[FIELDS["seq"]]) if seq is None else seq
    return pack_payload(stamped, ids, values, blob)


# ---------------------------------------------------------------- answered and survived
ROWS = torch.arange(20, 24)  # rows nobody pushes to: always INITIAL[ROWS]
THREE = torch.tensor([20, 21, 22])


def _careless(rank: int, world_size: int, out: str) -> None:
    if rank == 1:
        serve(workers=1)
        return
    peer = Raw(rank, server_rank=1)
    results: dict[str, list[Any]] = {}

    def then_pull(case: str, text: str) -> None:
        results[case] = [text, bool(torch.equal(peer.pull(ROWS), INITIAL[ROWS]))]

    pull_values = 3 * WIDTH  # an error to a readable pull of 3 rows still has a values message
    h = peer.header(42, 3)
    then_pull("unknown op", peer.refused(h, payload(h, THREE)))
    h = peer.header(Op.REPLY, 3)
    then_pull("no request", peer.refused(h, payload(h, THREE)))
    h = peer.header(Op.PULL, 3, sender=1)
    then_pull("another sender", peer.refused(h, payload(h, THREE), pull_values))
    h = peer.header(Op.PULL, 3, seq=peer.seq + 5)
    peer.seq -= 1  # the server still expects the number this one skipped
    then_pull("seq ahead", peer.refused(h, payload(h, THREE), pull_values))
    h = peer.header(Op.PULL, 3, seq=peer.seq - 1)
    peer.seq -= 1
    then_pull("seq replayed", peer.refused(h, payload(h, THREE), pull_values))
    h = peer.header(Op.PULL, 3, clock=-4)
    then_pull("negative clock", peer.refused(h, payload(h, THREE)))
    h = peer.header(Op.PULL, 3, fresh=7)
    then_pull("fresh not a flag", peer.refused(h, payload(h, THREE)))
    h = peer.header(Op.PULL, 3)
    then_pull("id out of range", peer.refused(h, payload(h, torch.tensor([20, 21, 99])), 12))
    h = peer.header(Op.PULL, 3, values=3)
    then_pull("values on a pull", peer.refused(h, payload(h, THREE, torch.ones(3)), 12))
    h = peer.header(Op.PULL, 3, blob_len=4)
    then_pull("blob on a pull", peer.refused(h, payload(h, THREE, blob=b"abcd"), 12))
    h = peer.header(Op.PULL, 3, more=2)
    then_pull("chunked pull", peer.refused(h, payload(h, THREE), pull_values))
    h = peer.header(Op.SAVE, blob_len=2, fresh=1)
    then_pull("non-UTF-8 path", peer.refused(h, payload(h, blob=b"\xff\xfe")))
    # a push cannot be answered: refused, it refuses the worker, and its next pull says why
    h = peer.header(Op.PUSH, 1, values=WIDTH)
    peer.send(h, payload(h, torch.tensor([99]), torch.ones(WIDTH)))
    h = peer.header(Op.PULL, 4)
    results["after a refused push"] = [peer.refused(h, payload(h, ROWS), 4 * WIDTH)]
    peer.bye()
    Path(out, "result.json").write_text(json.dumps(results))


def test_a_careless_peer_is_answered_and_its_next_pull_gets_exactly_its_rows(
    tmp_path: Path,
) -> None:
    """Requests that are well framed but wrong: each is read to its end, refused with an
    answer that names what is wrong, and the same peer's next pull gets exactly its rows."""
    assert run_in_group(2, _careless, tmp_path, str(tmp_path)) == [0, 1]
    results = json.loads((tmp_path / "result.json").read_text())
    expected = {
        "unknown op": "unknown op 42",
        "no request": "op REPLY is not a request",
        "another sender": "header names worker 1, sent by rank 0",
        "seq ahead": "sequence number 11 out of order: rank 0's next message to server 0 is "
        "number 7",
        "seq replayed": "sequence number 6 out of order: rank 0's next message to server 0 is "
        "number 8",
        "negative clock": "negative clock",
        "fresh not a flag": "fresh flag not 0/1",
        "id out of range": "entity id out of range",
        "values on a pull": "3 values in a pull of 3 + 0 rows (expected 0)",
        "blob on a pull": "a pull carries no blob",
        "chunked pull": "only a push comes in chunks",
        "non-UTF-8 path": "not a folder name",
    }
    for case, text in expected.items():
        assert text in results[case][0], (case, results[case][0])
        assert results[case][1], f"{case}: the next pull did not get exactly its rows"
    refusal = results["after a refused push"][0]
    assert "refused worker 0's push for clock 0 (entity id out of range [0, 40))" in refusal, (
        refusal
    )


# ---------------------------------------------------------------- a closed channel
HOSTILE = (
    "bad magic",
    "truncated header",
    "negative size",
    "too many rows",
    "too many values",
    "too large a blob",
    "short payload",
    "another message's payload",
    "int32 ids",
)


def _hostile(rank: int, world_size: int, out: str) -> None:
    """Ranks 0..8 each try one of HOSTILE; rank 9 trains on through it all; rank 10 serves."""
    honest, server_rank = len(HOSTILE), len(HOSTILE) + 1
    if rank == server_rank:
        serve(workers=len(HOSTILE) + 1)
        return
    if rank == honest:
        _train_through(rank, server_rank, out)
        return
    peer = Raw(rank, server_rank)
    case = HOSTILE[rank]
    three = 3 * WIDTH
    if case == "bad magic":  # and a payload the server must never read
        h = peer.header(Op.PULL, 3, magic=7)
        first = peer.refused(h, payload(h, THREE))
    elif case == "truncated header":
        first = peer.refused(peer.header(Op.PULL, 3)[:8])
    elif case == "negative size":
        h = peer.header(Op.PULL, 3, relation_rows=-1)
        first = peer.refused(h, payload(h, THREE[:2]))
    elif case == "too many rows":
        h = peer.header(Op.PULL, MAX_ROWS + 1)
        first = peer.refused(h, payload(h, torch.arange(MAX_ROWS + 1)))
    elif case == "too many values":
        h = peer.header(Op.PUSH, 1, values=MAX_ROWS * WIDTH + 1)
        first = peer.refused(h, payload(h, THREE[:1], torch.ones(MAX_ROWS * WIDTH + 1)))
    elif case == "too large a blob":
        h = peer.header(Op.SAVE, blob_len=MAX_BLOB + 1, fresh=1)
        first = peer.refused(h, payload(h, blob=b"x" * (MAX_BLOB + 1)))
    elif case == "short payload":  # the header says 3 rows, the payload carries 2
        h = peer.header(Op.PULL, 3)
        first = peer.refused(h, payload(h, THREE[:2]), three)
    elif case == "another message's payload":
        h = peer.header(Op.PULL, 3)
        first = peer.refused(h, payload(h, THREE, seq=peer.seq + 1), three)
    else:  # int32 ids: as many ids, half the bytes
        h = peer.header(Op.PULL, 3)
        stamped = payload(h, THREE)
        ids32 = torch.cat([THREE.to(torch.int32).view(torch.uint8), stamped[-8:]])
        first = peer.refused(h, ids32, three)
    h = peer.header(Op.PULL, 3)  # a valid pull now: refused, with the reason
    then = peer.refused(h, payload(h, THREE), three)
    peer.bye()
    Path(out, f"hostile-{rank}.json").write_text(json.dumps([first, then]))


def _train_through(rank: int, server_rank: int, out: str) -> None:
    worker = client(rank, server_rank)
    ids = torch.arange(10)
    expected = INITIAL[ids].clone()
    exact = []
    for clock in range(30):
        rows, _ = worker.pull(ids, NONE, clock).wait()
        exact.append(bool(torch.equal(rows, expected)))
        worker.push(ids, torch.ones(10, WIDTH), NONE, torch.zeros(0, WIDTH), clock)
        expected.add_(torch.ones(10, WIDTH), alpha=-LR)
    rows, _ = worker.pull(ids, NONE, 30, fresh=True).wait()
    exact.append(bool(torch.equal(rows, expected)))
    worker.bye()
    Path(out, "honest.json").write_text(json.dumps(exact))


def test_a_hostile_peer_is_shut_out_and_named_while_the_others_train_on(tmp_path: Path) -> None:
    """A header whose frame is broken, or a payload that is not its header's: the server
    cannot tell what else that rank sent, so it reads nothing more from it (no stale rows,
    no message larger than a receive posted for it) and answers every later request of it
    with the reason. The honest worker's 31 pulls all get exactly their rows."""
    world = len(HOSTILE) + 2
    assert run_in_group(world, _hostile, tmp_path, str(tmp_path)) == list(range(world))
    assert json.loads((tmp_path / "honest.json").read_text()) == [True] * 31
    expected = {
        "bad magic": "not a parameter-server header (magic 0x7)",
        "truncated header": "a truncated or garbled header",
        "negative size": "a negative size",
        "too many rows": "17 rows in one message exceed the bound of 16",
        "too many values": "65 values in one message exceed the bound of 64",
        "too large a blob": "a blob of 65537 bytes exceeds the bound of 65536",
        "short payload": "is not that header's",
        "another message's payload": "is not that header's",
        "int32 ids": "is not that header's",
    }
    for rank, case in enumerate(HOSTILE):
        first, then = json.loads((tmp_path / f"hostile-{rank}.json").read_text())
        assert expected[case] in first and f"rank {rank}" in first, (case, first)
        assert "reads no more from it" in first, (case, first)
        assert f"rank {rank}'s channel is closed" in then and expected[case] in then, then


# ---------------------------------------------------------------- a payload that never comes
def _silent_payload(rank: int, world_size: int, out: str) -> None:
    if rank == 1:
        try:
            serve(workers=1, timeout_s=3.0)
        except Exception as exc:
            Path(out, "server.txt").write_text(f"{type(exc).__name__}: {exc}")
        return
    peer = Raw(rank, server_rank=1)
    peer.send(peer.header(Op.PULL, 3))  # announces 3 row ids and sends none
    for work, _ in peer._in_flight:  # the header is read: it must not be dropped unsent
        work.wait(datetime.timedelta(seconds=30))


def test_a_payload_that_never_comes_fails_the_server_naming_the_rank(tmp_path: Path) -> None:
    assert run_in_group(2, _silent_payload, tmp_path, str(tmp_path)) == [0, 1]
    text = (tmp_path / "server.txt").read_text()
    assert text.startswith("PeerTimeout: server 0: rank 0 announced a payload of 32 bytes"), text
    assert "did not send it within 3 s" in text, text
