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


def test_grid_job_tags_parent_run_and_reopen_keeps_one_run(tmp_path, monkeypatch):
    from launcher.config import build_run_config
    from launcher.train import default_run_name, grid_tags

    monkeypatch.setenv("SAGEBWD_PARENT_RUN_ID", "parent123")
    monkeypatch.setenv("SAGEBWD_NODE", "b200")
    config = build_run_config({"model": {"preset": "micro"},
                               "train": {"steps": 4, "micro_batch_size": 2,
                                         "tokens_per_step": 256},
                               "tracking": {"tps_label": "2.1m"}})
    tags = grid_tags(config)
    assert tags["tps"] == "2.1m" and tags["node"] == "b200" and tags["tokens_per_step"] == "256"
    assert tags["quant"] == "none"   # fpa has no quantisation contract
    token = build_run_config({"model": {"preset": "micro", "attention": "sagebwd", "smoothing": "k",
                                        "quant": "token", "seq_len": 128},
                              "train": {"steps": 4, "micro_batch_size": 2, "tokens_per_step": 256}})
    assert grid_tags(token)["quant"] == "token" and "-quant_token-" in default_run_name(token)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = MlflowRun.create(experiment="unit", run_name="r", params={"a": 1}, tags=tags,
                             config_yaml="a: 1\n", tracking_uri=uri)
    first.log_metrics(1, {"loss": 2.0})
    first.log_metrics(2, {"loss": 1.5, "eval_loss": 1.7})   # past the (step-1) checkpoint
    first.finish("KILLED")
    again = MlflowRun.reopen(first.run_id, uri)
    again.log_metrics(2, {"loss": 1.5, "eval_loss": 1.7})   # the replayed step: already stored
    again.log_metrics(3, {"loss": 1.0})
    again.log_json({"status": "FINISHED"}, "summary.json")
    again.finish()
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("unit").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == "parent123"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2, 3]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval_loss")] == [2]
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id)) == [
        "config.yaml", "summary.json"]
