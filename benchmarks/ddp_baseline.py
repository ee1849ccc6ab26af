"""A plain PyTorch DDP training script: the baseline `dp_vs_ddp.py` measures shoal against.

Idiomatic DDP (DistributedSampler order, DDP's default buckets), on the same data,
MLP, optimizer and global batch as the shoal run. Launched by dp_vs_ddp.py with
`torchrun --standalone --nproc-per-node 2 ddp_baseline.py OUT.json ...`.
"""

from __future__ import annotations

import argparse
import json
import os
import time

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
    parser.add_argument("out")
    parser.add_argument("--samples", type=int, required=True)
    parser.add_argument("--features", type=int, required=True)
    parser.add_argument("--classes", type=int, required=True)
    parser.add_argument("--hidden", type=int, nargs="+", required=True)
    parser.add_argument("--batch-size", type=int, required=True, help="global")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--skip", type=int, required=True, help="warm-up steps not timed")
    parser.add_argument("--bucket-view", action="store_true", help="gradient_as_bucket_view=True")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    data = make_synthetic(
        SyntheticDataConfig(
            samples=args.samples,
            features=args.features,
            informative=16,
            classes=args.classes,
            seed=0,
        )
    )
    x, y = data.train.features, data.train.labels

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    width = args.features
    for hidden in args.hidden:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, args.classes))
    model = DistributedDataParallel(
        nn.Sequential(*layers), gradient_as_bucket_view=args.bucket_view
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    sampler = DistributedSampler(range(len(y)), num_replicas=world, rank=rank, shuffle=True, seed=0)
    per_rank = args.batch_size // world
    step, step_time = 0, 0.0
    epoch = 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler))
        for start in range(0, len(order) - per_rank + 1, per_rank):
            if step >= args.steps:
                break
            began = time.perf_counter()
            index = order[start : start + per_rank]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x[index]), y[index])
            loss.backward()
            optimizer.step()
            if step >= args.skip:
                step_time += time.perf_counter() - began
            step += 1
        epoch += 1
    timed = torch.tensor([step_time])
    dist.all_reduce(timed)  # mean step time over ranks, as shoal reports it
    if rank == 0:
        seconds = timed.item() / world
        samples = (args.steps - args.skip) * per_rank * world
        with open(args.out, "w") as handle:
            json.dump({"samples_per_s": samples / seconds, "seconds": seconds}, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
