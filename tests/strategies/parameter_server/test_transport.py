"""Workers and servers in real processes (gloo on loopback): routing and modes.

Two workers and two servers talk through `RowClient` and `ServerEndpoint` as a
job's do; worker 1 pushes clock 0 and then stalls until worker 0 is done, so
each mode shows what it does with a straggler. (Bad messages: tests/hostile/.)
"""

from __future__ import annotations

import datetime
import json
import logging
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from shoal.comm.links import CommGroup
from shoal.shape.hosts import Hosts
from shoal.strategies.parameter_server.client import RowClient
from shoal.strategies.parameter_server.config import RowSGDConfig
from shoal.strategies.parameter_server.endpoint import ServerEndpoint
from shoal.strategies.parameter_server.row_optimizers import build_row_optimizer
from shoal.strategies.parameter_server.server import ShardServer
from shoal.strategies.parameter_server.sharding import hash_owners
from shoal.strategies.parameter_server.shards import build_shard
from shoal.strategies.parameter_server.transport import RemoteLink, ServerRefused
from shoal.strategies.parameter_server.wire import Op
from tests.comm.group import run_in_group

ENTITIES, RELATIONS, WIDTH, WORKERS, SERVERS = 40, 3, 4, 2, 2
LR, BARRIER_S, STEPS = 0.5, 1.5, 6
INITIAL = torch.arange(ENTITIES * WIDTH, dtype=torch.float32).view(ENTITIES, WIDTH) / 100
OWNERS = {"entity": hash_owners(ENTITIES, SERVERS), "relation": hash_owners(RELATIONS, SERVERS)}


def _job(rank: int, world_size: int, mode: str, bound: int | None, out: str) -> None:
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=30))
    peers = CommGroup(rank, world_size, Hosts.single(world_size), 30.0, group)
    if rank >= WORKERS:  # a server
        server = rank - WORKERS
        optimizer = build_row_optimizer(RowSGDConfig(lr=LR))
        tables = {
            "entity": build_shard(OWNERS["entity"], server, WIDTH, INITIAL.__getitem__, optimizer),
            "relation": build_shard(
                OWNERS["relation"],
                server,
                WIDTH,
                lambda ids: torch.zeros(len(ids), WIDTH),
                optimizer,
            ),
        }
        shard = ShardServer(server, SERVERS, WORKERS, tables, optimizer, mode, bound, BARRIER_S)
        ServerEndpoint(shard, peers, (WIDTH, WIDTH), 64, logging.getLogger("test")).serve()
        Path(out, f"server-{server}.json").write_text(json.dumps(peers.received_bytes))
        return
    links = [RemoteLink(s, WORKERS + s, peers) for s in range(SERVERS)]
    client = RowClient(rank, links, OWNERS, (WIDTH, WIDTH), max_rows=16, timeout_s=30.0)
    ids = torch.arange(ENTITIES)  # more rows than one message carries: split by max_rows
    none = torch.zeros(0, dtype=torch.int64)
    ones = torch.ones(ENTITIES, WIDTH)
    result: dict[str, object] = {}
    if rank == 1:
        client.pull(ids, none, 0).wait()
        client.push(ids, ones, none, torch.zeros(0, WIDTH), 0)
        flag = torch.zeros(1)
        dist.recv(flag, 0)  # stall until worker 0 is done
    else:
        reached = 0
        try:
            for clock in range(STEPS):
                client.pull(ids, none, clock).wait()
                client.push(ids, ones, none, torch.zeros(0, WIDTH), clock)
                reached = clock + 1
        except ServerRefused as exc:
            result["error"] = str(exc)
        result["reached"] = reached
        dist.send(torch.ones(1), 1)
        if reached == STEPS:  # every push is in: a fresh pull sees all of them
            rows, _ = client.pull(ids, none, STEPS, fresh=True).wait()
            result["rows_ok"] = bool(torch.allclose(rows, INITIAL - LR * (STEPS + 1)))
        stats = client.control(Op.STATS, STEPS, fresh=False)
        result["staleness"] = [s["staleness"] for s in stats]
    client.bye()
    result["sent_bytes"] = client.sent_bytes()
    Path(out, f"worker-{rank}.json").write_text(json.dumps(result))


@pytest.mark.parametrize(
    ("mode", "bound", "reached"),
    # sync: the pull for clock 2 waits for worker 1's push of clock 1; bounded(2): the pull
    # for clock 4 is 3 clocks ahead of worker 1; async: never waits
    [("sync", 0, 2), ("bounded", 2, 4), ("async", None, STEPS)],
)
def test_modes_with_a_stalled_worker(
    tmp_path: Path, mode: str, bound: int | None, reached: int
) -> None:
    ranks = run_in_group(WORKERS + SERVERS, _job, tmp_path, mode, bound, str(tmp_path))
    assert ranks == list(range(WORKERS + SERVERS))
    fast = json.loads((tmp_path / "worker-0.json").read_text())
    assert fast["reached"] == reached
    # every byte a worker sent was received, and counted, by a server (the peer layer)
    sent = [json.loads((tmp_path / f"worker-{w}.json").read_text())["sent_bytes"] for w in (0, 1)]
    received = [json.loads((tmp_path / f"server-{s}.json").read_text()) for s in (0, 1)]
    assert min(sent) > 0 and sum(sent) == sum(received)
    staleness = [int(k) for hist in fast["staleness"] for k in hist]
    if mode == "async":
        assert "error" not in fast and fast["rows_ok"]
        # worker 0 ran on, 4 or 5 clocks ahead of the stalled worker (beyond bounded's 2)
        assert max(staleness) >= STEPS - 2
    else:
        assert "worker 1 (at clock 1)" in fast["error"] and "barrier_timeout_s" in fast["error"]
        assert max(staleness) == bound  # never more than the bound, and the bound was reached
