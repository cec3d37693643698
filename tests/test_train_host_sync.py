"""What the trainer logs over a short run, against a golden captured from the trainer that
read every step's loss (one CPU rank, in-process)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import launcher.train as train_module
from launcher.config import build_run_config
from launcher.journal import Journal

GOLDEN = Path(__file__).parent / "golden" / "train_metrics_cpu.json"
GOLDEN_RUN = {
    "seed": 1, "model": {"preset": "micro", "qk_norm": True},
    "optimizer": {"lr": 3e-3}, "schedule": {"warmup_steps": 2},
    "train": {"steps": 10, "micro_batch_size": 2, "grad_accum_steps": 2, "log_every": 7},
    "eval": {"every": 5, "batches": 2},
    "checkpoint": {"every": 8},
    "tracking": {"experiment": "golden", "system_metrics": False, "run_name": "golden"},
}
COMPARED = ("loss", "lr", "grad_norm", "tokens_seen", "eval_loss")   # the rest are timings


def run(tmp_path: Path, *, model=None, **train) -> tuple[object, dict, list[str]]:
    """-> (RunResult, {step: the compared metrics from the journal}, progress lines)."""
    raw = json.loads(json.dumps(GOLDEN_RUN))
    raw["model"].update(model or {})
    raw["train"].update(train)
    raw["checkpoint"]["dir"] = str(tmp_path / "ckpt")
    raw["tracking"]["tracking_uri"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    said = []
    result = train_module.train(build_run_config(raw), say=said.append)
    metrics = {str(r["step"]): {k: v for k, v in r["values"].items() if k in COMPARED}
               for r in Journal(tmp_path / "ckpt" / "tracking").records() if r["op"] == "metrics"}
    progress = [line.split(" grad_norm")[0] for line in said if " grad_norm " in line]
    return result, metrics, progress


@pytest.fixture(scope="module")
def batched(tmp_path_factory):
    return run(tmp_path_factory.mktemp("batched"))


def test_logged_values_match_the_golden_of_the_every_step_reads(batched):
    """The golden was captured from the unmodified trainer (commit 412ff0c, which read the loss
    and grad norm every step) on the machine, torch and thread count it names. There the
    values must be identical; elsewhere CPU kernels may round otherwise, so fp32 rounding."""
    golden = json.loads(GOLDEN.read_text())
    result, metrics, progress = batched
    same_machine = (golden["torch"], golden["cpu_capability"], golden["threads"]) == (
        torch.__version__, torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())
    if same_machine:
        assert metrics == golden["metrics"]
        assert progress == golden["progress"]
        assert [list(pair) for pair in result.eval_loss] == golden["eval_loss"]
    else:
        assert metrics == pytest.approx(golden["metrics"], rel=1e-5)
    assert [s for s, _ in result.train_loss] == list(range(1, 11))
    assert [v for _, v in result.train_loss] == [metrics[str(s)]["loss"] for s in range(1, 11)]


def test_reading_every_step_logs_the_same_values(batched, tmp_path):
    """A progress line every step logs the same numbers, on any machine."""
    result, metrics, _ = run(tmp_path, log_every=1)
    assert metrics == batched[1]
    assert result.train_loss == batched[0].train_loss and result.eval_loss == batched[0].eval_loss
