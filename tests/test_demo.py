"""The FPA vs SageBwd demo, shortened, end to end: train both, compare them from MLflow."""
from __future__ import annotations

from mlflow.tracking import MlflowClient

from experiments import demo


def test_demo_end_to_end_short(tmp_path, monkeypatch, capsys):
    """The real demo entry point, shortened: micro shapes, 6 steps per run."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    out = tmp_path / "demo"
    code = demo.main(["--out", str(out), "--set", "model.preset=micro",
                      "--set", "model.block_q=32", "--set", "model.block_kv=32",
                      "--set", "train.steps=6", "--set", "schedule.warmup_steps=2",
                      "--set", "eval.every=3", "--set", "eval.batches=1"])
    assert code == 0
    printed = capsys.readouterr().out
    # The comparison table, read back from MLflow: one row per run, FPA first.
    table = printed[printed.index("comparing them from MLflow"):]
    fpa_row = next(line for line in table.splitlines() if "| fpa" in line)
    sage_row = next(line for line in table.splitlines() if "| sagebwd" in line)
    assert table.index(fpa_row) < table.index(sage_row)
    assert "workflowType=machine_learning" in printed       # the UI link on loopback
    pngs = sorted(out.glob("*.png"))
    assert pngs and pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert "fpa" in report and "sagebwd" in report

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("sagebwd-demo")
    runs = client.search_runs([exp.experiment_id])
    trained = [r for r in runs if "attention" in r.data.tags]
    assert sorted(r.data.tags["attention"] for r in trained) == ["fpa", "sagebwd"]
    assert {r.data.params["seed"] for r in trained} == {"1337"}  # same seed, same data order
    for run in trained:
        assert len(client.get_metric_history(run.info.run_id, "loss")) == 6
        assert len(client.get_metric_history(run.info.run_id, "eval_loss")) == 2
    # the report and figures are logged on the comparison run
    comparison = [r for r in runs if "attention" not in r.data.tags]
    assert len(comparison) == 1
    logged = {a.path for a in client.list_artifacts(comparison[0].info.run_id, "compare")}
    assert "compare/report.md" in logged


def test_demo_rejects_bad_overrides_before_training(capsys):
    assert demo.main(["--set", "train.steps=0"]) == 2
    assert "train.steps" in capsys.readouterr().err
