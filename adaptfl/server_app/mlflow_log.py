"""Optional MLflow tracking (`mlflow=true`): one MLflow run per adaptfl run, named after its
results folder, in a local file store `<results dir>/mlruns/` (offline: no server, no network),
next to metrics.csv / metrics.jsonl, which stay the source of truth. Params: the run config as
config.json holds it; metrics: each row's numeric values at step=round, the rows metrics.jsonl
holds. Needs the `tracking` extra: `pip install 'adaptfl[tracking]'`."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

STORE = "mlruns"
EXPERIMENT = "adaptfl"
MAX_VALUE = 6000  # MLflow's limit on a param value (characters)
MAX_KEY = 250  # and on a param or metric name
BATCH = 100  # params per log_batch call (MLflow's limit)
_REFUSED = re.compile(r"[^\w\-. /]")  # MLflow names: alphanumerics, _ - . space /


def mlflow_client_class() -> Any:
    """MLflow's client class, imported only when `mlflow=true`; a one-line refusal without it."""
    # MLflow 3 keeps the file store in maintenance mode and refuses it unless opted in; and it
    # sends usage telemetry from `import mlflow` unless this is set: the store stays offline.
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise ValueError("mlflow=true needs the mlflow package: "
                         "pip install 'adaptfl[tracking]'") from None
    return MlflowClient


def mlflow_name(key: str) -> str:
    """A name MLflow accepts: refused characters become '_', at most MAX_KEY characters."""
    return _REFUSED.sub("_", key)[:MAX_KEY]


def param_value(value: Any) -> str:
    """A config value as MLflow stores it: a string of at most MAX_VALUE characters (booleans as
    in the run config, true/false; the full value stays in config.json)."""
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return text if len(text) <= MAX_VALUE else text[:MAX_VALUE - 1] + "…"


def numeric(row: dict[str, Any]) -> dict[str, float]:
    """The row's numeric values (no booleans, nothing nested or textual), as TensorBoard's."""
    return {mlflow_name(k): float(v) for k, v in row.items()
            if k != "round" and isinstance(v, int | float) and not isinstance(v, bool)}


class MlflowRun:
    """One MLflow run in `<run dir>/mlruns`. Reopened (resume, overwrite), the earlier attempt's
    run is deleted (MLflow's soft delete: hidden, `mlflow gc` purges it) and the new one logs the
    rows kept, so the store's one active run holds exactly metrics.jsonl's rows."""

    def __init__(self, client_class: Any, run_dir: Path, name: str, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        self.client = client_class(tracking_uri=(run_dir / STORE).as_uri())
        found = self.client.get_experiment_by_name(EXPERIMENT)
        experiment = found.experiment_id if found else self.client.create_experiment(EXPERIMENT)
        for earlier in self.client.search_runs([experiment]):  # resume, overwrite: rows rewritten
            self.client.delete_run(earlier.info.run_id)
        self.run_id: str = self.client.create_run(experiment, run_name=name).info.run_id
        params = {mlflow_name(k): param_value(v) for k, v in sorted(config.items())}
        items = [Param(k, v) for k, v in params.items()]
        for start in range(0, len(items), BATCH):
            self.client.log_batch(self.run_id, params=items[start:start + BATCH])
        self.ended = False

    def log_row(self, row: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        step, stamp = int(row["round"]), int(time.time() * 1000)
        metrics = [Metric(k, v, stamp, step) for k, v in numeric(row).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def end(self, status: str = "FINISHED") -> None:
        """FINISHED, FAILED (an abort, an error) or KILLED (interrupted); only once."""
        if not self.ended:
            self.ended = True
            self.client.set_terminated(self.run_id, status)
