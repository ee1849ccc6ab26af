"""A table of bad configs: each gives its one-line message (file:line: path: what) and exit 2."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shoal.cli.main import main
from tests.conftest import run_shoal

GOOD = '[task]\ntype = "classification"\n\n[train]\nepochs = 1\nbatch_size = 32\n'

CASES: list[tuple[str, str | bytes, list[str], str]] = [
    # (name, file content, extra CLI args, the expected stderr line)
    (
        "empty file",
        "",
        [],
        "bad.toml: the config is empty; it needs at least a [task] and a "
        "[train] section (see the files in examples/)",
    ),
    (
        "comments only",
        "# nothing here\n",
        [],
        "bad.toml: the config is empty; it needs at least "
        "a [task] and a [train] section (see the files in examples/)",
    ),
    (
        "toml syntax",
        '[task]\ntype = "classification"\n[train\nepochs = 1\n',
        [],
        "bad.toml:3: invalid TOML: Expected ']' at the end of a table declaration (column 7)",
    ),
    (
        "binary garbage",
        b"\x89PNG\r\n\x1a\n\x00\xff\xfe",
        [],
        "bad.toml: not UTF-8 text (bad byte at offset 0); a config is a TOML text file",
    ),
    (
        "unknown section",
        GOOD + "\n[trian]\nepochs = 2\n",
        [],
        "bad.toml:8: trian: unknown key; did you mean 'train'? allowed here: checkpoint, faults, "
        "monitor, run, strategy, task, train",
    ),
    (
        "unknown key",
        GOOD + "learning_rate = 0.1\n",
        [],
        "bad.toml:7: train.learning_rate: unknown key; allowed here: activation_checkpointing, batch_size, "
        "compile, drop_last, "
        "early_stopping_min_delta, early_stopping_patience, epochs, eval_batch_size, "
        "eval_every_epochs, eval_every_steps, grad_clip_norm, lr_decay, max_steps, micro_batches, "
        "min_lr_ratio, "
        "mixed_precision, on_nonfinite, optimizer, plateau, seed, shuffle, warmup_steps",
    ),
    (
        "unknown strategy",
        GOOD + '\n[strategy]\ntype = "gossip"\n',
        [],
        "bad.toml:9: strategy.type: unknown value 'gossip'; choose one of: local, data_parallel, "
        "federated, population_based, parameter_server, pipeline, tensor_parallel, fully_sharded, "
        "hybrid",
    ),
    (
        "strategy without type",
        GOOD + "\n[strategy]\nnum_replicas = 2\n",
        [],
        "bad.toml:8: strategy.type: required, but missing; choose one of: local, data_parallel, "
        "federated, population_based, parameter_server, pipeline, tensor_parallel, fully_sharded, "
        "hybrid",
    ),
    (
        "zero replicas",
        GOOD + '\n[strategy]\ntype = "data_parallel"\nnum_replicas = 0\n',
        [],
        "bad.toml:10: strategy.num_replicas: must be >= 1, got 0",
    ),
    (
        "parameter server: unknown key",
        GOOD + '\n[strategy]\ntype = "parameter_server"\nservers = 2\n',
        [],
        "bad.toml:10: strategy.servers: unknown key; did you mean 'num_servers'? allowed here: "
        "barrier_timeout_s, colocate_by_host, host_rows, "
        "max_message_rows, max_staleness, min_servers, mode, num_servers, num_workers, optimizer, placement, "
        "prefetch, shard_dir, sharding, type, worker_memory_budget_mb",
    ),
    (
        "parameter server: unknown mode",
        GOOD + '\n[strategy]\ntype = "parameter_server"\nmode = "eventual"\n',
        [],
        "bad.toml:10: strategy.mode: must be one of 'sync', 'async' or 'bounded', got 'eventual' "
        "(string)",
    ),
    (
        "parameter server: unknown server optimizer",
        GOOD + '\n[strategy]\ntype = "parameter_server"\noptimizer = { kind = "adam" }\n',
        [],
        "bad.toml:10: strategy.optimizer.kind: unknown value 'adam'; choose one of: sgd, "
        "adagrad, lazy_adam",
    ),
    (
        "parameter server: a dense task",
        GOOD + '\n[strategy]\ntype = "parameter_server"\n',
        [],
        "bad.toml:9: strategy.type: strategy parameter_server needs a task that can have its "
        "embedding rows held by parameter servers: task type 'classification' has no embedding "
        "tables; use data_parallel for a dense model",
    ),
    (
        "parameter server: colocated needs a worker per server",
        GOOD
        + '\n[strategy]\ntype = "parameter_server"\nplacement = "colocated"\nnum_workers = 1\n'
        + "num_servers = 2\n",
        [],
        'bad.toml:8: strategy: placement = "colocated" runs each server inside a worker: '
        "num_servers (2) must be <= num_workers (1); lower it or use "
        'placement = "dedicated"',
    ),
    (
        "unknown task",
        '[task]\ntype = "regression"\n\n[train]\nepochs = 1\nbatch_size = 8\n',
        [],
        "bad.toml:2: task.type: unknown value 'regression'; choose one of: classification, kge, lm, "
        "module",
    ),
    (
        "missing train",
        '[task]\ntype = "classification"\n',
        [],
        "bad.toml: train: required, but missing",
    ),
    (
        "missing batch size",
        '[task]\ntype = "classification"\n\n[train]\nepochs = 1\n',
        [],
        "bad.toml:4: train.batch_size: required, but missing",
    ),
    (
        "string for integer",
        GOOD.replace("batch_size = 32", 'batch_size = "32"'),
        [],
        "bad.toml:6: train.batch_size: must be an integer, got '32' (string)",
    ),
    (
        "float for integer",
        GOOD.replace("epochs = 1", "epochs = 1.5"),
        [],
        "bad.toml:5: train.epochs: must be an integer, got 1.5 (float)",
    ),
    (
        "no length",
        GOOD.replace("epochs = 1\n", ""),
        [],
        "bad.toml:4: train: set epochs or max_steps (or both: whichever comes first)",
    ),
    (
        "micro batches",
        GOOD + "micro_batches = 64\n",
        [],
        "bad.toml:4: train: micro_batches (64) cannot exceed batch_size (32)",
    ),
    (
        "negative lr",
        GOOD + 'optimizer = { kind = "sgd", lr = -1 }\n',
        [],
        "bad.toml:7: train.optimizer.lr: must be > 0, got -1",
    ),
    (
        "infinite learning rate",
        GOOD + 'optimizer = { kind = "adam", lr = inf }\n',
        [],
        "bad.toml:7: train.optimizer.lr: must be a finite number, got inf (inf and nan train "
        "nothing)",
    ),
    (
        "nan learning rate from --set",
        GOOD,
        ["--set", "train.optimizer.lr=nan"],
        "--set: train.optimizer.lr: must be a finite number, got nan (inf and nan train nothing)",
    ),
    (
        "unknown optimizer",
        GOOD + 'optimizer = { kind = "rmsprop" }\n',
        [],
        "bad.toml:7: train.optimizer.kind: unknown value 'rmsprop'; choose one of: sgd, adam, "
        "adamw, adagrad, sparse_adam",
    ),
    (
        "momentum for adam",
        GOOD + 'optimizer = { kind = "adam", momentum = 0.9 }\n',
        [],
        "bad.toml:7: train.optimizer.momentum: unknown key; allowed here: amsgrad, betas, eps, kind, "
        "lr, weight_decay",
    ),
    (
        "bad activation",
        GOOD + '\n[task.model]\nactivation = "sigmoid"\n',
        [],
        "bad.toml:9: task.model.activation: must be one of 'relu', 'gelu', 'tanh' or 'silu', "
        "got 'sigmoid' (string)",
    ),
    (
        "dropout of one",
        GOOD + "\n[task.model]\ndropout = 1.0\n",
        [],
        "bad.toml:9: task.model.dropout: must be < 1, got 1.0",
    ),
    (
        "zero width layer",
        GOOD + "\n[task.model]\nhidden = [64, 0]\n",
        [],
        "bad.toml:9: task.model.hidden[1]: must be >= 1, got 0",
    ),
    (
        "missing data file",
        GOOD + '\n[task.data]\nsource = "file"\npath = "nope.csv"\n',
        [],
        "bad.toml:10: task.data.path: file not found: {tmp}/nope.csv",
    ),
    (
        "impossible synthetic",
        GOOD + "\n[task.data]\nfeatures = 4\ninformative = 8\n",
        [],
        "bad.toml:8: task.data: informative (8) cannot exceed features (4)",
    ),
    (
        "data without source",
        GOOD + '\n[task.data]\npath = "x.csv"\n',
        [],
        "bad.toml:9: task.data.path: unknown key; allowed here: class_sep, classes, "
        "clusters_per_class, features, informative, noise, samples, seed, source, valid_fraction",
    ),
    (
        "run name",
        GOOD + '\n[run]\nname = "my run!"\n',
        [],
        "bad.toml:9: run.name: must match ^[A-Za-z0-9][A-Za-z0-9._-]*$, got 'my run!'",
    ),
    (
        "override type",
        GOOD,
        ["--set", "train.batch_size=abc"],
        "--set: train.batch_size: must be an integer, got 'abc' (string)",
    ),
    (
        "override syntax",
        GOOD,
        ["--set", "train.epochs"],
        "--set 'train.epochs': expected KEY=VALUE with a dotted key, e.g. --set train.optimizer.lr=0.1",
    ),
    (
        "override unknown key",
        GOOD,
        ["--set", "train.epoch=3"],
        "--set: train.epoch: unknown key; did you mean 'epochs'? allowed here: "
        "activation_checkpointing, batch_size, compile, drop_last, early_stopping_min_delta, "
        "early_stopping_patience, epochs, eval_batch_size, eval_every_epochs, eval_every_steps, "
        "grad_clip_norm, lr_decay, max_steps, micro_batches, min_lr_ratio, "
        "mixed_precision, on_nonfinite, optimizer, plateau, seed, shuffle, warmup_steps",
    ),
    (
        "bind to every interface",
        GOOD + '\n[run]\nbind = "0.0.0.0"\n',
        [],
        "bad.toml:9: run.bind: '0.0.0.0': peers cannot connect to it; give the address (or "
        "interface) of the network the hosts share, e.g. '10.0.0.5' or 'eth0'",
    ),
    (
        "bind neither address nor interface",
        GOOD,
        ["--set", "run.bind=10.0.0.300"],
        "--set: run.bind: '10.0.0.300' is neither an IP address, a network such as '10.0.0.0/24', "
        "nor an interface name such as 'eth0'",
    ),
]


@pytest.mark.parametrize(
    ("content", "args", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_config_gives_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    content: str | bytes,
    args: list[str],
    expected: str,
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    monkeypatch.chdir(tmp_path)
    code = main(["config", "validate", "bad.toml", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines() == [expected.format(tmp=tmp_path.resolve())]


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 15


def test_every_problem_is_reported_once_per_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD.replace("batch_size = 32", "batch_size = 0") + 'shuffle = "yes"\n')
    monkeypatch.chdir(tmp_path)
    assert main(["config", "validate", "bad.toml"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "bad.toml:6: train.batch_size: must be >= 1, got 0",
        "bad.toml:7: train.shuffle: must be true or false, got 'yes' (string)",
    ]


@pytest.mark.parametrize("command", ["validate", "train"])
def test_process_exits_2_without_traceback(tmp_path: Path, command: str) -> None:
    (tmp_path / "bad.toml").write_text(
        GOOD + '\n[strategy]\ntype = "data_parallel"\nnum_replicas = 0\n'
    )
    args = ["config", "validate", "bad.toml"] if command == "validate" else ["train", "bad.toml"]
    done = run_shoal(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["bad.toml:10: strategy.num_replicas: must be >= 1, got 0"]
    assert "Traceback" not in done.stdout + done.stderr
    assert not (tmp_path / "runs").exists(), "a bad config must not create a run directory"


def test_missing_config_file(tmp_path: Path) -> None:
    done = run_shoal("train", "nowhere.toml", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["nowhere.toml: no such config file"]


def test_workers_with_local_strategy(tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text(GOOD)
    done = run_shoal("train", "job.toml", "--workers", "2", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "--workers 2: strategy 'local' runs one process; set [strategy] type = \"data_parallel\" "
        "to train on several workers"
    ]


#: huge or deep input, each read in well under a second today (issue 35, item 13): before, a
#: 300 KB string in an inline table's enum took minutes (a quadratic key scan), a 100,000-deep
#: array was a RecursionError traceback, and a 10 MB key was echoed whole
BIG = 300_000
HUGE_CASES = [
    (
        "300 KB enum value in an inline table",
        GOOD.replace("epochs = 1", f'epochs = 1\noptimizer = {{ kind = "{"a" * BIG}", lr = 0.1 }}'),
        f"bad.toml:6: train.optimizer.kind: unknown value {'a' * 60!r}... (300,000 characters); "
        "choose one of: sgd, adam, adamw, adagrad, sparse_adam",
    ),
    (
        "300 KB enum value",
        GOOD + f'lr_decay = "{"b" * BIG}"\n',
        f"bad.toml:7: train.lr_decay: must be one of 'constant', 'linear', 'cosine' or "
        f"'plateau', got {'b' * 60!r}... (300,000 characters) (string)",
    ),
    (
        "100,000-deep array",
        GOOD + "seed = " + "[" * 100_000 + "]" * 100_000 + "\n",
        "bad.toml: invalid TOML: arrays or tables nested too deeply to read (a config needs a "
        "few levels; look for a run of '[' or '{')",
    ),
    (
        "10 MB key",
        GOOD + "k" * (10 << 20) + " = 1\n",
        f"bad.toml:7: train.{'k' * 60}... (10,485,760 characters): unknown key; allowed here: "
        "activation_checkpointing, batch_size, compile, drop_last, early_stopping_min_delta, "
        "early_stopping_patience, epochs, eval_batch_size, eval_every_epochs, eval_every_steps, "
        "grad_clip_norm, lr_decay, max_steps, micro_batches, "
        "min_lr_ratio, mixed_precision, on_nonfinite, optimizer, plateau, seed, shuffle, "
        "warmup_steps",
    ),
    (
        "header of 300 KB blanks",
        GOOD + "[ " + " " * BIG + "\n",
        "bad.toml:7: invalid TOML: Invalid initial character for a key part (column 300003)",
    ),
]


@pytest.mark.parametrize(
    ("content", "expected"), [c[1:] for c in HUGE_CASES], ids=[c[0] for c in HUGE_CASES]
)
def test_huge_or_deep_input_gives_one_short_line_at_once(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    content: str,
    expected: str,
) -> None:
    (tmp_path / "bad.toml").write_text(content)
    monkeypatch.chdir(tmp_path)
    started = time.perf_counter()
    code = main(["config", "validate", "bad.toml"])
    seconds = time.perf_counter() - started
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [expected]
    assert seconds < 5, f"{seconds:.1f} s: validation is no longer linear in its input"


def test_a_deep_set_value_gives_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "job.toml").write_text(GOOD)
    deep = "[" * 100_000 + "]" * 100_000
    assert (
        main(["config", "validate", str(tmp_path / "job.toml"), "--set", f"train.seed={deep}"]) == 2
    )
    assert capsys.readouterr().err.splitlines() == [
        "--set train.seed: arrays or tables nested too deeply to read (a config needs a few "
        "levels; look for a run of '[' or '{')"
    ]
