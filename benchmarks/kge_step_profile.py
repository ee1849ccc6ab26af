"""A parameter-server worker's compute alone, at kge_vs_pbg.py's settings: time and torch ops.

What `ps_profile.py` calls forward and backward, without the servers: one worker's
share of a step (`--batch-size` training triples of FB15k-237, `2 *
--negatives-per-side` uniform negatives on one side, shared by chunks of
`--negatives-per-side`), scored by shoal's `score_batch` on a TransE whose rows are
read as a parameter-server worker reads them (leaf tensors of the unique pulled rows,
found by `searchsorted`), margin ranking loss, backward into the leaves. One torch
thread. Prints the mean step time and torch.profiler's table by self CPU time.

    .venv/bin/python benchmarks/kge_step_profile.py [--steps 50] [kge_vs_pbg.py's flags]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kge_vs_pbg import build_parser, finish_args, load_data


class PulledRows:
    """The rows of one step as `ServedRows` holds them: sorted unique ids and a leaf each."""

    def __init__(self) -> None:
        self.batch: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def rows(self, table: str, ids: torch.Tensor) -> torch.Tensor:
        pulled, leaf = self.batch[table]
        return leaf[torch.searchsorted(pulled, ids.contiguous())]


def main() -> None:
    from shoal.tasks.kge.config import MarginRankingLossConfig, TransEConfig
    from shoal.tasks.kge.losses import kge_loss
    from shoal.tasks.kge.models import TransE
    from shoal.tasks.kge.task import score_batch

    parser = build_parser(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="steps timed (after 10 warm-up)")
    args = finish_args(parser.parse_args())
    torch.set_num_threads(1)
    data = load_data()
    train = data.train
    entities, relations = len(data.entities), len(data.relations)
    tables = {
        "entity": torch.randn(entities, args.dim),
        "relation": torch.randn(relations, args.dim),
    }
    model = TransE(TransEConfig(p=2, normalize_entities=False), entities, relations, args.dim)
    source = PulledRows()
    model.serve_tables(source)
    loss_config = MarginRankingLossConfig(margin=args.margin)
    chunk, n = args.negatives_per_side, args.batch_size
    generator = torch.Generator().manual_seed(args.seed)

    def batch() -> tuple[torch.Tensor, ...]:
        triples = train[torch.randint(len(train), (n,), generator=generator)]
        negatives = torch.randint(entities, (-(-n // chunk), 2 * chunk), generator=generator)
        return triples, torch.rand(n, generator=generator) < 0.5, negatives

    def step(triples: torch.Tensor, corrupt_head: torch.Tensor, negatives: torch.Tensor) -> Any:
        touched = torch.cat([triples[:, 0], triples[:, 2], negatives.reshape(-1)])
        for name, ids in (
            ("entity", torch.unique(touched)),
            ("relation", torch.unique(triples[:, 1])),
        ):
            source.batch[name] = (ids, tables[name][ids].requires_grad_(True))
        positive, negative, _ = score_batch(model, triples, corrupt_head, negatives, chunk)
        (kge_loss(loss_config, positive, negative).sum() / (args.workers * n)).backward()

    batches = [batch() for _ in range(args.steps + 10)]
    for b in batches[:10]:
        step(*b)
    started = time.perf_counter()
    for b in batches[10:]:
        step(*b)
    per_step = (time.perf_counter() - started) / args.steps
    print(f"{n} triples x {2 * chunk} negatives, dim {args.dim}: {1000 * per_step:.2f} ms per step")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for b in batches[10:30]:
            step(*b)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


if __name__ == "__main__":
    main()
