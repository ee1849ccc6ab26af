"""Every rule the config alone decides is refused by `shoal config validate`: one line,
`file:line: field: message`, exit 2, before any worker could start.

Rules that span sections live in the sections' `check` (and the job's shape); these are
the ones that were once first found inside a worker or at plan time, and the refusals of
a strategy that needs a capability its task lacks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shoal.cli.main import main

KGE = (
    '[task]\ntype = "kge"\ndim = 8\nmodel = { type = "distmult" }\n'
    "negatives = { num_negatives = 4, chunk_size = 8 }\n"
    '[task.data]\ntrain = "triples.tsv"\n'
)
LM = '[task]\ntype = "lm"\n[task.data]\ntrain = "text.txt"\n[task.model]\ndim = 16\nheads = 2\nlayers = 2\ncontext = 8\n'
CLASSIFICATION = '[task]\ntype = "classification"\n'
TRAIN = "[train]\nepochs = 1\nbatch_size = {batch}\n"

#: (name, task, train batch, extra sections, field named, message fragment)
RULES = [
    (
        "min_workers on a strategy that cannot shrink",
        CLASSIFICATION,
        32,
        '[strategy]\ntype = "local"\n[faults]\nmin_workers = 1\n',
        "faults.min_workers",
        "strategy 'local' cannot go on with fewer workers",
    ),
    (
        "min_workers above the workers",
        CLASSIFICATION,
        32,
        '[strategy]\ntype = "data_parallel"\nnum_replicas = 2\n[faults]\nmin_workers = 3\n',
        "faults.min_workers",
        "3 is more than the job's 2 workers",
    ),
    (
        "a KGE chunk larger than the batch",
        KGE,
        4,
        "",
        "task.negatives.chunk_size",
        "8 exceeds train.batch_size (4)",
    ),
    (
        "sparse gradients under a strategy that reduces dense ones",
        KGE.replace('type = "kge"\n', 'type = "kge"\nsparse_gradients = true\n'),
        32,
        '[strategy]\ntype = "data_parallel"\n',
        "task.sparse_gradients",
        "strategy 'data_parallel' reduces dense gradients",
    ),
    (
        "a plateau schedule under population-based training",
        CLASSIFICATION,
        32,
        '[strategy]\ntype = "population_based"\n'
        'search_space = { lr = { kind = "log", low = 0.01, high = 0.1 } }\n',
        "train.lr_decay",
        '"plateau" follows the trainer\'s validation',
    ),
    (
        "a search space the job cannot tune",
        CLASSIFICATION,
        32,
        '[strategy]\ntype = "population_based"\n'
        'search_space = { beta1 = { kind = "linear", low = 0.8, high = 0.9 } }\n',
        "strategy.search_space.beta1",
        "the sgd optimizer has no beta1",
    ),
    (
        "pipeline on a task without stages",
        CLASSIFICATION,
        32,
        '[strategy]\ntype = "pipeline"\n',
        "strategy.type",
        "strategy pipeline needs a task that can cut its model into pipeline stages",
    ),
    (
        "tensor parallel on a task without a plan",
        KGE,
        32,
        '[strategy]\ntype = "tensor_parallel"\n',
        "strategy.type",
        "task type 'kge' has no tensor-parallel plan",
    ),
    (
        "fully sharded on a task without blocks",
        CLASSIFICATION,
        32,
        '[strategy]\ntype = "fully_sharded"\n',
        "strategy.type",
        "task type 'classification' has no blocks to shard",
    ),
    (
        "a parameter server for a task without tables",
        LM,
        32,
        '[strategy]\ntype = "parameter_server"\n',
        "strategy.type",
        "task type 'lm' has no embedding tables; use data_parallel for a dense model",
    ),
    (
        "a parameter server for a KGE training type that scores every entity",
        KGE.replace(
            "negatives = { num_negatives = 4, chunk_size = 8 }\n",
            'training = "1vsAll"\nloss = { kind = "softmax" }\n',
        ),
        32,
        '[strategy]\ntype = "parameter_server"\n',
        "strategy.type",
        "task.training.type = '1vsAll': it scores every entity in every step",
    ),
    (
        "rows shared on the host with a server that restarts alone",
        KGE,
        32,
        '[strategy]\ntype = "parameter_server"\nmode = "async"\nhost_rows = "shared"\n'
        "[faults]\nmax_restarts = 1\n",
        "strategy.host_rows",
        "a dedicated server restarts alone under faults.max_restarts = 1, and its host's workers "
        'would keep the old server\'s rows; set host_rows = "auto"',
    ),
    (
        "a label-skewed federated partition of a task without labels",
        LM,
        32,
        '[strategy]\ntype = "federated"\npartition = { kind = "dirichlet", alpha = 0.5 }\n',
        "strategy.partition.kind",
        "task type 'lm' has no class labels",
    ),
    (
        "tied embeddings cut by a pipeline",
        LM.replace("context = 8\n", "context = 8\ntie_embeddings = true\n"),
        32,
        '[strategy]\ntype = "pipeline"\n',
        "task.model.tie_embeddings",
        "puts the embedding on the first stage and the head on the last",
    ),
]


@pytest.mark.parametrize(
    ("task", "batch", "extra", "field", "fragment"),
    [rule[1:] for rule in RULES],
    ids=[rule[0] for rule in RULES],
)
def test_a_config_time_rule_is_refused_by_validate(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    task: str,
    batch: int,
    extra: str,
    field: str,
    fragment: str,
) -> None:
    (tmp_path / "triples.tsv").write_text("a\tr\tb\nb\tr\tc\nc\ts\ta\n")
    (tmp_path / "text.txt").write_text("to be or not to be, that is the question\n" * 20)
    if "federated" in extra:  # a federated run's length is its rounds
        train = f"[train]\nbatch_size = {batch}\n"
    else:
        train = TRAIN.format(batch=batch)
    if field == "train.lr_decay":
        train += 'lr_decay = "plateau"\n'
    (tmp_path / "job.toml").write_text(f"{task}\n{train}\n{extra}")
    monkeypatch.chdir(tmp_path)
    code = main(["config", "validate", "job.toml"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(lines) == 1, lines
    assert re.match(rf"job\.toml:\d+: {re.escape(field)}: ", lines[0]), lines[0]
    assert fragment in lines[0], lines[0]
