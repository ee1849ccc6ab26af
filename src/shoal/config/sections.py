"""`[checkpoint]`, `[run]`, `[monitor]` and `[faults]`: the job around the training."""

from __future__ import annotations

import importlib.util
import ipaddress
import re
from typing import Literal

from pydantic import Field, field_validator

from shoal.config.base import ConfigModel
from shoal.config.trackers import MlflowConfig, WandbConfig

INTERFACE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,14}$")


def check_bind(value: str) -> str:
    """`run.bind`: an address, a network (CIDR) or an interface name (checked on each host
    when it joins: shoal.launch.network)."""
    try:
        if "/" in value:
            ipaddress.ip_network(value, strict=False)
            return value
        address = ipaddress.ip_address(value)
    except ValueError:
        if INTERFACE_NAME.match(value) and not re.match(r"^[\d.]+$", value):
            return value
        raise ValueError(
            f"{value!r} is neither an IP address, a network such as '10.0.0.0/24', nor an "
            "interface name such as 'eth0'"
        ) from None
    if address.is_unspecified or address.is_multicast:
        raise ValueError(
            f"{value!r}: peers cannot connect to it; give the address (or interface) of the "
            "network the hosts share, e.g. '10.0.0.5' or 'eth0'"
        )
    return value


class CheckpointConfig(ConfigModel):
    """When checkpoints are written and how many are kept."""

    every_steps: int = Field(
        0,
        ge=0,
        description="Write a checkpoint every N units of the strategy's loop (0: never): steps "
        "(local, data_parallel, parameter_server), rounds (federated); population_based "
        "counts generations with strategy.checkpoint_every.",
    )
    every_epochs: int = Field(
        1, ge=0, description="Write a checkpoint at the end of every N-th epoch (0: never)."
    )
    keep_last: int = Field(3, ge=1, description="Keep the newest K checkpoints; older are deleted.")
    at_end: bool = Field(True, description="Write a checkpoint when training ends.")
    keep_best: bool = Field(
        True,
        description="Keep the checkpoint with the best validation value of the task's primary "
        "metric in best/ (replaced atomically when a later evaluation beats it).",
    )


class RunConfig(ConfigModel):
    """Where the run directory goes and what the workers run on."""

    dir: str = Field("runs", description="Parent folder of run directories.")
    name: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Run name (default: the config file's name); an existing name gets a suffix.",
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend: nccl when CUDA is used, else gloo."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description=(
            "Device to train on (auto: one CUDA device per worker if available; a parameter "
            "server's workers share the GPUs there are)."
        ),
    )
    threads_per_worker: int | None = Field(
        None, ge=1, description="CPU threads per worker (default: cores / workers on this host)."
    )
    bind: str | None = Field(
        None,
        description="Multi-host jobs (torchrun, Slurm): where this host's workers listen for "
        "their peers (gloo). An interface name ('eth0', 'ib0'), a network every host has an "
        "address in ('10.1.0.0/16'), or one host's address (pass per host with --set "
        "run.bind=...). Default: the address this host uses to reach MASTER_ADDR (127.0.0.1 "
        "on one host). shoal's own launcher always stays on 127.0.0.1.",
    )
    secret_file: str | None = Field(
        None,
        description="Multi-host jobs (torchrun, Slurm): a file holding the job's secret (16 "
        "bytes or more, e.g. 64 hex digits), the same on every host; only processes that know "
        "it may join, and heartbeats are sealed with it. SHOAL_JOB_SECRET in the environment "
        "takes precedence. The secret itself never goes into the config or the run directory.",
    )

    @field_validator("bind")
    @classmethod
    def _check_bind(cls, value: str | None) -> str | None:
        return None if value is None else check_bind(value)


class MonitorConfig(ConfigModel):
    """What is reported while training runs."""

    log_every_steps: int = Field(
        10, ge=1, description="Write a metrics.jsonl line and a progress line every N steps."
    )
    progress: Literal["auto", "bar", "plain", "off"] = Field(
        "auto", description="Progress display: a live bar on a terminal, plain lines otherwise."
    )
    tensorboard: bool = Field(
        False,
        description="Also write metrics.jsonl's scalars as TensorBoard event files into the "
        "run's tensorboard/ folder (`tensorboard --logdir runs/` shows every run). Needs the "
        "tensorboard package: pip install 'shoal[tensorboard]'.",
    )
    wandb: WandbConfig | None = Field(
        None,
        description="Also log the run to Weights & Biases: the same scalars as TensorBoard "
        'and the resolved config, from rank 0, e.g. { project = "kge", mode = '
        "\"offline\" }. Needs pip install 'shoal[wandb]'.",
    )
    mlflow: MlflowConfig | None = Field(
        None,
        description="Also log the run to MLflow: the same scalars as TensorBoard as metrics "
        "and the resolved config as params (and config.toml as an artifact), from rank 0, "
        'e.g. { tracking_uri = "file:./mlruns", experiment = "kge" }. Needs pip install '
        "'shoal[mlflow]'.",
    )

    @field_validator("tensorboard")
    @classmethod
    def _check_tensorboard(cls, value: bool) -> bool:
        if value and importlib.util.find_spec("tensorboard") is None:
            raise ValueError(
                "the tensorboard package is not installed: pip install 'shoal[tensorboard]' "
                "(or set monitor.tensorboard = false)"
            )
        return value


class FaultInjection(ConfigModel):
    """Deliberately break one worker, to test how a job handles faults."""

    rank: int = Field(..., ge=0, description="Rank that fails.")
    step: int = Field(..., ge=0, description="Global step (0-based) at which it fails.")
    kind: Literal["raise", "exit", "hang", "nan", "slow"] = Field(
        "raise",
        description="raise an exception, exit abruptly, stop responding, (nan) turn this "
        "rank's gradient of the first parameter into NaN at that step, or (slow) make it a "
        "straggler from that step on: `factor` times slower compute, or delay_s of sleep "
        "before every step.",
    )
    delay_s: float = Field(
        0.2, gt=0, description='kind = "slow": seconds this rank sleeps before each step.'
    )
    factor: float | None = Field(
        None,
        gt=1,
        description='kind = "slow": this rank computes `factor` times slower (each forward and '
        "backward is followed by factor - 1 times its own duration of sleep), so its delay "
        "grows with its share of the work, as a slower machine's would; replaces delay_s.",
    )


class FaultsConfig(ConfigModel):
    """Timeouts that turn a lost worker into a clear error instead of a hang."""

    timeout_s: float = Field(
        300.0, gt=0, description="Longest wait for any collective (a worker not answering)."
    )
    start_timeout_s: float = Field(
        120.0,
        gt=0,
        description="Longest wait for every worker process to start and join the job "
        "(importing torch takes seconds, more on a busy machine).",
    )
    heartbeat_interval_s: float = Field(
        1.0, gt=0, description="How often each worker reports that it is alive."
    )
    heartbeat_timeout_s: float = Field(
        5.0,
        gt=0,
        description="A worker silent this long is declared lost and the job stops. Heartbeats "
        "come from a thread that keeps beating while the worker evaluates or writes a "
        "checkpoint (the longest gap measured: 1.01 s at a 1 s interval, writing 450 MB).",
    )
    max_restarts: int = Field(
        0,
        ge=0,
        description="Restart the job automatically this many times at most when a worker "
        "dies, hangs or loses its peer (shoal's own launcher): the remaining workers are "
        "stopped and a new set resumes from the newest verified checkpoint. 0: a failure "
        "ends the job.",
    )
    snapshot_every_steps: int = Field(
        0,
        ge=0,
        description="Keep the job's state in memory (tmpfs) every N steps, so that a restart "
        "(max_restarts) loses at most N steps instead of everything since the last disk "
        "checkpoint. 0: no snapshots. Under torchrun or Slurm each host keeps them in its "
        "memory, with a copy on the next host.",
    )
    min_workers: int = Field(
        0,
        ge=0,
        description="Elastic: when a worker cannot come back (it failed max_rank_failures "
        "times), go on with one worker fewer, down to this many, resumed from the newest "
        "state with the same global batch (data_parallel; federated moves the lost worker's "
        "clients to the others; parameter_server counts its workers only, its servers have "
        "strategy.min_servers). 0: never shrink.",
    )
    max_rank_failures: int = Field(
        2,
        ge=1,
        description="With min_workers: a rank that failed this many times is given up and "
        "the job goes on without it.",
    )
    restart_backoff_s: float = Field(
        1.0,
        ge=0,
        description="Wait before a restart; doubled for each further restart in a row whose "
        "attempt made no progress (reached no step beyond the state it resumed from).",
    )
    restart_backoff_max_s: float = Field(
        30.0, ge=0, description="Longest wait before a restart (the doubling stops there)."
    )
    inject: FaultInjection | None = Field(
        None, description="Fault injection for testing fault handling; leave unset in real runs."
    )
