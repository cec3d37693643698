"""model.loss_impl in the trainer: `chunked` trains as `plain` does (one CPU rank, DeepSpeed,
fp32), and eval goes through the same loss."""
from __future__ import annotations

import pytest

from launcher.config import build_run_config
from launcher.train import train

RUN = {
    "seed": 3,
    "model": {"preset": "micro", "qk_norm": True},
    "optimizer": {"lr": 3e-3},
    "schedule": {"warmup_steps": 2},
    "train": {"steps": 4, "micro_batch_size": 2, "grad_accum_steps": 2},
    "eval": {"every": 2, "batches": 1},
    "tracking": {"experiment": "test-loss-impl", "system_metrics": False},
}


def test_chunked_loss_trains_as_the_plain_one(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def run(impl: str):
        raw = {**RUN, "model": {**RUN["model"], "loss_impl": impl, "loss_chunk_tokens": 48},
               "tracking": {**RUN["tracking"], "tracking_uri": uri}}
        return train(build_run_config(raw))

    plain, chunked = run("plain"), run("chunked")
    assert [s for s, _ in chunked.train_loss] == [1, 2, 3, 4]
    # fp32 on the CPU: the same losses up to fp32 rounding, over 4 optimizer steps
    assert [v for _, v in chunked.train_loss] == pytest.approx(
        [v for _, v in plain.train_loss], rel=1e-5)
    assert [v for _, v in chunked.eval_loss] == pytest.approx(
        [v for _, v in plain.eval_loss], rel=1e-5)
    assert chunked.train_loss[-1][1] < chunked.train_loss[0][1]
