"""MLflow logging for one run: resolved config as params, grid axes as tags, batched metrics."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
MAX_PARAMS_PER_BATCH = 100   # MLflow's log_batch limits
MAX_METRICS_PER_BATCH = 1000


def resolve_tracking_uri(configured: str | None = None) -> str:
    """Config value, else $MLFLOW_TRACKING_URI, else a sqlite file under <repo>/.cache."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    db = REPO_ROOT / ".cache" / "mlflow.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{db}"


def _artifact_root(tracking_uri: str) -> str | None:
    """Keep artifacts next to a sqlite store instead of MLflow's cwd-relative ./mlruns."""
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///")).resolve()
        return (db.parent / "mlflow-artifacts").as_uri()
    return None


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """{'a': {'b': 1}} -> {'a.b': '1'}; MLflow params are flat strings."""
    flat: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, prefix=f"{name}."))
        else:
            flat[name] = str(value)
    return flat


class MlflowRun:
    """One MLflow run. Metrics are buffered and written with log_batch, because each
    sqlite write costs ~20 ms, which would dominate a tiny CPU step."""

    def __init__(self, *, experiment: str, run_name: str | None, params: dict[str, Any],
                 tags: dict[str, str], config_yaml: str, tracking_uri: str | None = None):
        # Runs happen on offline clusters and CI; no usage pings unless a user opts in.
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        self.tracking_uri = resolve_tracking_uri(tracking_uri)
        self.client = MlflowClient(self.tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = (found.experiment_id if found else self.client.create_experiment(
            experiment, artifact_location=_artifact_root(self.tracking_uri)))
        self.run_id = self.client.create_run(experiment_id, run_name=run_name,
                                             tags=tags).info.run_id
        self.experiment_id = experiment_id
        items = [Param(k, v) for k, v in flatten(params).items()]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + MAX_PARAMS_PER_BATCH])
        self.client.log_text(self.run_id, config_yaml, "config.yaml")
        self._pending: list = []
        self._tag_cls = RunTag

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._pending.extend(Metric(k, float(v), now, step) for k, v in metrics.items())

    def flush(self) -> None:
        for i in range(0, len(self._pending), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=self._pending[i:i + MAX_METRICS_PER_BATCH])
        self._pending.clear()

    def set_tags(self, tags: dict[str, str]) -> None:
        self.client.log_batch(self.run_id, tags=[self._tag_cls(k, str(v)) for k, v in tags.items()])

    def finish(self, status: str = "FINISHED") -> None:
        self.flush()
        self.client.set_terminated(self.run_id, status=status)


def config_to_yaml(config: dict[str, Any]) -> str:
    return yaml.safe_dump(config, sort_keys=False)
