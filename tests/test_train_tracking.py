"""MLflow tracking against a real sqlite store: params, tags, batched metric history."""
from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from launcher.tracking import MlflowRun, flatten, resolve_tracking_uri


def test_flatten_nested_config():
    assert flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": None}) == {
        "a.b": "1", "a.c.d": "[1, 2]", "e": "None"}


def test_tracking_uri_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///from-env.db")
    assert resolve_tracking_uri("sqlite:///from-config.db") == "sqlite:///from-config.db"
    assert resolve_tracking_uri(None) == "sqlite:///from-env.db"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    default = resolve_tracking_uri(None)
    assert default.startswith("sqlite:///") and default.endswith("/.cache/mlflow.db")


def test_run_holds_params_tags_and_full_metric_history(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    params = {"model": {"attention": "sagebwd", "hidden_size": 128}, "seed": 7}
    run = MlflowRun.create(experiment="unit", run_name="r1", params=params,
                    tags={"attention": "sagebwd"}, config_yaml="seed: 7\n", tracking_uri=uri)
    for step in range(1, 121):
        run.log_metrics(step, {"loss": 10.0 / step, "lr": 1e-3})
        if step % 50 == 0:
            run.flush()
    run.log_metrics(120, {"eval_loss": 0.5})
    run.finish()

    client = MlflowClient(uri)
    stored = client.get_run(run.run_id)
    assert stored.info.status == "FINISHED"
    assert stored.info.run_name == "r1"
    assert stored.data.params == {"model.attention": "sagebwd", "model.hidden_size": "128",
                                  "seed": "7"}
    assert stored.data.tags["attention"] == "sagebwd"
    history = client.get_metric_history(run.run_id, "loss")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == list(range(1, 121))
    assert sorted(history, key=lambda m: m.step)[-1].value == pytest.approx(10.0 / 120)
    assert [m.value for m in client.get_metric_history(run.run_id, "eval_loss")] == [0.5]
    artifacts = [a.path for a in client.list_artifacts(run.run_id)]
    assert artifacts == ["config.yaml"]
    # artifacts sit next to the sqlite file, not in a cwd-relative ./mlruns
    assert stored.info.artifact_uri.startswith((tmp_path / "mlflow-artifacts").as_uri())
