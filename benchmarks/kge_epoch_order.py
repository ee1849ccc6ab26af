"""A rank's memory for the epoch's order of the training triples, on a large prepared
graph: the peak resident memory (VmHWM) of a process that does what rank 1 of 4 does with
the order (the epoch's plan, then its share of a few global batches, read from the
mapped training triples), each source tree in a fresh process.

The graph is written once as a prepared folder (`shoal kge synthesize`; kept with
`--keep`). `--source LABEL=PATH` (repeatable) runs with the shoal of another source
tree (its `src`, put first on PYTHONPATH), alternating within each of `--rounds`.
Printed per run: the peak; at the end, the plan still held, the process's own
resident memory (anonymous) and the graph's pages it has mapped (file: shared by every
process of the machine, and reclaimable); the memory before the plan (the interpreter,
torch, the mapped graph's header); the plan's time; and a digest of the batches drawn
(equal digests: the same order).

    git archive main src | tar -x -C /tmp/main-src
    ../shared/tools/one-at-a-time .venv/bin/python benchmarks/kge_epoch_order.py \
        --triples 20000000 --keep /tmp/kge-order \
        --source before=/tmp/main-src/src --source after=src
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RANK, WORLD, BATCH, STEPS = 1, 4, 4096, 8


def _status_mib(field: str) -> float:
    """A memory figure of this process from /proc/self/status (VmRSS, VmHWM: its peak).
    Not ru_maxrss: that one starts at the parent's resident memory when it forked."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def child(folder: Path) -> None:
    import numpy as np

    import shoal
    from shoal.tasks.kge.prepared.graph import PreparedGraph
    from shoal.training.batching import EpochPlan, local_share

    graph = PreparedGraph.open(folder)
    train = graph.splits["train"]
    before = _status_mib("VmRSS")
    started = time.perf_counter()
    plan = EpochPlan(len(train), BATCH, epoch=0, seed=0)
    digest = hashlib.sha256()
    for step in range(STEPS):
        share = local_share(plan.global_batch(step), RANK, WORLD).numpy()
        digest.update(np.ascontiguousarray(train[np.sort(share)]).tobytes())
    seconds = time.perf_counter() - started
    print(
        json.dumps(
            {
                "shoal": str(Path(shoal.__file__).parent),
                "triples": len(train),
                "before_plan_mib": round(before, 1),
                "peak_mib": round(_status_mib("VmHWM"), 1),
                "anonymous_mib": round(_status_mib("RssAnon"), 1),
                "file_mib": round(_status_mib("RssFile"), 1),
                "plan_and_batches_s": round(seconds, 3),
                "batches_sha256": digest.hexdigest()[:16],
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=1_000_000)
    parser.add_argument("--triples", type=int, default=20_000_000)
    parser.add_argument("--keep", help="folder for the graph (kept)")
    parser.add_argument(
        "--source", action="append", default=[], help="LABEL=PATH of a shoal src tree"
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child))
        return
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kge-order-"))
    folder = root / f"graph-{args.entities}-{args.triples}"
    if not (folder / "manifest.json").exists():
        from shoal.tasks.kge.synthetic import SyntheticGraph, write_prepared

        started = time.perf_counter()
        recipe = SyntheticGraph(args.entities, 500, args.triples, seed=1)
        write_prepared(recipe, folder)
        print(f"graph written in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    sources = [item.split("=", 1) for item in args.source] or [["this", None]]
    for _ in range(args.rounds):
        for label, source in sources:
            env = dict(os.environ)
            if source is not None:
                env["PYTHONPATH"] = str(Path(source).resolve())
            done = subprocess.run(
                [sys.executable, __file__, "--child", str(folder)],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            print(json.dumps({"source": label, **json.loads(done.stdout)}), flush=True)
    if not args.keep:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
