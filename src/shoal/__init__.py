"""shoal: one training job, every way to distribute it."""

from shoal.api import train
from shoal.config import ShoalConfig, load_config
from shoal.errors import ShoalError

__version__ = "0.1.0"

__all__ = ["ShoalConfig", "ShoalError", "__version__", "load_config", "train"]
