"""A shard server's rules without processes: sharding, clocks, held pulls, row optimizers."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from shoal.errors import DataError, PeerFailed
from shoal.launch.reports import is_communication_error
from shoal.strategies.parameter_server.config import (
    FileShardingConfig,
    HashShardingConfig,
    LazyAdamConfig,
    RangeShardingConfig,
    RowAdagradConfig,
    RowSGDConfig,
)
from shoal.strategies.parameter_server.row_optimizers import build_row_optimizer
from shoal.strategies.parameter_server.server import ShardServer, TableShard
from shoal.strategies.parameter_server.sharding import local_index, shard_ids, table_owners
from shoal.strategies.parameter_server.wire import (
    HEADER_LEN,
    Bounds,
    Header,
    Message,
    Op,
    WireError,
)

NAMES = [f"e{i}" for i in range(103)]


@pytest.mark.parametrize("sharding", [HashShardingConfig(), RangeShardingConfig()])
@pytest.mark.parametrize("servers", [1, 2, 3])
def test_every_row_is_owned_by_exactly_one_server(sharding: object, servers: int) -> None:
    owners = table_owners(sharding, servers, NAMES, relation=False)  # type: ignore[arg-type]
    shards = [set(shard_ids(owners, s).tolist()) for s in range(servers)]
    assert sum(len(s) for s in shards) == len(NAMES)
    assert set().union(*shards) == set(range(len(NAMES)))
    assert max(len(s) for s in shards) - min(len(s) for s in shards) <= len(NAMES) // 5
    for server, ids in enumerate(shards):
        index = local_index(owners, server)
        assert sorted(index[sorted(ids)].tolist()) == list(range(len(ids)))


def test_partition_file_places_rows_and_names_its_errors(tmp_path: Path) -> None:
    path = tmp_path / "parts.tsv"
    path.write_text("".join(f"{n}\t{i % 2}\n" for i, n in enumerate(NAMES)))
    owners = table_owners(FileShardingConfig(kind="file", path=str(path)), 2, NAMES, False)
    assert owners.tolist() == [i % 2 for i in range(len(NAMES))]
    path.write_text("e0\t0\n")
    with pytest.raises(DataError, match="102 entities have no server"):
        table_owners(FileShardingConfig(kind="file", path=str(path)), 2, NAMES, False)
    path.write_text("e0\t5\n")
    with pytest.raises(DataError, match=r"parts.tsv:1: server 5 is out of range"):
        table_owners(FileShardingConfig(kind="file", path=str(path)), 2, NAMES, False)


def _server(mode: str, bound: int | None, workers: int = 2, lr: float = 0.5) -> ShardServer:
    tables = {}
    for name, rows in (("entity", 6), ("relation", 2)):
        owners = np.zeros(rows, dtype=np.int32)
        tables[name] = TableShard(
            torch.arange(rows), local_index(owners, 0), torch.ones(rows, 3), {}
        )
    optimizer = build_row_optimizer(RowSGDConfig(lr=lr))
    return ShardServer(0, 1, workers, tables, optimizer, mode, bound, barrier_timeout_s=5.0)


def _pull(worker: int, clock: int, ids: list[int], seq: int = 0) -> Message:
    return Message(Header(Op.PULL, worker, clock, len(ids), 0, seq=seq), worker, torch.tensor(ids))


def _push(worker: int, clock: int, ids: list[int], value: float) -> Message:
    header = Header(Op.PUSH, worker, clock, len(ids), 0)
    return Message(header, worker, torch.tensor(ids), torch.full((len(ids) * 3,), value))


def test_sync_applies_a_clock_only_when_every_worker_pushed_it() -> None:
    server = _server("sync", 0)
    assert len(server.receive(_pull(0, 0, [1]), 0.0)) == 1  # clock 0: nothing to wait for
    assert server.receive(_push(0, 0, [1, 2], 1.0), 0.0) == []
    assert server.receive(_pull(0, 1, [1, 2]), 0.0) == []  # held: worker 1 has not pushed 0
    assert torch.equal(server.tables["entity"].rows[1], torch.ones(3))  # nothing applied yet
    replies = server.receive(_push(1, 0, [2], 2.0), 0.0)
    assert len(replies) == 1 and replies[0].worker == 0
    # what the pushes made of it: 1 - lr * (sum of the gradients)
    assert replies[0].values is not None
    assert torch.allclose(replies[0].values.view(2, 3), torch.tensor([[0.5] * 3, [-0.5] * 3]))
    assert dict(server.stats.staleness) == {0: 2}


@pytest.mark.parametrize("arrival", list(itertools.permutations(range(3))))
def test_sync_sums_a_clock_in_worker_order_whatever_the_arrival_order(
    arrival: tuple[int, ...],
) -> None:
    """In float32, (1e8 + 1) - 1e8 == 0 but (1e8 - 1e8) + 1 == 1: the order of a sum shows.
    Workers 0, 1, 2 push 1e8, 1, -1e8 to one row; in worker order the sum is 0."""
    server = _server("sync", 0, workers=3)
    values = (1e8, 1.0, -1e8)
    for worker in arrival:
        server.receive(_push(worker, 0, [4], values[worker]), 0.0)
    assert server.sync_clock == 1
    assert torch.equal(server.tables["entity"].rows[4], torch.ones(3))  # 1 - lr * 0


def test_bounded_holds_a_pull_more_than_the_bound_ahead_and_async_does_not() -> None:
    for mode, bound in (("bounded", 2), ("async", None)):
        server = _server(mode, bound)
        for clock in range(4):
            server.receive(_push(0, clock, [0], 0.1), 0.0)
        answered = [bool(server.receive(_pull(0, c, [0], seq=c), 0.0)) for c in range(2, 5)]
        if mode == "bounded":  # worker 1 is at clock 0: pulls up to clock 2 are served
            assert answered == [True, False, False]
            assert max(server.stats.staleness) == 2
            released = server.receive(_push(1, 0, [0], 0.1), 0.0)
            assert [r.header.clock for r in released] == [3]  # in order, within the bound
        else:
            assert answered == [True, True, True]
            assert max(server.stats.staleness) == 4


def test_a_held_pull_expires_naming_the_worker_it_waits_for() -> None:
    server = _server("sync", 0)
    server.receive(_push(0, 0, [0], 0.1), 0.0)
    server.receive(_pull(0, 1, [0]), 0.0)
    assert server.expire(4.0) == []
    (reply,) = server.expire(6.0)
    assert reply.header.op == Op.ERROR
    assert "worker 1 (at clock 0)" in reply.blob.decode()
    assert "barrier_timeout_s" in reply.blob.decode()


def test_bad_requests_are_refused_before_they_change_anything() -> None:
    """A refused push gets no answer (pushes have none) and leaves a hole in the worker's
    clocks: the worker is refused from then on, its next request answered with the reason."""
    server = _server("async", None)
    assert server.receive(_push(0, 0, [99], 1.0), 0.0) == []
    assert "entity id out of range" in server.refused[0]
    assert server.receive(_push(1, 3, [0], 1.0), 0.0) == []
    assert "pushes must come in clock order" in server.refused[1]
    assert server.received == [0, 0]
    assert torch.equal(server.tables["entity"].rows, torch.ones(6, 3))
    (reply,) = server.receive(_pull(0, 0, [1], seq=5), 0.0)
    assert reply.header.op == Op.ERROR and reply.header.seq == 5
    assert "entity id out of range" in reply.blob.decode()
    with pytest.raises(WireError, match="exceed the bound of 8"):
        Header.parse(Header(Op.PULL, 0, 0, 9, 0).tensor(), Bounds(8, 8))
    with pytest.raises(WireError, match="not a parameter-server header"):
        Header.parse(torch.zeros(HEADER_LEN, dtype=torch.int64), Bounds(8, 8))


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (_pull(0, 0, [99]), "entity id out of range"),
        (_pull(0, 0, [-1]), "entity id out of range"),
        (Message(Header(Op.PULL, 0, 0, 2, 0), 0, torch.tensor([1])), "1 row ids where"),
        (Message(Header(Op.SNAPSHOT, 0, 0, 1, 0), 0, torch.tensor([1])), "carries no row ids"),
        (Message(Header(Op.STATS, 0, 0), 0, blob=b"x"), "a stats carries no blob"),
        (Message(Header(Op.PULL, 0, 0, more=2), 0), "only a push comes in chunks"),
        (Message(Header(Op.SAVE, 0, 0, fresh=True), 0, blob=b"\xff\xfe"), "not a folder name"),
        (Message(Header(Op.SAVE, 0, 0, fresh=True), 0, blob=b"a\0b"), "not a folder name"),
    ],
)
def test_a_refused_request_is_answered_in_its_turn_and_the_worker_served_on(
    message: Message, reason: str
) -> None:
    """Worker 0's pull for clock 1 is held (sync: worker 1 has not pushed clock 0); a bad
    request after it is answered after it, and the worker's next pull is served."""
    server = _server("sync", 0)
    server.save_root = Path("/nonexistent-run-dir")
    server.receive(_push(0, 0, [1], 1.0), 0.0)
    assert server.receive(_pull(0, 1, [1], seq=1), 0.0) == []
    message.header.seq = 2
    assert server.receive(message, 0.0) == []  # behind the held pull
    replies = server.receive(_push(1, 0, [2], 1.0), 0.0)
    assert [(r.header.seq, r.header.op) for r in replies] == [(1, Op.REPLY), (2, Op.ERROR)]
    assert reason in replies[1].blob.decode()
    (served,) = server.receive(_pull(0, 1, [1, 2], seq=3), 0.0)
    assert served.header.op == Op.REPLY and served.values is not None
    assert torch.equal(served.values.view(2, 3), torch.full((2, 3), 0.5))
    assert server.refused == {}


@pytest.mark.parametrize(
    ("push", "reason"),
    [
        (_push(0, 0, [2, 1], 1.0), "unique and ascending"),
        (_push(0, 0, [1, 1], 1.0), "unique and ascending"),
        (_push(0, 0, [1], float("nan")), "non-finite values"),
        (Message(Header(Op.PUSH, 0, 0, 1, 0), 0, torch.tensor([1]), torch.ones(2)), "2 values"),
        (
            Message(Header(Op.PUSH, 0, 0, 1, 0, fresh=True), 0, torch.tensor([1]), torch.ones(3)),
            "only an answered request can be fresh",
        ),
    ],
)
def test_a_refused_push_refuses_its_worker_and_a_held_pull_names_why(
    push: Message, reason: str
) -> None:
    server = _server("sync", 0)
    server.receive(_push(1, 0, [1], 1.0), 0.0)
    assert server.receive(_pull(1, 1, [1]), 0.0) == []  # held for worker 0's clock 0
    assert server.receive(push, 0.0) == []
    assert reason in server.refused[0]
    assert torch.equal(server.tables["entity"].rows, torch.ones(6, 3))
    (expired,) = server.expire(6.0)
    assert "worker 0 (at clock 0)" in expired.blob.decode()
    assert reason in expired.blob.decode() and "refused" in expired.blob.decode()


def test_a_shard_is_saved_only_inside_the_run_directory(tmp_path: Path) -> None:
    server = _server("async", None)
    server.save_root = tmp_path.resolve()
    save = Header(Op.SAVE, 0, 0, fresh=True)
    (reply,) = server.receive(Message(save, 0, blob=str(tmp_path).encode()), 0.0)
    assert (tmp_path / "ps-shard-000-of-001.pt").is_file()
    (refused,) = server.receive(Message(save, 0, blob=str(tmp_path.parent).encode()), 0.0)
    assert reply.header.op == Op.REPLY and refused.header.op == Op.ERROR
    assert "outside the run directory" in refused.blob.decode()


def test_a_save_given_up_by_its_worker_fails_as_a_consequence_not_a_cause(tmp_path: Path) -> None:
    """The worker that asked for a shard removes the checkpoint's temporary folder when another
    rank fails during the save; the server then fails writing into it. That failure is a
    consequence: the launcher must name the rank that failed first, not this server."""
    server = _server("async", None)
    server.save_root = tmp_path.resolve()
    gone = tmp_path / ".step-00000006.tmp"
    save = Header(Op.SAVE, 0, 0, fresh=True)
    with pytest.raises(PeerFailed, match=r"server 0: the checkpoint folder .* was removed") as err:
        server.receive(Message(save, 0, blob=str(gone).encode()), 0.0)
    assert is_communication_error(err.value)


def test_row_optimizers_match_their_definitions() -> None:
    grads = [torch.randn(2, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    index = torch.tensor([0, 2])
    # row-wise adagrad: one accumulator per row, the mean of g^2 over the row
    adagrad = build_row_optimizer(RowAdagradConfig(lr=0.1, eps=1e-10))
    table, state = torch.zeros(3, 4), adagrad.new_state(3, 4)
    total = torch.zeros(2)
    expected = torch.zeros(2, 4)
    for g in grads:
        adagrad.apply(table, state, index, g)
        total += g.pow(2).mean(dim=1)
        expected -= 0.1 * g / (total.sqrt()[:, None] + 1e-10)
    assert torch.allclose(table[index], expected, atol=1e-6)
    assert torch.equal(table[1], torch.zeros(4))
    # lazy adam equals torch's SparseAdam, also for a row left out of a step
    lazy = build_row_optimizer(LazyAdamConfig(lr=0.01))
    table, state = torch.zeros(3, 4), lazy.new_state(3, 4)
    reference = torch.nn.Parameter(torch.zeros(3, 4))
    sparse_adam = torch.optim.SparseAdam([reference], lr=0.01)
    for step, g in enumerate(grads):
        rows, values = (index, g) if step != 1 else (index[:1], g[:1])
        lazy.apply(table, state, rows, values)
        reference.grad = torch.sparse_coo_tensor(rows[None], values, (3, 4), check_invariants=True)
        sparse_adam.step()
    assert torch.allclose(table, reference.detach(), atol=1e-6)
    assert state["step"].tolist() == [3.0, 0.0, 3.0]


def test_a_colocated_worker_gets_each_reply_whatever_order_it_waits_in() -> None:
    """A prefetched pull may still be in flight when the worker asks for statistics."""
    from shoal.strategies.parameter_server.server import Reply
    from shoal.strategies.parameter_server.transport import LocalChannel

    channel = LocalChannel(worker=0)
    for seq in (41, 42):
        channel.replies.put(Reply(0, Header(Op.REPLY, 0, 0, seq=seq)))
    first = channel.reply_to(42, timeout_s=1.0)
    second = channel.reply_to(41, timeout_s=1.0)
    assert first is not None and first.header.seq == 42
    assert second is not None and second.header.seq == 41
    assert channel.reply_to(43, timeout_s=0.05) is None


def _restore(clock: int, folder: Path | str = "") -> Message:
    blob = json.dumps({"clock": clock, "folder": str(folder)}).encode()
    return Message(Header(Op.RESTORE, 0, 2, fresh=True), 0, blob=blob)


def _trained(server: ShardServer, clocks: range) -> None:
    for clock in clocks:
        for worker in (0, 1):
            server.receive(_push(worker, clock, [1, 4], 0.1 * (clock + 1)), 0.0)


def test_the_best_model_comes_back_from_memory_or_else_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    """RESTORE puts back the snapshot of the best clock; a server restarted since (a fresh
    ShardServer: its snapshot died with its process) reads the rows of that clock from the
    best checkpoint's shard files instead, and refuses, changing nothing, when there is
    none or it is of another clock."""

    def load(folder: Path, tables: dict[str, TableShard]) -> int:
        state = torch.load(folder / "ps-shard-000-of-001.pt", weights_only=True)
        for name, table in tables.items():
            table.rows.copy_(state[f"{name}.rows"])
        return int(state["clock"])

    first = _server("sync", 0)
    first.save_root = tmp_path.resolve()
    _trained(first, range(1))
    first.receive(Message(Header(Op.SNAPSHOT, 0, 1, fresh=True), 0), 0.0)
    best = tmp_path / "best" / "step-1"
    best.mkdir(parents=True)
    first.receive(Message(Header(Op.SAVE, 0, 1, fresh=True), 0, blob=str(best).encode()), 0.0)
    best_rows = first.tables["entity"].rows.clone()
    _trained(first, range(1, 2))
    assert not torch.equal(first.tables["entity"].rows, best_rows)
    (reply,) = first.receive(_restore(1), 0.0)
    assert json.loads(reply.blob) == {"restored": "memory"}
    assert torch.equal(first.tables["entity"].rows, best_rows)

    again = _server("sync", 0)  # restarted after the best evaluation: no snapshot
    again.save_root, again.load_files = tmp_path.resolve(), load
    _trained(again, range(2))
    final = again.tables["entity"].rows.clone()
    for asked, why in (
        (_restore(1), "holds no snapshot of clock 1"),
        (_restore(0, best), "holds clock 1, not the best model's 0"),
        (_restore(1, tmp_path.parent), "outside the run directory"),
    ):
        (refused,) = again.receive(asked, 0.0)
        assert refused.header.op == Op.ERROR and why in refused.blob.decode()
        assert torch.equal(again.tables["entity"].rows, final)
    (reply,) = again.receive(_restore(1, best), 0.0)
    assert json.loads(reply.blob) == {"restored": "disk"}
    assert torch.equal(again.tables["entity"].rows, best_rows)
