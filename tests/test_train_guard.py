"""The NaN/Inf guard: a non-finite loss stops the run with a clear message, marks the
MLflow run, and leaves the last good checkpoint as `latest` (in-process, one CPU rank)."""
from __future__ import annotations

import math

from mlflow.tracking import MlflowClient

import launcher.train as train_module
from launcher.config import build_run_config


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = build_run_config({
        "seed": 1, "model": {"preset": "micro"}, "train": {"steps": 8, "micro_batch_size": 2},
        "eval": {"every": 100, "batches": 1}, "checkpoint": {"dir": str(tmp_path / "ckpt"),
                                                            "every": 2},
        "tracking": {"experiment": "guard", "tracking_uri": uri, "system_metrics": False}})
    real_loss, calls = train_module.lm_loss, []

    def loss_that_breaks_at_step_5(logits, targets):
        calls.append(1)
        loss = real_loss(logits, targets)
        return loss * math.nan if len(calls) == 5 else loss

    monkeypatch.setattr(train_module, "lm_loss", loss_that_breaks_at_step_5)
    said = []
    result = train_module.train(config, say=said.append)
    assert result.diverged_at == 5 and len(result.train_loss) == 5
    message = next(line for line in said if "diverged" in line)
    assert "step 5" in message and "last good checkpoint is step 4" in message
    assert (tmp_path / "ckpt" / "latest").read_text() == "step00000004"
    run = MlflowClient(uri).get_run(result.run_id)
    assert run.info.status == "FAILED" and run.data.tags["diverged_at_step"] == "5"
