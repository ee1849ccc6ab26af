"""A parameter-server worker's compute alone, at kge_vs_pbg.py's settings: time and torch ops.

What `ps_profile.py` calls forward and backward, without the servers: one worker's
share of a step (`--batch-size` training triples of FB15k-237, `2 *
--negatives-per-side` uniform negatives on one side chosen per positive, shared by
chunks of `--negatives-per-side`), through the KGE task's own batch and loss (the
config kge_vs_pbg.py gives shoal), on a TransE whose rows are read as a
parameter-server worker reads them (leaf tensors of the unique pulled rows), margin
ranking loss, backward into the leaves. One torch thread. Prints the mean step time
and torch.profiler's table by self CPU time.

    .venv/bin/python benchmarks/kge_step_profile.py [--steps 50] [kge_vs_pbg.py's flags]
    .venv/bin/python benchmarks/kge_step_profile.py --source /tmp/old/src   # another tree
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
if "--source" in sys.argv:  # measure another source tree (before torch and shoal load)
    sys.path.insert(0, sys.argv[sys.argv.index("--source") + 1])

import torch
from kge_vs_pbg import DATA, build_parser, finish_args
from torch.profiler import ProfilerActivity, profile


class PulledRows:
    """The rows of one step as `ServedRows` holds them: sorted unique ids and a leaf each."""

    def __init__(self) -> None:
        self.batch: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def rows(self, table: str, ids: torch.Tensor) -> torch.Tensor:
        pulled, leaf = self.batch[table]
        if ids.shape == pulled.shape and torch.equal(ids, pulled):
            return leaf
        return leaf.index_select(0, torch.searchsorted(pulled, ids.contiguous()))


def build_task(args: Any, folder: Path) -> Any:
    """The KGE task of kge_vs_pbg.py's shoal side, in this process (rank 0 of one)."""
    from shoal.launch.plan import create_run, plan_job
    from shoal.runtime.context import WorkerContext
    from shoal.shape.hosts import Hosts
    from shoal.tasks.kge.task import KGETask

    job = {
        "task": {
            "type": "kge",
            "dim": args.dim,
            "data": {s: str(DATA / f"{s}.txt.gz") for s in ("train", "valid", "test")},
            "model": {"type": "transe", "p": 2, "normalize_entities": False},
            "negatives": {
                "num_negatives": 2 * args.negatives_per_side,
                "chunk_size": args.negatives_per_side,
                "side": "uniform",
            },
            "loss": {"kind": "margin_ranking", "margin": args.margin},
        },
        "strategy": {"type": "local"},
        "train": {"batch_size": args.batch_size, "seed": args.seed, "epochs": 1},
        "run": {"dir": str(folder), "name": "profile"},
    }
    plan = plan_job(job)
    ctx = WorkerContext(
        config=plan.config, paths=create_run(plan), rank=0, world_size=1, local_rank=0,
        local_world_size=1, device=torch.device("cpu"), backend=None,
        launch_mode="inprocess", log=logging.getLogger("profile"), hosts=Hosts.single(1),
    )  # fmt: skip
    return KGETask(ctx)


def main() -> None:
    parser = build_parser(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="steps timed (after 10 warm-up)")
    parser.add_argument("--source", default=None, help="a shoal src folder to measure")
    args = finish_args(parser.parse_args())
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        task = build_task(args, Path(folder))
        with torch.device("meta"):
            model = task.build_model()
        tables = {
            "entity": torch.randn(task.num_entities, args.dim),
            "relation": torch.randn(task.num_relations, args.dim),
        }
        source = PulledRows()
        model.serve_tables(source)
        task.set_epoch(0)
        order = torch.randperm(task.train_size, generator=torch.Generator().manual_seed(0))
        n = args.batch_size

        def step(index: int) -> None:
            batch = task.train_batch(order[index * n : (index + 1) * n])
            entity_ids, relation_ids = task.rows_touched(batch)
            for name, ids in (("entity", entity_ids), ("relation", relation_ids)):
                source.batch[name] = (ids, tables[name][ids].requires_grad_(True))
            out = task.loss(model, batch)
            (out.loss_sum / (args.workers * n)).backward()

        for index in range(10):
            step(index)
        started = time.perf_counter()
        for index in range(10, 10 + args.steps):
            step(index)
        per_step = (time.perf_counter() - started) / args.steps
        chunk = args.negatives_per_side
        import shoal

        print(f"{n} triples x {2 * chunk} negatives, dim {args.dim}: "
              f"{1000 * per_step:.2f} ms per step ({Path(shoal.__file__).parent})")  # fmt: skip
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for index in range(10, 30):
                step(index)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


if __name__ == "__main__":
    main()
