"""Capturing a trained layer's core-attention inputs and output gradient, then tracing them."""
from __future__ import annotations

import pytest
import torch
import yaml

from launcher import capture
from launcher.train import train
from sagebwd import trace

RUN = {
    "seed": 5,
    "model": {"preset": "micro", "num_layers": 2, "qk_norm": True, "attention": "sagebwd",
              "smoothing": "k"},   # 2 layers, width 128 (2 heads of 64), seq 64, blocks 32
    "optimizer": {"lr": 3e-3},
    "schedule": {"warmup_steps": 1},
    "train": {"steps": 2, "micro_batch_size": 2},
    "eval": {"every": 2, "batches": 1},
    "tracking": {"experiment": "test-capture", "system_metrics": False},
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("capture")
    raw = {**RUN, "checkpoint": {"dir": str(root / "ckpt"), "every": 2},
           "tracking": {**RUN["tracking"], "tracking_uri": f"sqlite:///{root / 'mlflow.db'}"}}
    config_path = root / "run.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    from launcher.config import load_run_config
    train(load_run_config(config_path))
    return root, config_path


def test_capture_of_a_checkpointed_layer_feeds_the_tracer(trained, capsys):
    root, config_path = trained
    out = root / "layer1.pt"
    assert capture.main(["--config", str(config_path), "--layer", "1", "--out", str(out),
                         "--checkpoint", str(root / "ckpt")]) == 0
    data = torch.load(out)
    for name in ("q", "k", "v", "do"):
        assert data[name].shape == (2, 2, 64, 64) and data[name].dtype == torch.float32, name
        assert torch.isfinite(data[name]).all() and data[name].abs().sum() > 0, name
    assert data["meta"]["weights"].endswith("step00000002") and data["meta"]["layer"] == 1
    assert not list(root.glob("*.partial"))
    # The trained weights, not the init: the same capture without the checkpoint differs.
    fresh = capture.capture(capture.load_run_config(str(config_path)), 1)
    assert not torch.equal(fresh["q"], data["q"])
    # The manifest's next step, on the captured file.
    assert trace.main(["tensors", "--input", str(out), "--causal", "--block-q", "32",
                       "--block-kv", "32"]) == 0
    printed = capsys.readouterr().out
    assert "wrote" in printed and "dS" in printed


def test_capture_rejects_what_it_cannot_use(trained, tmp_path, capsys):
    root, config_path = trained
    out = tmp_path / "x.pt"
    assert capture.main(["--config", str(config_path), "--layer", "2", "--out", str(out)]) == 2
    assert "layers 0..1" in capsys.readouterr().err
    assert capture.main(["--config", str(config_path), "--layer", "0", "--out", str(out),
                         "--checkpoint", str(tmp_path / "nowhere")]) == 2
    assert "nowhere" in capsys.readouterr().err
    assert capture.main(["--config", str(config_path), "--layer", "0", "--out", str(out),
                         "--set", "model.hidden_size=256", "--checkpoint", str(root / "ckpt")]) == 2
    assert "does not fit this config's model" in capsys.readouterr().err
    assert not out.exists()
