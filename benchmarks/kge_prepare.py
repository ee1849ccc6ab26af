"""Preparation throughput: TSV (plain and gzip) and id files of a synthetic graph into
prepared folders, in triples per second, with each phase's time and the peak memory.

The graph is written first (`shoal kge synthesize --tsv`-style, not timed); each input
is then prepared in a fresh process (`--child`), whose peak resident memory
(ru_maxrss) is the preparation's alone. Every phase is timed from the progress
reports: reading (parse, renumber, write), degrees, the filter index, checksums.

`--source LABEL=PATH` (repeatable) prepares with the shoal of another source tree
(its `src`, put first on PYTHONPATH), the trees alternating within each of `--rounds`:
before and after a change in one run, under the same load. Their prepared folders
are then compared file by file (every array and name file, byte for byte).

    ../shared/tools/one-at-a-time .venv/bin/python benchmarks/kge_prepare.py \
        [--entities 1000000] [--triples 4000000] [--keep /tmp/kge-prepare]
    git archive main src | tar -x -C /tmp/main-src
    ../shared/tools/one-at-a-time .venv/bin/python benchmarks/kge_prepare.py \
        --source before=/tmp/main-src/src --source after=src --rounds 2 --inputs tsv
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

INPUTS = ("tsv", "tsv.gz", "ids")


def child(kind: str, folder: Path, out: Path) -> None:
    import shoal
    from shoal.tasks.kge.prepared.progress import PrepareProgress
    from shoal.tasks.kge.prepared.sources import prepare_ids, prepare_tsv

    phases: list[tuple[str, float]] = []

    class Timed(PrepareProgress):
        def phase(self, name: str, total: int | None = None) -> None:
            phases.append((name, time.perf_counter()))
            super().phase(name, total)

    suffix = {"tsv": ".txt", "tsv.gz": ".txt.gz", "ids": ".ids"}[kind]
    files = {s: folder / f"{s}{suffix}" for s in ("train", "valid", "test")}
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
                "shoal": str(Path(shoal.__file__).parent),
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


def _identical(folders: list[Path]) -> bool:
    """Whether the folders hold the same arrays and names, byte for byte (the manifest,
    which records paths and times, left out)."""

    def contents(folder: Path) -> dict[str, bytes]:
        return {
            p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix in (".npy", ".bin")
        }

    first = contents(folders[0])
    return all(contents(other) == first for other in folders[1:])


def _prepare(kind: str, folder: Path, label: str, source: str | None) -> dict[str, object]:
    out = folder / f"prepared-{kind}-{label}"
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(Path(source).resolve())
    done = subprocess.run(
        [sys.executable, __file__, "--child", kind, str(folder), str(out)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return {"source": label, **json.loads(done.stdout)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=1_000_000)
    parser.add_argument("--triples", type=int, default=4_000_000)
    parser.add_argument("--keep", help="folder for the inputs and outputs (kept)")
    parser.add_argument(
        "--source", action="append", default=[], help="LABEL=PATH of a shoal src tree"
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--inputs", default=",".join(INPUTS), help="of tsv, tsv.gz, ids")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]), Path(args.child[2]))
        return
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kge-prepare-"))
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "train.ids").exists():
        started = time.perf_counter()
        write_inputs(folder, args.entities, args.triples)
        print(f"inputs written in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    sources = [item.split("=", 1) for item in args.source] or [["this", None]]
    for kind in args.inputs.split(","):
        for _ in range(args.rounds):
            for label, source in sources:
                print(json.dumps(_prepare(kind, folder, label, source)), flush=True)
        if len(sources) > 1:
            folders = [folder / f"prepared-{kind}-{label}" for label, _ in sources]
            print(json.dumps({"input": kind, "identical": _identical(folders)}), flush=True)
    if not args.keep:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
