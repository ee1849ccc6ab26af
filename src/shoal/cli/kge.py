"""`shoal kge prepare | verify | synthesize`: knowledge graphs as prepared folders.

`prepare` reads TSV triples (labels) or DGL-KE's udd_hrt id triples into a folder
of memory-mapped arrays (`tasks/kge/prepared/`) that `[task.data] prepared = ...`
trains from; `verify` checks every byte of a folder against its manifest;
`synthesize` writes a synthetic graph (`tasks/kge/synthetic.py`), prepared or as TSV.
A folder is written under a temporary name and renamed when complete, so an
interrupted command leaves no half-prepared graph behind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shoal.errors import EXIT_OK, ShoalError


def _progress() -> Any:
    from shoal.tasks.kge.prepared.progress import PrepareProgress

    return PrepareProgress("bar" if sys.stderr.isatty() else "plain")


def _into(output: Path, force: bool, write: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """Run `write` into a temporary folder beside `output`, then rename it into place."""
    occupied = any(output.iterdir()) if output.is_dir() else output.exists()
    if occupied and not force:
        raise ShoalError(f"{output}: already exists; choose another folder or pass --force")
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        manifest = write(temporary)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    if output.exists():
        shutil.rmtree(output) if output.is_dir() else output.unlink()
    os.rename(temporary, output)
    return manifest


def _summary(output: Path, manifest: dict[str, Any], seconds: float) -> str:
    splits = manifest["splits"]
    total = sum(split["triples"] for split in splits.values())
    parts = ", ".join(f"{name} {split['triples']}" for name, split in splits.items())
    unseen = sum(split["unseen"] for split in splits.values())
    skipped = (
        f"; {unseen} held-out triples name labels absent from training (left out)" if unseen else ""
    )
    return (
        f"{output}: {manifest['entities']} entities, {manifest['relations']} relations, "
        f"{parts} triples{skipped}; prepared in {seconds:.1f} s ({total / max(seconds, 1e-9):,.0f} "
        "triples/s)"
    )


def _prepare(args: argparse.Namespace) -> int:
    from shoal.tasks.kge.prepared.sources import prepare_ids, prepare_tsv

    files = {"train": Path(args.train)}
    for split in ("valid", "test"):
        if getattr(args, split):
            files[split] = Path(getattr(args, split))
    files = {name: path.resolve() for name, path in files.items()}
    if args.format == "tsv" and (args.entities or args.relations):
        raise ShoalError("--entities and --relations name the ids of --format ids; remove them")
    progress = _progress()
    started = time.perf_counter()
    try:
        if args.format == "tsv":
            manifest = _into(
                Path(args.output), args.force, lambda folder: prepare_tsv(files, folder, progress)
            )
        else:
            names = [Path(p).resolve() if p else None for p in (args.entities, args.relations)]
            manifest = _into(
                Path(args.output),
                args.force,
                lambda folder: prepare_ids(files, folder, progress, names[0], names[1]),
            )
    finally:
        progress.close()
    print(_summary(Path(args.output), manifest, time.perf_counter() - started))
    return EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    from shoal.tasks.kge.prepared.manifest import read_manifest, verify_checksums

    folder = Path(args.folder)
    manifest = read_manifest(folder)
    verify_checksums(folder, manifest)
    total = sum(entry["bytes"] for entry in manifest["files"].values())
    print(f"{folder}: {len(manifest['files'])} files, {total:,} bytes match manifest.json")
    return EXIT_OK


def _synthesize(args: argparse.Namespace) -> int:
    from shoal.tasks.kge.synthetic import SyntheticGraph, write_prepared, write_tsv

    try:
        graph = SyntheticGraph(
            entities=args.entities,
            relations=args.relations,
            triples=args.triples,
            clusters=args.clusters,
            exponent=args.exponent,
            held_out=args.held_out,
            seed=args.seed,
        )
    except ValueError as exc:
        raise ShoalError(f"shoal kge synthesize: {exc}") from None
    started = time.perf_counter()
    output = Path(args.output)
    if args.tsv:
        paths = _into(output, args.force, lambda folder: {"files": write_tsv(graph, folder)})
        names = ", ".join(path.name for path in paths["files"].values())
        print(
            f"{output}: {names} ({args.triples} triples) in {time.perf_counter() - started:.1f} s"
        )
        return EXIT_OK
    progress = _progress()
    try:
        manifest = _into(output, args.force, lambda folder: write_prepared(graph, folder, progress))
    finally:
        progress.close()
    print(_summary(output, manifest, time.perf_counter() - started))
    return EXIT_OK


def add_kge_commands(commands: Any) -> None:
    """`shoal kge ...` on the CLI's subcommands."""
    kge = commands.add_parser("kge", help="prepare, verify or synthesize knowledge graphs")
    actions = kge.add_subparsers(dest="kge_command", required=True, metavar="ACTION")

    prepare = actions.add_parser(
        "prepare",
        help="turn triples files into a prepared folder ([task.data] prepared = FOLDER)",
    )
    prepare.add_argument("output", metavar="FOLDER", help="folder to write")
    prepare.add_argument("--train", required=True, help="training triples (.gz is fine)")
    prepare.add_argument("--valid", help="validation triples")
    prepare.add_argument("--test", help="test triples")
    prepare.add_argument(
        "--format",
        choices=("tsv", "ids"),
        default="tsv",
        help="tsv: head<TAB>relation<TAB>tail labels (ids in sorted label order); ids: "
        "integer ids, as DGL-KE's udd_hrt",
    )
    prepare.add_argument("--entities", help="--format ids: id<TAB>name file (DGL-KE entities.dict)")
    prepare.add_argument("--relations", help="--format ids: id<TAB>name file (relations.dict)")
    prepare.add_argument("--force", action="store_true", help="replace FOLDER if it exists")
    prepare.set_defaults(handler=_prepare)

    verify = actions.add_parser(
        "verify", help="check every byte of a prepared folder against its manifest"
    )
    verify.add_argument("folder", metavar="FOLDER")
    verify.set_defaults(handler=_verify)

    synthesize = actions.add_parser(
        "synthesize",
        help="write a synthetic graph with power-law degrees and learnable structure",
    )
    synthesize.add_argument("output", metavar="FOLDER", help="folder to write")
    synthesize.add_argument("--entities", type=int, required=True)
    synthesize.add_argument("--relations", type=int, required=True)
    synthesize.add_argument("--triples", type=int, required=True, help="all splits together")
    synthesize.add_argument("--clusters", type=int, default=64, help="entity clusters (64)")
    synthesize.add_argument(
        "--exponent", type=float, default=1.1, help="power law of degrees and relations (1.1)"
    )
    synthesize.add_argument(
        "--held-out", type=float, default=0.01, help="share of triples each for valid and test"
    )
    synthesize.add_argument("--seed", type=int, default=0)
    synthesize.add_argument("--tsv", action="store_true", help="write TSV files, not prepared")
    synthesize.add_argument("--force", action="store_true", help="replace FOLDER if it exists")
    synthesize.set_defaults(handler=_synthesize)
