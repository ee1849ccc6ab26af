"""A plain PyTorch DDP script that survives `torchrun --max-restarts`: the side-by-side of chaos.py.

What a user writes against torch alone: DDP on the synthetic data and MLP of
chaos.py's shoal job, a checkpoint (model, optimizer, step) saved by rank 0 with
torch.save every `--checkpoint-every` steps (to a temporary file, then renamed),
and, at start, a resume from it when it exists; the process group meets under a
store prefix of its restart (without it, torchrun's restarts of a gloo job fail). Rank 0 appends
`<wall time> <step> <restart count>` to `--log` after every step, which is how
chaos.py finds the steps to strike at, the steps lost and the recovery time.

    torchrun --standalone --nproc-per-node 2 --max-restarts 25 chaos_ddp.py DIR ...
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

from shoal.tasks.classification.config import SyntheticDataConfig
from shoal.tasks.classification.data import make_synthetic


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch-size", type=int, default=32, help="global")
    parser.add_argument("--checkpoint-every", type=int, required=True)
    args = parser.parse_args()
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    # gloo's keys in torchrun's store are not kept apart per restart: a restarted rank read
    # the dead rank's address (connectFullMesh: connection refused, every restart). So the
    # group meets under a prefix of its restart, as a user of plain torch must write it.
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
        timeout=datetime.timedelta(seconds=300), wait_for_workers=False,
    )  # fmt: skip
    dist.init_process_group(
        "gloo", store=dist.PrefixStore(f"restart-{restart}", store), rank=rank, world_size=world
    )
    torch.set_num_threads(1)
    config = SyntheticDataConfig(
        samples=args.samples, features=10, informative=5, classes=3, seed=1
    )
    data = make_synthetic(config)
    x, y = data.train.features, data.train.labels
    torch.manual_seed(3)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = 0
    checkpoint = folder / "checkpoint.pt"
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
    sampler = DistributedSampler(range(len(y)), num_replicas=world, rank=rank, shuffle=True, seed=0)
    per_rank = args.batch_size // world
    per_epoch = len(y) // args.batch_size
    log = open(folder / "steps.log", "a") if rank == 0 else None  # noqa: SIM115
    while step < args.steps:
        epoch, within = divmod(step, per_epoch)
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler))
        index = order[within * per_rank : (within + 1) * per_rank]
        optimizer.zero_grad()
        F.cross_entropy(model(x[index]), y[index], reduction="sum").div(args.batch_size).backward()
        optimizer.step()
        step += 1
        if log is not None:
            log.write(f"{time.time():.3f} {step} {restart}\n")
            log.flush()
        if rank == 0 and step % args.checkpoint_every == 0:
            state = {
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "step": step,
            }
            torch.save(state, folder / "checkpoint.tmp")
            os.replace(folder / "checkpoint.tmp", checkpoint)
    dist.barrier()
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "step": step}, folder / "final.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
