"""The NaN/Inf guard: a non-finite loss or gradient stops the run with a clear message, marks
the MLflow run, and leaves the last good checkpoint as `latest` (in-process, one CPU rank), in
fp32 and in bf16 with DeepSpeed's overflow check on or off (train.check_grad_overflow)."""
from __future__ import annotations

import math

import pytest
from mlflow.tracking import MlflowClient

import launcher.train as train_module
from launcher.config import build_run_config


# The run's precision and DeepSpeed's bf16 overflow check (train.check_grad_overflow), and what
# turns non-finite at step 5: the loss (and so every gradient), or the gradients only (the loss
# stays finite). In bf16 with the check on DeepSpeed skips the step and reports its grad norm as
# inf; with it off the non-finite gradient reaches the weights. The guard stops the run alike.
GUARD_CASES = {
    "fp32": ({}, "loss"),
    "bf16-check-on": ({"precision": "bf16", "check_grad_overflow": True}, "loss"),
    "bf16-check-off": ({"precision": "bf16", "check_grad_overflow": False}, "loss"),
    "bf16-check-off-gradient": ({"precision": "bf16", "check_grad_overflow": False}, "gradient"),
}


@pytest.mark.parametrize("train, breaks", GUARD_CASES.values(), ids=GUARD_CASES.keys())
def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch, train,
                                                                  breaks):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = build_run_config({
        "seed": 1, "model": {"preset": "micro"},
        "train": {"steps": 8, "micro_batch_size": 2, **train},
        "eval": {"every": 100, "batches": 1}, "checkpoint": {"dir": str(tmp_path / "ckpt"),
                                                            "every": 2},
        "tracking": {"experiment": "guard", "tracking_uri": uri, "system_metrics": False}})
    real_loss, calls = train_module.lm_loss, []

    def loss_that_breaks_at_step_5(logits, targets):
        calls.append(bool(logits.isfinite().all()))
        loss = real_loss(logits, targets)
        if len(calls) != 5:
            return loss
        if breaks == "loss":
            return loss * math.nan
        loss.register_hook(lambda grad: grad * math.nan)   # finite loss, NaN gradients
        return loss

    monkeypatch.setattr(train_module, "lm_loss", loss_that_breaks_at_step_5)
    said = []
    result = train_module.train(config, say=said.append)
    # found at step 6, the read point after it (a checkpoint: never saved before it is read)
    assert len(calls) == 6
    # step 6 ran on the weights step 5 left: skipped (finite) unless the bf16 check was off
    assert calls[5] == (train.get("precision") != "bf16" or train["check_grad_overflow"])
    assert result.diverged_at == 5 and len(result.train_loss) == 5
    assert math.isnan(result.train_loss[-1][1]) == (breaks == "loss")
    message = next(line for line in said if "diverged" in line)
    assert "step 5" in message and "last good checkpoint is step 4" in message
    assert "grad norm inf" in message   # DeepSpeed's verdict on a non-finite gradient
    assert (tmp_path / "ckpt" / "latest").read_text() == "step00000004"
    run = MlflowClient(uri).get_run(result.run_id)
    assert run.info.status == "FAILED" and run.data.tags["diverged_at_step"] == "5"


def test_a_non_finite_step_between_read_points_is_reported_as_itself(tmp_path, monkeypatch):
    """The loop reads the device at its read points only (here steps 1, 4 and 8): a NaN at step
    2 stops the run at the read point after it, step 4, and is reported as step 2; steps 3
    and 4, trained on the diverged weights, are neither logged nor kept."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = build_run_config({
        "seed": 1, "model": {"preset": "micro"},
        "train": {"steps": 8, "micro_batch_size": 2, "log_every": 4},
        "eval": {"every": 100, "batches": 1},
        "tracking": {"experiment": "guard", "tracking_uri": uri, "system_metrics": False}})
    real_loss, calls = train_module.lm_loss, []

    def loss_that_breaks_at_step_2(logits, targets):
        calls.append(1)
        loss = real_loss(logits, targets)
        return loss * math.nan if len(calls) == 2 else loss

    monkeypatch.setattr(train_module, "lm_loss", loss_that_breaks_at_step_2)
    said = []
    result = train_module.train(config, say=said.append)
    assert len(calls) == 4   # it stopped at the read point after the bad step
    assert result.diverged_at == 2 and [s for s, _ in result.train_loss] == [1, 2]
    assert math.isnan(result.train_loss[1][1])
    message = next(line for line in said if "diverged" in line)
    assert "at step 2" in message and "no checkpoint was saved" in message
    client = MlflowClient(uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FAILED" and run.data.tags["diverged_at_step"] == "2"
    losses = sorted((m.step, m.value) for m in client.get_metric_history(result.run_id, "loss"))
    assert [s for s, _ in losses] == [1, 2] and math.isnan(losses[1][1])
