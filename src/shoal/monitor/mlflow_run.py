"""An MLflow run with the scalars of metrics.jsonl (`[monitor] mlflow = {...}`).

Rank 0 creates one run per training session in the configured experiment (created when
missing), through `MlflowClient` rather than mlflow's module-level active run, so nothing
global is left behind in the process. The resolved config goes in twice: as params, one per
leaf field (`train.optimizer.lr`), to filter and compare runs by; and whole, as the
artifact `config.toml`, to rerun one. Each record's scalars (`monitor/scalars.py`) are metrics
at the record's step; MLflow keeps every value, several at one step too. The run ends with
the session as FINISHED, FAILED or KILLED (stopped by a signal).
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import TYPE_CHECKING, Any

from shoal.errors import ShoalError
from shoal.monitor.scalars import Outcome

if TYPE_CHECKING:
    from shoal.config.trackers import MlflowConfig
    from shoal.runtime.context import WorkerContext

STATUS: dict[Outcome, str] = {"completed": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}
#: MLflow's limits (mlflow.utils.validation): params per call, characters per param value
PARAMS_PER_BATCH = 100
PARAM_VALUE_CHARS = 6000
#: characters MLflow refuses in a metric or param name
NOT_IN_A_KEY = re.compile(r"[^/\w.\- ]")


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Leaf fields by dotted path, as MLflow params (strings; lists as JSON)."""
    params: dict[str, str] = {}
    for name, value in config.items():
        key = NOT_IN_A_KEY.sub("_", f"{prefix}{name}")
        if isinstance(value, dict) and value:
            params.update(flatten(value, f"{key}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            params[key] = text[:PARAM_VALUE_CHARS]
    return params


class MlflowRun:
    """One MLflow run, fed by :class:`~shoal.monitor.metrics.MetricsLog` on rank 0."""

    def __init__(self, settings: MlflowConfig, ctx: WorkerContext) -> None:
        uri = settings.tracking_uri
        if uri is not None and uri.startswith("file:"):
            # MLflow 3 refuses its file store unless asked: a file: URI in the config is asking
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient  # the optional extra

        from shoal.config import dump_config

        try:
            self._client = MlflowClient(tracking_uri=uri)
            experiment = self._experiment_id(settings.experiment)
            tags = {"shoal.run_dir": str(ctx.paths.root), **settings.tags}
            name = settings.run_name or ctx.paths.root.name
            self.run_id = self._client.create_run(experiment, run_name=name, tags=tags).info.run_id
            params = [
                Param(key, value)
                for key, value in flatten(
                    ctx.config.model_dump(mode="json", exclude_none=True)
                ).items()
            ]
            for first in range(0, len(params), PARAMS_PER_BATCH):
                self._client.log_batch(self.run_id, params=params[first : first + PARAMS_PER_BATCH])
            self._client.log_text(self.run_id, dump_config(ctx.config), "config.toml")
        except Exception as error:  # mlflow's: the server unreachable, a store it refuses
            raise ShoalError(
                f"monitor.mlflow: MLflow did not start a run at {uri or 'its default URI'}: "
                f"{' '.join(str(error).split())}"
            ) from error

    def _experiment_id(self, name: str) -> str:
        found = self._client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self._client.create_experiment(name))
        except Exception:  # another run created it in the meantime
            found = self._client.get_experiment_by_name(name)
            if found is None:
                raise
            return str(found.experiment_id)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(NOT_IN_A_KEY.sub("_", tag), float(value), now, step)
            for tag, value in scalars.items()
        ]
        if metrics:
            self._client.log_batch(self.run_id, metrics=metrics)

    def close(self, outcome: Outcome) -> None:
        self._client.set_terminated(self.run_id, status=STATUS[outcome])
