"""The run directory: where a job's config, metrics, logs, checkpoints and results live."""

from shoal.run.paths import RunPaths, create_run_dir

__all__ = ["RunPaths", "create_run_dir"]
