"""The FPA vs SageBwd demo: summary numbers, and a shortened end-to-end demo run."""
from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from experiments import demo
from experiments.summary import format_table, mean_of_last, summarise
from launcher.train import RunResult


def fake_result(name: str, train: list[float], evals: list[tuple[int, float]]) -> RunResult:
    return RunResult(name=name, run_id=None, tracking_uri=None,
                     train_loss=list(enumerate(train, start=1)), eval_loss=evals,
                     tokens_per_s=1000.0, wall_s=10.0)


def test_summary_numbers():
    results = {
        "FPA": fake_result("a", [5.0, 4.0, 3.0, 2.0], [(2, 4.5), (4, 3.0)]),
        "SageBwd": fake_result("b", [5.0, 4.0, 3.5, 2.5], [(2, 4.0), (4, 3.25)]),
    }
    fpa, sage = summarise(results, baseline="FPA", last_k=2)
    assert fpa.final_train_loss == pytest.approx(2.5) and fpa.gap_to_baseline is None
    assert sage.final_train_loss == pytest.approx(3.0)
    assert (sage.best_eval_loss, sage.final_eval_loss) == (3.25, 3.25)
    assert sage.gap_to_baseline == pytest.approx(0.25)
    table = format_table([fpa, sage], last_k=2)
    assert "| SageBwd | 3.0000 | 3.2500 | 3.2500 | +0.2500 |" in table
    assert mean_of_last([(1, 1.0)], 5) == 1.0
    with pytest.raises(ValueError, match="baseline 'FPA'"):
        summarise({"x": results["FPA"]}, baseline="FPA")


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
    assert "| FPA |" in printed and "| SageBwd |" in printed
    assert f"mlflow ui --backend-store-uri {uri}" in printed
    png = (out / "loss_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert "final eval gap to FPA" in (out / "summary.md").read_text()

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("sagebwd-demo")
    runs = client.search_runs([exp.experiment_id])
    assert sorted(r.data.tags["attention"] for r in runs) == ["fpa", "sagebwd"]
    assert {r.data.params["seed"] for r in runs} == {"1337"}  # same seed, same data order
    for run in runs:
        assert len(client.get_metric_history(run.info.run_id, "loss")) == 6
        assert len(client.get_metric_history(run.info.run_id, "eval_loss")) == 2


def test_demo_rejects_bad_overrides_before_training(capsys):
    assert demo.main(["--set", "train.steps=0"]) == 2
    assert "train.steps" in capsys.readouterr().err
