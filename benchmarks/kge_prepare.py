"""Preparation throughput: TSV (plain and gzip) and id files of a synthetic graph into
prepared folders, in triples per second, with each phase's time and the peak memory.

The graph is written first (`shoal kge synthesize --tsv`-style, not timed); each input
is then prepared in a fresh process (`--child`), whose peak resident memory
(ru_maxrss) is the preparation's alone. Every phase is timed from the progress
reports: reading (parse, renumber, write), degrees, the filter index, checksums.

    ../shared/tools/one-at-a-time .venv/bin/python benchmarks/kge_prepare.py \
        [--entities 1000000] [--triples 4000000] [--keep /tmp/kge-prepare]
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

INPUTS = ("tsv", "tsv.gz", "ids")


def child(kind: str, folder: Path) -> None:
    from shoal.tasks.kge.prepared.progress import PrepareProgress
    from shoal.tasks.kge.prepared.sources import prepare_ids, prepare_tsv

    phases: list[tuple[str, float]] = []

    class Timed(PrepareProgress):
        def phase(self, name: str, total: int | None = None) -> None:
            phases.append((name, time.perf_counter()))
            super().phase(name, total)

    suffix = {"tsv": ".txt", "tsv.gz": ".txt.gz", "ids": ".ids"}[kind]
    files = {s: folder / f"{s}{suffix}" for s in ("train", "valid", "test")}
    out = folder / f"prepared-{kind}"
    started = time.perf_counter()
    if kind == "ids":
        manifest = prepare_ids(files, out, Timed())
    else:
        manifest = prepare_tsv(files, out, Timed())
    seconds = time.perf_counter() - started
    ends = [when for _, when in phases[1:]] + [started + seconds]
    steps: dict[str, float] = {}
    for (name, when), end in zip(phases, ends, strict=True):
        key = "reading" if name.startswith("reading") or name == "numbering labels" else name
        steps[key] = steps.get(key, 0.0) + end - when
    triples = sum(s["triples"] for s in manifest["splits"].values())
    size = sum(f.stat().st_size for f in files.values())
    print(
        json.dumps(
            {
                "input": kind,
                "triples": triples,
                "entities": manifest["entities"],
                "input_mb": size / 1e6,
                "s": seconds,
                "triples_per_s": triples / seconds,
                "phases_s": steps,
                "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def write_inputs(folder: Path, entities: int, triples: int) -> None:
    from shoal.tasks.kge.synthetic import SyntheticGraph, write_tsv

    graph = SyntheticGraph(entities=entities, relations=500, triples=triples, seed=1)
    paths = write_tsv(graph, folder)
    for name, path in paths.items():
        with open(path, "rb") as raw, gzip.open(folder / f"{name}.txt.gz", "wb", 1) as packed:
            shutil.copyfileobj(raw, packed)
        with open(folder / f"{name}.ids", "wb") as ids:
            for triples_block, split in graph.blocks():
                rows = triples_block[split == ("train", "valid", "test").index(name)]
                ids.write("".join(f"{h}\t{r}\t{t}\n" for h, r, t in rows.tolist()).encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=1_000_000)
    parser.add_argument("--triples", type=int, default=4_000_000)
    parser.add_argument("--keep", help="folder for the inputs and outputs (kept)")
    parser.add_argument("--child", nargs=2, metavar=("INPUT", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kge-prepare-"))
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "train.ids").exists():
        started = time.perf_counter()
        write_inputs(folder, args.entities, args.triples)
        print(f"inputs written in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    for kind in INPUTS:
        shutil.rmtree(folder / f"prepared-{kind}", ignore_errors=True)
        done = subprocess.run(
            [sys.executable, __file__, "--child", kind, str(folder)],
            capture_output=True,
            text=True,
            check=True,
        )
        print(done.stdout.strip())
    if not args.keep:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
