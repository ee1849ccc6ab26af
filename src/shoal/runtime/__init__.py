"""What a worker process knows about itself and its peers, and the small collectives it uses."""

from shoal.runtime.context import WorkerContext

__all__ = ["WorkerContext"]
