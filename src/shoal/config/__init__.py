"""Job configuration: TOML validated by pydantic models, with help text on every field."""

from shoal.config.loading import dump_config, load_config
from shoal.config.root import ShoalConfig

__all__ = ["ShoalConfig", "dump_config", "load_config"]
