"""benchmarks/train_throughput.py on the CPU: the table and the JSON, in the tiny mode."""
from __future__ import annotations

import json

from benchmarks import train_throughput

SMALL = ["--set", "model.num_layers=1", "--set", "model.seq_len=128", "--set", "train.micro_batch_size=1"]


def test_tiny_table_and_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["--config", "experiments/configs/cpu-tiny.yaml", "--quick", "--attention", "fpa",
            "--compile", "none", "default", "--compile-backend", "aot_eager", *SMALL,
            "--out", str(out)]
    assert train_throughput.main(argv) == 0
    text = capsys.readouterr().out
    assert "| cpu-tiny | 128 x 1 | fpa | none | chunked |" in text
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert [(r["compile"], r["loss"]) for r in rows] == [
        ("none", "plain"), ("none", "chunked"), ("default", "plain"), ("default", "chunked")]
    assert all(r["error"] is None and r["tokens_per_s"] > 0 and r["tokens_per_step"] == 128
               for r in rows)
    # the same seed, weights and tokens: step 1's loss is the same by either loss path
    assert abs(rows[0]["first_loss"] - rows[1]["first_loss"]) < 1e-4
    assert data["environment"]["device"] == "cpu" and rows[0]["mfu"] is None
    # Python's collections in each row's timed steps, on the trainer's schedule (train.gc_every, 0 by default)
    assert all(r["gc"]["every"] == 0 and len(r["gc"]["collections"]) == 3 and r["gc"]["ms_per_step"] >= 0
               for r in rows)
    assert "| gc ms a step |" in text


def test_sync_rows_share_one_model_and_its_warm_up(tmp_path, capsys):
    """--sync step log: the trainer's old and new host reads, timed on one warmed-up model."""
    out = tmp_path / "bench.json"
    argv = ["--config", "experiments/configs/cpu-tiny.yaml", "--quick", "--attention", "fpa",
            "--compile", "none", "--loss", "chunked", "--sync", "step", "log", *SMALL,
            "--out", str(out)]
    assert train_throughput.main(argv) == 0
    assert "| cpu-tiny | 128 x 1 | fpa | none | chunked | step |" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert [r["sync"] for r in rows] == ["step", "log"]
    assert rows[0]["warmup_s"] == rows[1]["warmup_s"] and rows[0]["first_loss"] == rows[1]["first_loss"]
    assert all(r["error"] is None and r["tokens_per_s"] > 0 for r in rows)


def test_the_deepspeed_engine_rows_beside_the_manual_ones(tmp_path, capsys):
    """--engine deepspeed: the trainer's DeepSpeed engine and train_step in a one-process gloo
    world, here in bf16 with the overflow check off (the GPU A/B's knob, through --set); the
    manual rows (fp32 on the CPU) start from the same weights and tokens."""
    out = tmp_path / "bench.json"
    argv = ["--config", "experiments/configs/cpu-tiny.yaml", "--quick", "--attention", "fpa",
            "--compile", "none", "--loss", "chunked", "--engine", "manual", "deepspeed", *SMALL,
            "--set", "train.precision=bf16", "--set", "train.check_grad_overflow=false",
            "--out", str(out)]
    assert train_throughput.main(argv) == 0
    assert "| cpu-tiny | 128 x 1 | fpa | none | chunked | log | deepspeed |" in capsys.readouterr().out
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert [r["engine"] for r in rows] == ["manual", "deepspeed"]
    assert all(r["error"] is None and r["tokens_per_s"] > 0 and r["tokens_per_step"] == 128
               for r in rows)
    assert rows[1]["extra"] == {"zero_stage": 1, "grad_accum": 1, "bf16": True,
                                "check_grad_overflow": False, "grad_accum_dtype": "bf16",
                                "optimizer": "DeepSpeedZeroOptimizer", "grad_clip": 1.0}
    assert abs(rows[0]["first_loss"] - rows[1]["first_loss"]) < 1e-2   # fp32 vs bf16
    assert data["args"]["engine"] == ["manual", "deepspeed"] and data["environment"]["deepspeed"]


def test_a_failing_row_is_recorded_and_the_table_goes_on(tmp_path, capsys):
    out = tmp_path / "bench.json"
    # seq 96 is not a multiple of sagebwd's 128-row tiles: that row fails, fpa's runs
    argv = ["--case", "experiments/configs/cpu-tiny.yaml@96x1", "--quick", "--loss", "chunked",
            "--compile", "none", "--set", "model.num_layers=1", "--out", str(out)]
    assert train_throughput.main(argv) == 1
    rows = json.loads(out.read_text())["rows"]
    assert [r["attention"] for r in rows] == ["fpa", "sagebwd"]
    assert rows[0]["error"] is None and rows[0]["seq_len"] == 96
    assert "block_q" in rows[1]["error"]
    assert "ERROR" in capsys.readouterr().out


def test_mixed_precision_optimizer_step_updates_bf16_weights():
    """The ZeRO-1-like step on bf16 weights (fp32 masters copied back in place: no autograd)."""
    import torch
    from benchmarks.train_throughput import MasterAdamW
    from launcher.config import load_run_config
    from model.llama import Llama

    config = load_run_config("experiments/configs/cpu-tiny.yaml", [])
    model = Llama(config.model).to(torch.bfloat16)
    before = [p.detach().clone() for p in model.parameters()]
    opt = MasterAdamW(model, config)
    out = model(torch.randint(0, 100, (1, 32)))
    (out[0] if isinstance(out, tuple) else out).float().square().mean().backward()
    opt.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None and p.dtype == torch.bfloat16 for p in model.parameters())


def test_profile_lists_a_rows_top_ops_beside_its_timed_step(tmp_path, capsys):
    """--profile K: after the timed steps, as many under torch.profiler; the row's top K (CPU ops here) with their
    time per step and the sum of all, in the table after the main one and in the JSON."""
    out = tmp_path / "bench.json"
    argv = ["--config", "experiments/configs/cpu-tiny.yaml", "--quick", "--attention", "fpa", "--compile", "none",
            "--loss", "chunked", "--profile", "4", *SMALL, "--out", str(out)]
    assert train_throughput.main(argv) == 0
    text = capsys.readouterr().out
    assert "cpu-tiny 128 x 1 fpa compile=none loss=chunked sync=log engine=manual: step " in text
    profile = json.loads(out.read_text())["rows"][0]["profile"]
    assert len(profile["rows"]) == 4 and all(ms > 0 and calls > 0 for ms, calls, _ in profile["rows"])
    assert [r[0] for r in profile["rows"]] == sorted((r[0] for r in profile["rows"]), reverse=True)
    assert profile["kernel_ms"] >= sum(r[0] for r in profile["rows"])
    assert any("aten::" in name for _, _, name in profile["rows"])


def test_a_negative_profile_count_is_refused(capsys):
    import pytest

    with pytest.raises(SystemExit):
        train_throughput.main(["--config", "experiments/configs/cpu-tiny.yaml", "--profile", "-1"])
    assert "--profile -1" in capsys.readouterr().err
