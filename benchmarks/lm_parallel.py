"""The lm under model parallelism: shoal's pipeline beside the same schedule in a plain script.

For each schedule (gpipe, 1f1b, interleaved_1f1b) and micro-batch count (4, 8) on 2
ranks: shoal trains the tinyshakespeare lm for --steps steps (`[strategy] type =
"pipeline"`, the balanced partition), and a plain script builds the same model, the
same stages (blocks split in equal halves, or quarters for the interleaved schedule)
and torch's schedule directly (torch.distributed.pipelining, gloo), with AdamW and
clipping, on random windows of the same shape. Tokens/s are the timed steps' tokens
over their step time (the first --warmup steps are not timed); per-rank peak memory is
the process's peak resident set (shoal's results.json `pipeline.ranks[*].peak_mb`; the
plain script's getrusage); the bubble is shoal's measured fraction (its ranks' mean of
idle / step inside the schedule) beside the plain script's, measured the same way (with
--phases; "nan" without), and the schedule's theory.

`--rows spmd` compares the SPMD layouts the same way: local, data_parallel 2,
tensor_parallel 2, fully_sharded 2, hybrid data 2 x tensor 2, and the pipeline meshes
data 2 x pipeline 2 and pipeline 2 x tensor 2, each beside a plain script that lays the
same model out with the same torch APIs (DDP, `parallelize_module` with the Megatron
plan, `fully_shard` per block, DeviceMesh, pipelining stages on the mesh's pipeline
group). Besides tokens/s it reports each rank's bytes of parameters + gradients +
optimizer state (its local shards; shoal's results.json `memory` or `pipeline`
sections; local and data_parallel hold the whole model: 16 bytes a parameter with AdamW).

With `--device cuda` (one GPU: NCCL refuses two ranks on one device) the rows are local
and data_parallel with one replica (its step's collectives through NCCL) beside the plain
loop and DDP on the GPU; tokens/s then come from wall time (shoal's intervals, the plain
loop's timed steps between two synchronizations), which holds the kernels still queued.

    .venv/bin/python benchmarks/lm_parallel.py [--rows pipeline|spmd] [--steps 30]
        [--dim 128] [--layers 4] [--context 64] [--batch 16] [--only NAME] [--rounds N] [--phases]
        [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import shoal

REPO = Path(__file__).resolve().parents[1]
TEXT = REPO.parent / "shared" / "datasets" / "tinyshakespeare" / "input.txt.gz"
INTERVAL = 5


def shoal_row(args: argparse.Namespace, schedule: str, m: int, scratch: str) -> dict[str, Any]:
    strategy: dict[str, Any] = {"type": "pipeline", "stages": 2, "microbatches": m}
    strategy["schedule"] = schedule
    result, train = shoal_run(args, strategy, f"{schedule}-{m}", scratch)
    if args.phases:
        print_phases(2, train)
    tokens = sum(r["samples"] for r in train) * args.context
    section = result["pipeline"]
    return {
        "tokens_s": tokens / sum(r["step_s"] for r in train),
        "peak_mb": [r["peak_mb"] for r in section["ranks"]],
        "bubble": section["bubble"]["measured"],
        "theory": section["bubble"]["theory"],
    }


def shoal_run(
    args: argparse.Namespace, strategy: dict[str, Any], name: str, scratch: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """shoal's run of the tinyshakespeare lm under `strategy`; its timed metric records."""
    result = shoal.train(lm_config(args, strategy, name, scratch))
    lines = (Path(result["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    train = [r for r in map(json.loads, lines) if r["event"] == "train"][args.warmup // INTERVAL :]
    return result, train


def lm_config(
    args: argparse.Namespace, strategy: dict[str, Any], name: str, scratch: str
) -> dict[str, Any]:
    """The benchmark's job: the lm of `args`' size under `strategy`, AdamW, clipping."""
    return {
        "task": {
            "type": "lm",
            "data": {"train": str(TEXT)},
            "model": {"dim": args.dim, "heads": 4, "layers": args.layers, "context": args.context},
            "evaluation": {"max_windows": 1},
        },
        "strategy": strategy,
        "train": {
            "max_steps": args.steps,
            "batch_size": args.batch,
            "drop_last": True,
            "seed": 1,
            "optimizer": {"kind": "adamw", "lr": 1e-3},
            "grad_clip_norm": 1.0,
        },
        "checkpoint": {"every_epochs": 0, "at_end": False, "keep_best": False},
        "monitor": {"progress": "off", "log_every_steps": INTERVAL},
        "run": {"dir": scratch, "name": name, "device": args.device},
    }


def plain_worker(rank: int, args: argparse.Namespace, schedule: str, m: int, store: str) -> None:
    """The same pipeline written directly against torch.distributed.pipelining."""
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    from shoal.strategies.pipeline.measure import StageClock
    from shoal.tasks.lm.config import LMModelConfig
    from shoal.tasks.lm.model import build_lm

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store, 2),
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=120),
    )
    vocab = 65
    config = LMModelConfig(dim=args.dim, heads=4, layers=args.layers, context=args.context)
    torch.manual_seed(1)
    model = build_lm(config, vocab)
    total = 4 if schedule == "interleaved_1f1b" else 2
    per = args.layers // total
    mine = [rank + 2 * k for k in range(total // 2)]
    modules = [model.stage(i * per, (i + 1) * per - 1) for i in mine]
    stages = [
        PipelineStage(mod, i, total, torch.device("cpu"))
        for mod, i in zip(modules, mine, strict=True)
    ]
    params = [p for mod in modules for p in mod.parameters()]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    batch = args.batch

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        flat = logits.reshape(-1, vocab).float()
        return F.cross_entropy(flat, targets.reshape(-1), reduction="sum") / (args.context * batch)

    clock = StageClock()
    loss: Any = loss_fn
    if args.phases:  # compute time as shoal's pipeline measures it (measure.StageClock)
        for stage in stages:
            clock.wrap(stage)
        loss = clock.timed(loss_fn)
    if schedule == "interleaved_1f1b":
        pipe: Any = ScheduleInterleaved1F1B(stages, m, loss_fn=loss, scale_grads=False)
    else:
        kind = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
        pipe = kind(stages[0], m, loss_fn=loss, scale_grads=False)
    generator = torch.Generator().manual_seed(2)
    times = []
    phases: list[tuple[float, float, float]] = []
    for step in range(args.steps):
        tokens = torch.randint(0, vocab, (batch, args.context + 1), generator=generator)
        started = time.perf_counter()
        for p in params:
            p.grad = None
        if step == args.warmup:
            clock.take()
        scheduled = time.perf_counter()
        if rank == 0:
            pipe.step(tokens[:, :-1], return_outputs=False)
        else:
            pipe.step(target=tokens[:, 1:], return_outputs=False)
        clip_started = time.perf_counter()
        square = torch.stack([p.grad.norm() ** 2 for p in params if p.grad is not None]).sum()
        dist.all_reduce(square)
        torch.nn.utils.clip_grads_with_norm_(params, 1.0, square.sqrt())
        optimizer.step()
        if step >= args.warmup:
            ended = time.perf_counter()
            times.append(ended - started)
            phases.append((clip_started - started, ended - clip_started, clip_started - scheduled))
    bubble = float("nan")
    if args.phases:
        forward_backward, after, schedule_ms = (
            1e3 * sum(p) / len(p) for p in zip(*phases, strict=True)
        )
        # as shoal measures it: the schedule's step time not spent computing, as a fraction
        bubble = 1 - 1e3 * clock.compute_s / len(phases) / schedule_ms
        idle = forward_backward - 1e3 * clock.compute_s / len(phases)
        print(
            f"plain rank {rank} per step: forward and backward {forward_backward:.1f} ms "
            f"(idle {idle:.1f}), clipping + optimizer {after:.1f} ms",
            flush=True,
        )
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    figures = torch.tensor([sum(times), peak_mb, bubble], dtype=torch.float64)
    gathered = [torch.zeros_like(figures) for _ in range(2)]
    dist.all_gather(gathered, figures)
    if rank == 0:
        step_s = max(float(g[0]) for g in gathered)
        out = {
            "tokens_s": len(times) * batch * args.context / step_s,
            "peak_mb": [float(g[1]) for g in gathered],
            "bubble": sum(float(g[2]) for g in gathered) / 2,  # NaN without --phases
        }
        Path(store + ".json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


def plain_row(args: argparse.Namespace, schedule: str, m: int, scratch: str) -> dict[str, Any]:
    # a fresh folder each run: a FileStore left by an earlier round holds its stale addresses
    store = os.path.join(tempfile.mkdtemp(dir=scratch), f"store-{schedule}-{m}")
    mp.start_processes(
        plain_worker, args=(args, schedule, m, store), nprocs=2, start_method="spawn"
    )
    return json.loads(Path(store + ".json").read_text())


#: the SPMD rows: (name, shoal's [strategy], the plain script's layout)
SPMD_ROWS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("local", {"type": "local"}, {"dims": {}}),
    (
        "data_parallel 2",
        {"type": "data_parallel", "num_replicas": 2},
        {"dims": {"data": 2}, "ddp": True},
    ),
    ("tensor_parallel 2", {"type": "tensor_parallel", "degree": 2}, {"dims": {"tensor": 2}}),
    ("fully_sharded 2", {"type": "fully_sharded", "degree": 2}, {"dims": {"data": 2}}),
    (
        "hybrid data 2 x tensor 2",
        {"type": "hybrid", "mesh": {"data": 2, "tensor": 2}},
        {"dims": {"data": 2, "tensor": 2}},
    ),
    (
        "hybrid data 2 x pipeline 2",
        {"type": "hybrid", "mesh": {"data": 2, "pipeline": 2}, "microbatches": 4},
        {"dims": {"data": 2, "pipeline": 2}},
    ),
    (
        "hybrid pipeline 2 x tensor 2",
        {"type": "hybrid", "mesh": {"pipeline": 2, "tensor": 2}, "microbatches": 4},
        {"dims": {"pipeline": 2, "tensor": 2}},
    ),
]
#: with --device cuda: the rows one GPU can hold (NCCL refuses two ranks on one device);
#: data_parallel's one replica runs its step's collectives through NCCL, beside DDP's
GPU_ROWS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("local", {"type": "local"}, {"dims": {}}),
    ("data_parallel 1", {"type": "data_parallel", "num_replicas": 1}, {"dims": {}, "ddp": True}),
]


def state_bytes_of(result: dict[str, Any], params: int) -> list[float]:
    """Each rank's parameters + gradients + optimizer state, MiB, as shoal reports it."""
    if "memory" in result:
        return [r["state_bytes"] / 2**20 for r in result["memory"]["per_rank"]]
    if "pipeline" in result:
        return [r["parameters_gradients_optimizer_mb"] for r in result["pipeline"]["ranks"]]
    return [16 * params / 2**20] * result["world_size"]  # fp32 parameter, gradient, AdamW's 2


def spmd_shoal_row(args: argparse.Namespace, strategy: dict[str, Any], scratch: str) -> Any:
    name = strategy["type"] + "-" + "x".join(map(str, strategy.get("mesh", {}).values()))
    result, train = shoal_run(args, strategy, name, scratch)
    if args.phases:
        print_phases(result["world_size"], train)
    steps = len(train) * INTERVAL
    # on a GPU the steps' own times miss the kernels still queued when a step's clock
    # stops: the intervals' wall time (from one log record to the next) holds them all
    took = sum(r["interval_s" if args.device == "cuda" else "step_s"] for r in train)
    tokens_s = steps * args.batch * args.context / took
    from shoal.tasks.lm.config import LMModelConfig
    from shoal.tasks.lm.model import build_lm

    config = LMModelConfig(dim=args.dim, heads=4, layers=args.layers, context=args.context)
    params = sum(p.numel() for p in build_lm(config, 65).parameters())
    row = {"tokens_s": tokens_s, "state_mb": state_bytes_of(result, params)}
    if "pipeline" in result:
        row["partition"] = result["pipeline"]["partition"]
    return row


def print_phases(world: int, train: list[dict[str, Any]]) -> None:
    """shoal's per-rank phases of the timed steps, as the plain script prints its own
    (a pipeline's comm_s is its idle time inside the schedule, part of forward and
    backward; optimizer_s is the non-finite agreement, clipping and the optimizer)."""
    for rank in range(world):
        mean = {
            key: 1e3 * sum(r[f"rank{rank}_{key}"] for r in train) / len(train)
            for key in ("forward_backward_s", "comm_s", "optimizer_s")
        }
        print(
            f"shoal rank {rank} per step: forward and backward {mean['forward_backward_s']:.1f} "
            f"ms (idle {mean['comm_s']:.1f}), agreement + clipping + optimizer "
            f"{mean['optimizer_s']:.1f} ms",
            flush=True,
        )


def plain_spmd_worker(
    rank: int, args: argparse.Namespace, layout: dict[str, Any], world: int, store: str
) -> None:
    """One layout written directly against torch: DDP, or a DeviceMesh with the Megatron
    plan over `tensor`, `fully_shard` per block over `data`, pipelining stages over
    `pipeline`; AdamW, clipping by the global norm; random windows of the same shape."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.nn.parallel import DistributedDataParallel

    from shoal.strategies.pipeline.measure import StageClock
    from shoal.tasks.lm.config import LMModelConfig
    from shoal.tasks.lm.model import build_lm
    from shoal.tasks.lm.parallel import tensor_parallel_plan

    dims: dict[str, int] = layout["dims"]
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1:  # one process alone keeps torch's threads, as shoal's local does
        torch.set_num_threads(1)
    if world > 1 or layout.get("ddp"):
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            store=dist.FileStore(store, world),
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=300),
        )
    vocab, batch, m = 65, args.batch, 4
    config = LMModelConfig(dim=args.dim, heads=4, layers=args.layers, context=args.context)
    torch.manual_seed(1)
    model: Any = build_lm(config, vocab).to(device)
    mesh = (
        init_device_mesh("cpu", tuple(dims.values()), mesh_dim_names=tuple(dims)) if dims else None
    )
    coords = {n: int(mesh.get_local_rank(n)) for n in dims} if mesh is not None else {}
    pipe = dims.get("pipeline", 1)
    if pipe > 1:
        per = args.layers // pipe
        first = coords["pipeline"] * per
        model = copy.deepcopy(model.stage(first, first + per - 1))
    if "tensor" in dims and mesh is not None:
        parallelize_module(model, mesh["tensor"], tensor_parallel_plan(model))
    if layout.get("ddp"):
        model = DistributedDataParallel(model, device_ids=[rank] if device.type == "cuda" else None)
    elif "data" in dims and mesh is not None:
        for block in model.blocks.children():
            fully_shard(block, mesh=mesh["data"])
        fully_shard(model, mesh=mesh["data"])
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    share = batch // dims.get("data", 1)

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        flat = logits.reshape(-1, vocab).float()
        return F.cross_entropy(flat, targets.reshape(-1), reduction="sum") / (args.context * share)

    schedule = None
    clock = StageClock()
    if pipe > 1 and mesh is not None:
        stage = PipelineStage(
            model, coords["pipeline"], pipe, torch.device("cpu"), group=mesh["pipeline"].get_group()
        )
        loss: Any = loss_fn
        if args.phases:  # compute time as shoal's pipeline measures it (measure.StageClock)
            clock.wrap(stage)
            loss = clock.timed(loss_fn)
        schedule = Schedule1F1B(stage, m, loss_fn=loss, scale_grads=False)
    generator = torch.Generator().manual_seed(2 + coords.get("data", 0))
    times: list[float] = []
    phases: list[tuple[float, float, float]] = []
    for step in range(args.steps):
        tokens = torch.randint(0, vocab, (share, args.context + 1), generator=generator)
        tokens = tokens.to(device)
        started = time.perf_counter()
        for p in params:
            p.grad = None
        if step == args.warmup:
            clock.take()
            if device.type == "cuda":  # the timed steps' wall time, from an idle GPU to one
                torch.cuda.synchronize()
                region_started = time.perf_counter()
        backward_started = time.perf_counter()
        if schedule is None:
            loss_fn(model(tokens[:, :-1]), tokens[:, 1:]).backward()
        elif coords["pipeline"] == 0:
            schedule.step(tokens[:, :-1], return_outputs=False)
        else:
            schedule.step(target=tokens[:, 1:], return_outputs=False)
        clip_started = time.perf_counter()
        clip(params, 1.0, mesh["pipeline"].get_group() if pipe > 1 and mesh else None)
        optimizer_started = time.perf_counter()
        optimizer.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - started)
            phases.append(
                (
                    clip_started - backward_started,
                    optimizer_started - clip_started,
                    time.perf_counter() - optimizer_started,
                )
            )
    state = sum(_local(p).numel() * 4 for p in params) * 2 + sum(
        _local(v).numel() * v.element_size()
        for s in optimizer.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    )
    if args.phases:
        means = (1e3 * sum(p) / len(p) for p in zip(*phases, strict=True))
        forward_backward, clipping, stepping = means
        idle = forward_backward - 1e3 * clock.compute_s / len(phases) if schedule else 0.0
        print(
            f"plain rank {rank} per step: forward and backward {forward_backward:.1f} ms "
            f"(idle {idle:.1f}), clipping {clipping:.1f} ms, optimizer {stepping:.1f} ms",
            flush=True,
        )
    took = sum(times)
    if device.type == "cuda":
        torch.cuda.synchronize()
        took = time.perf_counter() - region_started
    figures = torch.tensor([took, state / 2**20], dtype=torch.float64)
    gathered = [figures]
    if world > 1:
        gathered = [torch.zeros_like(figures) for _ in range(world)]
        dist.all_gather(gathered, figures)
    if rank == 0:
        step_s = max(float(g[0]) for g in gathered)
        out = {
            "tokens_s": len(times) * batch * args.context / step_s,
            "state_mb": [float(g[1]) for g in gathered],
        }
        Path(store + ".json").write_text(json.dumps(out))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def clip(params: list[torch.Tensor], max_norm: float, pipeline: Any) -> None:
    """torch's total norm of the DTensor gradients (one DTensor norm, made whole) and of the
    plain ones (replicated: the same on every rank), summed over the pipeline's stages."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    sharded = [g for g in grads if isinstance(g, DTensor)]
    plain = [g for g in grads if not isinstance(g, DTensor)]
    if not sharded and pipeline is None:
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        return
    square = torch.zeros(())
    meshes: dict[int, list[torch.Tensor]] = {}
    for grad in sharded:  # torch stacks per-parameter norms of one mesh only
        meshes.setdefault(id(grad.device_mesh), []).append(grad)  # type: ignore[attr-defined]
    for group in meshes.values():
        norm = torch.nn.utils.get_total_norm(group)
        square += (norm.full_tensor() if isinstance(norm, DTensor) else norm) ** 2
    if plain:
        square += torch.nn.utils.get_total_norm(plain) ** 2
    if pipeline is not None:
        dist.all_reduce(square, group=pipeline)
    coef = torch.clamp(max_norm / (square.sqrt() + 1e-6), max=1.0)
    with torch.no_grad():
        for grad in grads:
            _local(grad).mul_(coef)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def plain_spmd_row(
    args: argparse.Namespace, name: str, layout: dict[str, Any], scratch: str
) -> Any:
    world = 1
    for size in layout["dims"].values():
        world *= size
    # a fresh store file each run (a FileStore keeps the keys of the run before)
    store = os.path.join(tempfile.mkdtemp(dir=scratch), "store-" + name.replace(" ", "-"))
    mp.start_processes(
        plain_spmd_worker, args=(args, layout, world, store), nprocs=world, start_method="spawn"
    )
    return json.loads(Path(store + ".json").read_text())


def spmd_rows(args: argparse.Namespace) -> None:
    """Each row --rounds times, shoal and the plain script alternately; the medians (and,
    with more than one round, every round's figures)."""
    print(
        "| strategy | shoal tokens/s | plain tokens/s | ratio | shoal params+grads+optimizer "
        "MiB per rank | plain MiB per rank | shoal / local |"
    )
    print("|---|---|---|---|---|---|---|")
    from shoal.tasks.lm.config import LMModelConfig
    from shoal.tasks.lm.model import build_lm

    config = LMModelConfig(dim=args.dim, heads=4, layers=args.layers, context=args.context)
    local_mb = 16 * sum(p.numel() for p in build_lm(config, 65).parameters()) / 2**20
    with tempfile.TemporaryDirectory() as scratch:
        for name, strategy, layout in GPU_ROWS if args.device == "cuda" else SPMD_ROWS:
            if args.only and args.only not in name:
                continue
            mine, plain, rounds = alternate(
                args.rounds,
                lambda: spmd_shoal_row(args, strategy, scratch),  # noqa: B023 - called at once
                lambda: plain_spmd_row(args, name, layout, scratch),  # noqa: B023
            )
            ratio = mine["tokens_s"] / plain["tokens_s"]
            print(
                f"| {name} | {mine['tokens_s']:.0f} | {plain['tokens_s']:.0f} | {ratio:.2f} | "
                f"{', '.join(f'{x:.2f}' for x in mine['state_mb'])} | "
                f"{', '.join(f'{x:.2f}' for x in plain['state_mb'])} | "
                f"{max(mine['state_mb']) / local_mb:.2f} |",
                flush=True,
            )
            if args.rounds > 1:
                partition = (
                    f"; shoal's partition {mine['partition']}" if "partition" in mine else ""
                )
                print(f"  {name} by round, shoal / plain tokens/s: {rounds}{partition}", flush=True)


def alternate(
    rounds: int, mine: Callable[[], dict[str, Any]], plain: Callable[[], dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """`rounds` runs of shoal's row and the plain script's, alternately, the one that goes
    first swapping every round (a run right after another one's processes may differ:
    in session 10 the side that went first lost 20 of 22 1F1B rounds): each side's median
    round, and every round's tokens/s ('shoal / plain, ...')."""
    mine_rounds, plain_rounds = [], []
    for index in range(rounds):
        if index % 2:
            plain_rounds.append(plain())
            mine_rounds.append(mine())
        else:
            mine_rounds.append(mine())
            plain_rounds.append(plain())
    pairs = list(zip(mine_rounds, plain_rounds, strict=True))
    each = ", ".join(f"{a['tokens_s']:.0f} / {b['tokens_s']:.0f}" for a, b in pairs)
    return _median_row(mine_rounds), _median_row(plain_rounds), each + _paired(pairs)


def _paired(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """The rounds' ratios as one figure: their geometric mean, its standard error (of the
    mean log ratio, as a factor) and the rounds shoal lost. A round's two runs follow each
    other, so the machine's drift (its speed moved by 30 % within minutes in session 11)
    cancels in a round's ratio more than in two medians taken over all rounds."""
    logs = [math.log(a["tokens_s"] / b["tokens_s"]) for a, b in pairs]
    mean = sum(logs) / len(logs)
    spread = (
        math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1) / len(logs))
        if len(logs) > 1
        else 0.0
    )
    lost = sum(x < 0 for x in logs)
    return (
        f"; per round: geometric mean {math.exp(mean):.3f} "
        f"(standard error x{math.exp(spread):.3f}), lost {lost} of {len(logs)}"
    )


def _median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The round whose tokens/s is the median (the lower middle one for an even count)."""
    ordered = sorted(rows, key=lambda row: row["tokens_s"])
    return ordered[(len(ordered) - 1) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", choices=("pipeline", "spmd"), default="pipeline")
    parser.add_argument(
        "--only", default="", help='spmd rows whose name contains this; the pipeline row "1f1b 8"'
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="runs of each row, alternating; the median"
    )
    parser.add_argument(
        "--phases", action="store_true", help="print each rank's time per step phase"
    )
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: the spmd rows one GPU holds (local, data_parallel 1 over NCCL)",
    )
    args = parser.parse_args()
    if args.device == "cuda" and args.rows != "spmd":
        parser.error("--device cuda: the pipeline rows need a GPU per rank; use --rows spmd")
    if args.rows == "spmd":
        spmd_rows(args)
        return
    print(
        "| schedule | micro-batches | shoal tokens/s | plain tokens/s | ratio | shoal peak MiB "
        "(rank 0, 1) | plain peak MiB (rank 0, 1) | bubble measured | plain bubble | "
        "bubble theory |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        for schedule in ("gpipe", "1f1b", "interleaved_1f1b"):
            for m in (4, 8):
                if args.only and args.only != f"{schedule} {m}":
                    continue
                mine, plain, rounds = alternate(
                    args.rounds,
                    lambda: shoal_row(args, schedule, m, scratch),  # noqa: B023 - called at once
                    lambda: plain_row(args, schedule, m, scratch),  # noqa: B023
                )
                ratio = mine["tokens_s"] / plain["tokens_s"]
                print(
                    f"| {schedule} | {m} | {mine['tokens_s']:.0f} | {plain['tokens_s']:.0f} | "
                    f"{ratio:.2f} | {', '.join(f'{x:.0f}' for x in mine['peak_mb'])} | "
                    f"{', '.join(f'{x:.0f}' for x in plain['peak_mb'])} | "
                    f"{mine['bubble']:.2f} | {plain['bubble']:.2f} | {mine['theory']:.2f} |",
                    flush=True,
                )
                if args.rounds > 1:
                    print(
                        f"  {schedule} {m} by round, shoal / plain tokens/s: {rounds}", flush=True
                    )


if __name__ == "__main__":
    main()
