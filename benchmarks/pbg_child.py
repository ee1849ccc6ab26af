"""PyTorch-BigGraph's side of `kge_vs_pbg.py`: import, train, export; runs in PBG's own venv.

PBG 1.0.0 wants its own environment (`make bench-pbg` creates `.venv-pbg`; see
`kge_vs_pbg.py`), so this file imports nothing from shoal and the benchmark runs it
as a child process:

    .venv-pbg/bin/python benchmarks/pbg_child.py SETTINGS.json REPORT.json

SETTINGS.json names the TSV files, the work folder and PBG's config values; this
converts the TSV files with PBG's own importer (cached per relation mode), trains
with PBG's `train()` on a Hogwild pool of `workers` processes, reads the trained
tables back from PBG's checkpoint files (h5) and writes them, with their labels, as
`tables.npz` for shoal's evaluator. REPORT.json gets the training times PBG logs
("Processed N edges in T s", the Hogwild phase of each epoch) and the wall time of
the whole `train()` call; with `run_crosscheck`, also PBG's own filtered ranking of
the first `crosscheck` test triples (dynamic relations only: its evaluator needs
them), to check the export against shoal's evaluator.

A prepared graph instead (settings `prepared`: a folder of `shoal kge synthesize`, whose
`train.npy` NumPy reads without shoal): `--import-only` writes the first `train_edges`
training triples (all when null) into PBG's partitioned edge files once, in its own
process so its memory is not counted against training; entity e goes to partition
pos[e] % P at offset pos[e] // P, pos a seeded permutation (as PBG's importer places
entities at random), relations dynamic. Training then reads them, and with `export`,
`--export-only` writes the tables back in shoal's id order, also in a process of its
own (`entity_pos.npy` inverts the placement).

Python 3.11 shim: `torchbiggraph.schema.unpack_optional` tests `type_ is
Optional[arg]`, but `typing` caches subscripted types in an LRU cache of 128
entries, so once enough typing objects were built the two are equal but not
identical and loading a config fails with `Unknown type: typing.Optional[float]`.
`apply_schema_shim` compares them by equality; it runs here and, through PBG's
`SubprocessInitializer`, in every process PBG spawns.
"""

from __future__ import annotations

import gzip
import json
import logging
import re
import shutil
import sys
import time
import typing
from pathlib import Path
from typing import Any


def _unpack_optional_by_equality(type_: Any) -> Any:
    try:
        candidate = type_.__args__[0]
    except (AttributeError, LookupError):
        raise TypeError("Not an optional type") from None
    if type_ != typing.Optional[candidate]:  # noqa: UP045 (the type PBG's schema uses)
        raise TypeError("Not an optional type")
    return candidate


def apply_schema_shim() -> None:
    """Make PBG's config schema loader work on Python 3.11 (see the module docstring)."""
    import torchbiggraph.schema

    torchbiggraph.schema.unpack_optional = _unpack_optional_by_equality  # type: ignore[attr-defined]


SPLITS = ("train", "valid", "test")


def import_tsv(settings: dict[str, Any], entity_path: Path) -> dict[str, Path]:
    """PBG's importer on the training file (entities and relation types from training only,
    as shoal gives ids), then valid/test/crosscheck edges through the same dictionaries."""
    from torchbiggraph.converters import import_from_tsv as importer
    from torchbiggraph.graph_storages import (
        EDGE_STORAGES,
        ENTITY_STORAGES,
        RELATION_TYPE_STORAGES,
    )

    config = pbg_config(settings, entity_path, [], Path("unused"))
    tsv = {s: entity_path / f"{s}.tsv" for s in SPLITS}
    edges = {s: entity_path / f"{s}_partitioned" for s in (*SPLITS, "crosscheck")}
    if (entity_path / "imported").exists():
        return edges
    entity_path.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        with gzip.open(settings["data"][split], "rt") as src:
            tsv[split].write_text(src.read())
    lines = tsv["test"].read_text().splitlines(keepends=True)
    tsv["crosscheck"] = entity_path / "crosscheck.tsv"
    tsv["crosscheck"].write_text("".join(lines[: max(settings["crosscheck"], 1)]))
    dynamic = config.dynamic_relations
    columns = {"lhs_col": 0, "rel_col": 1, "rhs_col": 2}
    relation_types = importer.collect_relation_types(
        config.relations, [tsv["train"]], dynamic, 1, 1
    )
    entities = importer.collect_entities_by_type(
        relation_types,
        config.entities,
        config.relations,
        [tsv["train"]],
        dynamic,
        entity_min_count=1,
        **columns,
    )
    importer.generate_entity_path_files(
        ENTITY_STORAGES.make_instance(str(entity_path)),
        entities,
        RELATION_TYPE_STORAGES.make_instance(str(entity_path)),
        relation_types,
        dynamic,
    )
    for split, out in edges.items():
        importer.generate_edge_path_files(
            tsv[split],
            out,
            EDGE_STORAGES.make_instance(str(out)),
            entities,
            relation_types,
            config.relations,
            dynamic,
            **columns,
        )
    (entity_path / "imported").write_text("done\n")
    return edges


PREPARED_BLOCK = 1 << 22


def prepared_edges_path(settings: dict[str, Any]) -> Path:
    """PBG's import of a prepared graph, cached beside it per partitions and edge count."""
    edges = settings["train_edges"] or "all"
    return Path(settings["prepared"]) / f"pbg-{settings['partitions']}p-{edges}e"


def import_prepared(settings: dict[str, Any]) -> Path:
    """Entity counts, placement and bucketed training edges of a prepared graph, in PBG's
    file formats (h5 edges with `lhs`, `rhs`, `rel`); the folder (see the module docstring)."""
    import h5py
    import numpy as np
    from torchbiggraph.graph_storages import FORMAT_VERSION, FORMAT_VERSION_ATTR

    folder = prepared_edges_path(settings)
    if (folder / "imported").exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    edges_dir = folder / "train_partitioned"
    edges_dir.mkdir(parents=True)
    manifest = json.loads((Path(settings["prepared"]) / "manifest.json").read_text())
    entities, parts = int(manifest["entities"]), settings["partitions"]
    pos = np.random.default_rng(0).permutation(entities)
    np.save(folder / "entity_pos.npy", pos)
    for p in range(parts):
        (folder / f"entity_count_all_{p}.txt").write_text(f"{len(range(p, entities, parts))}\n")
    (folder / "dynamic_rel_count.txt").write_text(f"{manifest['relations']}\n")
    train = np.load(Path(settings["prepared"]) / "train.npy", mmap_mode="r")
    total = len(train) if settings["train_edges"] is None else settings["train_edges"]
    files = {}
    for lhs_p in range(parts):
        for rhs_p in range(parts):
            hf = h5py.File(edges_dir / f"edges_{lhs_p}_{rhs_p}.h5", "w")
            hf.attrs[FORMAT_VERSION_ATTR] = FORMAT_VERSION
            for name in ("lhs", "rhs", "rel"):
                hf.create_dataset(name, (0,), "int64", maxshape=(None,), chunks=(1 << 16,))
            files[lhs_p, rhs_p] = hf
    for start in range(0, total, PREPARED_BLOCK):
        block = np.asarray(train[start : min(start + PREPARED_BLOCK, total)])
        head, tail = pos[block[:, 0]], pos[block[:, 2]]
        bucket = (head % parts) * parts + tail % parts
        order = np.argsort(bucket, kind="stable")
        bounds = np.searchsorted(bucket[order], np.arange(parts * parts + 1))
        for b in range(parts * parts):
            rows = order[bounds[b] : bounds[b + 1]]
            hf = files[divmod(b, parts)]
            for name, values in (
                ("lhs", head[rows] // parts),
                ("rhs", tail[rows] // parts),
                ("rel", block[rows, 1]),
            ):
                dataset = hf[name]
                dataset.resize((len(dataset) + len(rows),))
                dataset[len(dataset) - len(rows) :] = values
    for hf in files.values():
        hf.close()
    (folder / "imported").write_text(f"{total} edges\n")
    return folder


def export_partitioned(checkpoint: Path, folder: Path, out: Path, parts: int) -> None:
    """The partitioned entity table in shoal's id order, and the relation operators."""
    import h5py
    import numpy as np

    version = int((checkpoint / "checkpoint_version.txt").read_text().strip())
    pos = np.load(folder / "entity_pos.npy")
    at = np.argsort(pos)  # the entity at each position
    table = None
    for p in range(parts):
        with h5py.File(checkpoint / f"embeddings_all_{p}.v{version}.h5", "r") as hf:
            rows = np.asarray(hf["embeddings"][...])
        if table is None:
            table = np.empty((len(pos), rows.shape[1]), dtype=rows.dtype)
        table[at[p::parts]] = rows
    with h5py.File(checkpoint / f"model.v{version}.h5", "r") as hf:
        rhs = np.asarray(hf["model/relations/0/operator/rhs/translations"][...])
        lhs = np.asarray(hf["model/relations/0/operator/lhs/translations"][...])
    np.savez(out, entity=table, rhs_translation=rhs, lhs_translation=lhs)


def relation_labels(settings: dict[str, Any]) -> list[str]:
    """The relation labels of the training file, sorted (static mode: one PBG relation each)."""
    labels = set()
    with gzip.open(settings["data"]["train"], "rt") as src:
        for line in src:
            parts = line.split()
            if len(parts) == 3:
                labels.add(parts[1])
    return sorted(labels)


def pbg_config(
    settings: dict[str, Any], entity_path: Path, edge_paths: list[Path], checkpoint: Path
) -> Any:
    from torchbiggraph.config import ConfigSchema

    operator = settings["operator"]
    dynamic = settings["dynamic_relations"] or "prepared" in settings
    if dynamic:
        relations = [{"name": "all", "lhs": "all", "rhs": "all", "operator": operator}]
    else:
        relations = [
            {"name": label, "lhs": "all", "rhs": "all", "operator": operator}
            for label in relation_labels(settings)
        ]
    return ConfigSchema.from_dict(
        {
            "entity_path": str(entity_path),
            "edge_paths": [str(p) for p in edge_paths],
            "checkpoint_path": str(checkpoint),
            "entities": {"all": {"num_partitions": settings.get("partitions", 1)}},
            "relations": relations,
            "dynamic_relations": dynamic,
            "dimension": settings["dim"],
            "init_scale": settings["init_scale"],
            "global_emb": False,
            "comparator": settings["comparator"],
            "loss_fn": settings["loss_fn"],
            "margin": settings["margin"],
            "lr": settings["lr"],
            "num_epochs": settings["epochs"],
            "batch_size": settings["batch_size"],
            "num_batch_negs": 0,
            "num_uniform_negs": settings["negatives_per_side"],
            "workers": settings["workers"],
            "eval_fraction": 0.0,
            "hogwild_delay": 0.0,
        }
    )


class TrainingTimes(logging.Handler):
    """Collects the Hogwild phase of each epoch from PBG's log ("Processed N edges in T s")."""

    PATTERN = re.compile(r"Processed (\d+) edges in ([0-9.]+) s")

    def __init__(self) -> None:
        super().__init__()
        self.epochs: list[tuple[int, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = self.PATTERN.search(record.getMessage())
        if found:
            self.epochs.append((int(found.group(1)), float(found.group(2))))


def export_tables(checkpoint: Path, entity_path: Path, out: Path, dynamic: bool) -> list[str]:
    """Entity rows and relation operator parameters from PBG's checkpoint (h5), with labels."""
    import h5py
    import numpy as np

    version = int((checkpoint / "checkpoint_version.txt").read_text().strip())
    with h5py.File(checkpoint / f"embeddings_all_0.v{version}.h5", "r") as hf:
        entity = np.asarray(hf["embeddings"][...])
    parameters: dict[str, np.ndarray] = {}
    with h5py.File(checkpoint / f"model.v{version}.h5", "r") as hf:
        hf["model"].visititems(
            lambda name, item: (
                parameters.__setitem__(name, np.asarray(item[...]))
                if isinstance(item, h5py.Dataset)
                else None
            )
        )
    names = json.loads((entity_path / "entity_names_all_0.json").read_text())
    if dynamic:
        relations = json.loads((entity_path / "dynamic_rel_names.json").read_text())
        rhs = parameters["relations/0/operator/rhs/translations"]
        lhs = parameters["relations/0/operator/lhs/translations"]
    else:
        config = json.loads((checkpoint / "config.json").read_text())
        relations = [r["name"] for r in config["relations"]]
        rhs = np.stack(
            [parameters[f"relations/{i}/operator/rhs/translation"] for i in range(len(relations))]
        )
        lhs = None
    np.savez(
        out,
        entity=entity,
        entity_names=np.array(names),
        relation_names=np.array(relations),
        rhs_translation=rhs,
        **({"lhs_translation": lhs} if lhs is not None else {}),
    )
    return sorted(parameters)


def crosscheck(settings: dict[str, Any], config: Any, edges: dict[str, Path], init: Any) -> Any:
    """PBG's own filtered ranking (all negatives) of the crosscheck triples."""
    import attr
    from torchbiggraph.eval import do_eval_and_report_stats
    from torchbiggraph.filtered_eval import FilteredRankingEvaluator

    relations = [attr.evolve(r, all_negs=True) for r in config.relations]
    eval_config = attr.evolve(
        config, edge_paths=[str(edges["crosscheck"])], relations=relations, num_uniform_negs=0
    )
    filters = [str(edges[s]) for s in SPLITS]
    evaluator = FilteredRankingEvaluator(eval_config, filters)
    *_, (_, _, stats) = do_eval_and_report_stats(eval_config, None, evaluator, init)
    flat = stats.to_dict()
    return {"count": flat["count"], **flat["metrics"]}


def checkpoint_of(settings: dict[str, Any]) -> Path:
    return Path(settings["work"]) / f"pbg-checkpoint-{settings['name']}"


def tables_of(settings: dict[str, Any]) -> Path:
    return Path(settings["work"]) / f"pbg-tables-{settings['name']}.npz"


def export_prepared(settings: dict[str, Any]) -> None:
    """`--export-only`: the trained tables of a prepared graph, then the checkpoint removed
    (gigabytes at scale)."""
    checkpoint = checkpoint_of(settings)
    folder = prepared_edges_path(settings)
    export_partitioned(checkpoint, folder, tables_of(settings), settings["partitions"])
    shutil.rmtree(checkpoint, ignore_errors=True)


def main(settings_path: Path, report_path: Path, phase: str = "train") -> None:
    """`phase`: train; import (a prepared graph's edge files, before training); export
    (its tables, after training): separate processes, so training's memory is its own."""
    apply_schema_shim()
    from torchbiggraph.train import train
    from torchbiggraph.util import SubprocessInitializer, setup_logging

    settings = json.loads(settings_path.read_text())
    setup_logging()
    work = Path(settings["work"])
    if "prepared" in settings:
        if phase == "export":
            export_prepared(settings)
            return
        entity_path = import_prepared(settings)
        edges = {"train": entity_path / "train_partitioned"}
        if phase == "import":
            return
    else:
        mode = "dynamic" if settings["dynamic_relations"] else "static"
        entity_path = work / f"pbg-data-{mode}"
        edges = import_tsv(settings, entity_path)
    checkpoint = checkpoint_of(settings)
    shutil.rmtree(checkpoint, ignore_errors=True)  # PBG would resume from an old one
    config = pbg_config(settings, entity_path, [edges["train"]], checkpoint)
    init = SubprocessInitializer()
    init.register(apply_schema_shim)
    init.register(setup_logging, 0)
    times = TrainingTimes()
    logging.getLogger("torchbiggraph").addHandler(times)
    started = time.perf_counter()
    train(config, subprocess_init=init)
    wall = time.perf_counter() - started
    trained = sum(n for n, _ in times.epochs)
    seconds = sum(s for _, s in times.epochs)
    report: dict[str, Any] = {
        "triples_per_s": trained / seconds,
        "train_s": seconds,
        "epochs_s": [s for _, s in times.epochs],
        "train_call_wall_s": wall,
        "tables": str(tables_of(settings)),
    }
    if "prepared" in settings:
        if not settings["export"]:
            shutil.rmtree(checkpoint, ignore_errors=True)  # gigabytes at scale
    else:
        report["checkpoint_parameters"] = export_tables(
            checkpoint, entity_path, Path(report["tables"]), settings["dynamic_relations"]
        )
    if settings["run_crosscheck"] and settings["dynamic_relations"]:
        started = time.perf_counter()
        report["crosscheck"] = crosscheck(settings, config, edges, init)
        report["crosscheck"]["pbg_eval_s"] = time.perf_counter() - started
    report_path.write_text(json.dumps(report))


if __name__ == "__main__":
    phases = {"--import-only": "import", "--export-only": "export"}
    main(Path(sys.argv[1]), Path(sys.argv[2]), phases.get(" ".join(sys.argv[3:]), "train"))
