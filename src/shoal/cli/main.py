"""`shoal train`, `shoal status`, `shoal report`, `shoal generate`,
`shoal config validate|schema|show`, `shoal plugins`, `shoal kge prepare|verify|synthesize`.

User errors print one line each (what, where, how to fix) and exit 2, without a
traceback; a failed job exits 1 with the rank and error that caused it; a run
stopped by SIGTERM or SIGINT exits 128 + the signal (143, 130) after its final
checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shoal.errors import EXIT_OK, ShoalError


def _train(args: argparse.Namespace) -> int:
    config = _new_run_config(args)
    if _starts_workers(args, config):
        from shoal.launch.start import start_server_early

        start_server_early()  # it imports torch while this process does (launch/start.py)
    from rich.console import Console

    from shoal.api import train
    from shoal.launch.environment import external_launch
    from shoal.monitor.summary import print_summary

    results = train(
        config if config is not None else args.config,  # validated once, here
        workers=args.workers,
        overrides=() if config is not None else args.set,
        resume=args.resume,
        force=args.force,
        allow_changes=args.allow_changes,
    )
    launch = external_launch()
    if launch is not None and launch.placement.rank != 0:
        return EXIT_OK  # rank 0 prints the summary
    console = Console()
    print_summary(results, console)
    valid = results.get("valid") or {}
    final = "  ".join(f"{k} {v:.4f}" for k, v in sorted(valid.items()) if isinstance(v, float))
    if final:
        console.print(f"final valid: {final}")
    console.print(f"run directory: {results['run_dir']}")
    return EXIT_OK


def _new_run_config(args: argparse.Namespace) -> Any:
    """A new run's config, loaded and validated once (torch-free), named after its file as the
    planner would name it; None for a resume (the planner reads the run's own) or a config in
    error (the planner reports it, in one line)."""
    if args.resume or args.config is None:
        return None
    from shoal.config import load_config
    from shoal.config.loading import default_run_name
    from shoal.errors import ShoalError

    try:
        config = load_config(args.config, args.set)
    except ShoalError:
        return None
    if config.run.name is None:
        run = config.run.model_copy(update={"name": default_run_name(args.config)})
        config = config.model_copy(update={"run": run})
    return config


def _starts_workers(args: argparse.Namespace, config: Any) -> bool:
    """Whether `shoal train ARGS` will start worker processes here, judged from the config
    alone (its shape), before torch is imported. A wrong guess costs time, never a wrong
    job: the launcher decides for itself later."""
    if "RANK" in os.environ or "SLURM_PROCID" in os.environ:
        return False  # a task of torchrun or srun: it joins a job, it starts nobody
    if args.workers is not None:
        return bool(args.workers > 1)
    from shoal.shape.sizing import shape_of

    if config is None and args.resume:  # the run's own config says
        from shoal.config import load_config
        from shoal.run import RunPaths

        try:
            config = load_config(RunPaths(Path(args.resume)).config, args.set)
        except Exception:  # a bad run directory: the planner reports it, in one line
            return False
    if config is None:
        return False

    shape = shape_of(config)
    return not (shape.in_process and shape.world_size == 1)


def _validate(args: argparse.Namespace) -> int:
    """The planner without the launch: every rule the config alone decides, in one pass; then
    the strategy's and task's classes, imported as a job would (a plugin that does not
    import fails here, not in its workers)."""
    from shoal.config.custom import section_class
    from shoal.launch.plan import plan_job
    from shoal.plugins.kinds import STRATEGIES, TASKS

    plan = plan_job(args.file, args.set)
    config, world = plan.config, plan.world_size
    section_class(STRATEGIES, config.strategy)
    section_class(TASKS, config.task)
    print(
        f"{args.file}: valid (task {config.task.type}, strategy {config.strategy.type}, "
        f"{world} worker{'s' if world > 1 else ''}{plan.shape.describe_members()})"
    )
    return EXIT_OK


def _schema(args: argparse.Namespace) -> int:
    from shoal.config import ShoalConfig

    print(json.dumps(ShoalConfig.model_json_schema(), indent=2))
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    from shoal.config import dump_config, load_config

    sys.stdout.write(dump_config(load_config(args.file, args.set)))
    return EXIT_OK


def _plugins(args: argparse.Namespace) -> int:
    from shoal.plugins.listing import plugin_lines

    print("\n".join(plugin_lines()))
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    from shoal.recovery.status import status_lines
    from shoal.run import RunPaths

    print("\n".join(status_lines(RunPaths(Path(args.run_dir)))))
    return EXIT_OK


def _report(args: argparse.Namespace) -> int:
    import time

    from shoal.report import write_report

    started = time.perf_counter()
    output = Path(args.output) if args.output else None
    written = write_report([Path(d) for d in args.run_dirs], output)
    print(f"report written: {written} ({time.perf_counter() - started:.1f} s)")
    return EXIT_OK


def _generate(args: argparse.Namespace) -> int:
    from shoal.tasks.lm.generate import generate

    text = generate(
        args.run_dir,
        args.prompt,
        tokens=args.tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        seed=args.seed,
    )
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    from shoal import __version__

    parser = argparse.ArgumentParser(
        prog="shoal", description="Train a PyTorch model under any way of distributing it."
    )
    parser.add_argument("--version", action="version", version=f"shoal {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    set_help = "override a config value, e.g. --set train.optimizer.lr=0.1 (repeatable)"
    train = commands.add_parser("train", help="train the job a config describes")
    train.add_argument("config", nargs="?", help="TOML config file")
    train.add_argument("--workers", type=int, help="worker processes on this machine")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help)
    train.add_argument(
        "--resume", metavar="RUN_DIR", help="continue a run from its newest checkpoint"
    )
    train.add_argument(
        "--force",
        action="store_true",
        help="start the workers even if they outnumber the CPU cores more than 4 times",
    )
    train.add_argument(
        "--allow-changes",
        action="store_true",
        help="let --resume change what the run trains (learning rate, optimizer, data...); "
        "the changes are logged and recorded in metrics.jsonl",
    )
    train.set_defaults(handler=_train)

    status = commands.add_parser(
        "status",
        help="every rank's role, state, step, heartbeat age and restarts (live while a job "
        "runs, and after it ended)",
    )
    status.add_argument("run_dir", metavar="RUN_DIR", help="run directory")
    status.set_defaults(handler=_status)

    report = commands.add_parser(
        "report",
        help="one self-contained HTML page of runs: curves, time per rank, strategy panels; "
        "several runs are overlaid (re-run it while a run goes to refresh)",
    )
    report.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories")
    report.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="where to write the page (RUN_DIR/report.html for one run, ./report.html for several)",
    )
    report.set_defaults(handler=_report)

    generate = commands.add_parser(
        "generate", help="sample text from a language-model run's best checkpoint"
    )
    generate.add_argument("run_dir", metavar="RUN_DIR", help="run directory of an lm run")
    generate.add_argument("--prompt", required=True, help="text the sample continues")
    generate.add_argument("--tokens", type=int, default=200, help="tokens to sample (200)")
    generate.add_argument(
        "--temperature", type=float, default=1.0, help="divides the logits (1.0; lower: safer)"
    )
    generate.add_argument("--top-k", type=int, help="sample among the k likeliest tokens only")
    generate.add_argument("--seed", type=int, default=0, help="seed of the sampling (0)")
    generate.set_defaults(handler=_generate)

    config = commands.add_parser("config", help="check, show or describe configs")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    validate = config_commands.add_parser("validate", help="check a config file")
    validate.add_argument("file")
    validate.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help)
    validate.set_defaults(handler=_validate)
    show = config_commands.add_parser("show", help="print a config with every default filled in")
    show.add_argument("file")
    show.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help)
    show.set_defaults(handler=_show)
    schema = config_commands.add_parser("schema", help="print the JSON Schema of configs")
    schema.set_defaults(handler=_schema)

    plugins = commands.add_parser(
        "plugins", help="list the strategies, tasks, aggregation methods... that are registered"
    )
    plugins.set_defaults(handler=_plugins)

    from shoal.cli.kge import add_kge_commands

    add_kge_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
        return code
    except ShoalError as exc:
        for line in exc.lines:
            print(line, file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("shoal: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    """The `shoal` command and `python -m shoal`."""
    code = main()
    # only a torchrun worker or a Slurm task may need exit_process: torch is imported then only
    if "RANK" in os.environ or "SLURM_PROCID" in os.environ:
        from shoal.launch.environment import external_launch
        from shoal.launch.process_group import exit_process

        if external_launch() is not None:
            exit_process(code)  # a torchrun or srun task: exit_process says why
    sys.exit(code)


if __name__ == "__main__":
    entry()
