"""The job's shape and its resizing, for a whole config: what the launcher, the planner,
recovery and a torchrun rank ask.

Each function reads the strategy's own section (`[strategy]`, or its `config`
table for a class named by dotted path) and, for a resize, puts the new typed
section into the config and validates the whole again, so a resized job obeys
every rule a config file does. No `--set` strings travel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shoal.config.custom import own_config
from shoal.config.loading import load_config
from shoal.config.root import ShoalConfig
from shoal.errors import ConfigError
from shoal.shape.hosts import Hosts
from shoal.shape.job import JobShape
from shoal.shape.roles import RankRoles


@dataclass(frozen=True)
class Shrunk:
    """A job without a rank it gave up: the smaller config, its membership, the floor."""

    config: ShoalConfig
    members: dict[str, int]
    floor: str


def shape_of(config: ShoalConfig, hosts: Hosts | None = None) -> JobShape:
    """The shape `config` describes (`hosts`: the machines, where placement follows them; the
    launcher's default, every rank on this one)."""
    section = own_config(config.strategy)
    shape = getattr(section, "shape", None)
    if shape is None:  # a plugin's config that is not a StrategySection: one process
        return JobShape(RankRoles.replicas(1), {"workers": 1})
    result: JobShape = shape(config, hosts)
    return result


def with_section(config: ShoalConfig, section: Any) -> ShoalConfig:
    """`config` with another strategy section, validated again as a whole."""
    data = config.model_dump(mode="json", exclude_none=True, by_alias=True)
    own = section.model_dump(mode="json", exclude_none=True, by_alias=True)
    if config.strategy.type == "custom":
        data["strategy"]["config"] = own
    else:
        data["strategy"] = own
    return load_config(data)


def with_workers(config: ShoalConfig, workers: int) -> ShoalConfig:
    """`config` with `workers` worker processes (`--workers`)."""
    section = own_config(config.strategy)
    resize = getattr(section, "with_workers", None)
    if resize is None:
        if workers == 1:
            return config
        raise ConfigError(
            f"--workers {workers}: strategy '{config.strategy.type}' runs one process"
        )
    resized = resize(workers)
    return config if resized is section else with_section(config, resized)


def without_rank(config: ShoalConfig, rank: int) -> Shrunk | None:
    """The job without `rank`, given up (None: the floor is reached, or the strategy keeps
    every rank)."""
    section = own_config(config.strategy)
    shrink = getattr(section, "without_rank", None)
    result = shrink(config, rank) if shrink is not None else None
    if result is None:
        return None
    return Shrunk(with_section(config, result.section), result.members, result.floor)


def fitted_to(config: ShoalConfig, world_size: int) -> ShoalConfig:
    """`config` for `world_size` processes, as torchrun or Slurm started them (unchanged where
    it already describes them)."""
    if shape_of(config).world_size == world_size:
        return config
    section = own_config(config.strategy)
    fit = getattr(section, "fitted", None)
    if fit is None:
        return config
    fitted = fit(config, world_size)
    return config if fitted is section else with_section(config, fitted)
