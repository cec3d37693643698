"""launcher.profile_step: one device, no DeepSpeed, where a training step's time goes."""
from __future__ import annotations

import pytest
import yaml

from launcher import profile_step

RUN = {
    "seed": 3,
    "model": {"preset": "micro", "num_layers": 2, "attention": "sagebwd", "smoothing": "k"},
    "train": {"steps": 1, "micro_batch_size": 2},
    "tracking": {"experiment": "test-profile-step", "system_metrics": False},
}


@pytest.fixture()
def config_path(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(RUN))
    return path


def test_prints_the_step_time_and_its_top_ops(config_path, capsys):
    assert profile_step.main(["--config", str(config_path), "--steps", "1", "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "attention=sagebwd" in out and "ms per step (wall)" in out and "ms to issue its forward + backward" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "ms per step" not in line]
    assert 1 <= len(rows) <= 5, out
    # the op's simulation on the CPU is part of the step (its matmuls at least)
    assert any(float(r.split("|")[1]) > 0 for r in rows)


def test_the_step_compiles_with_the_op_inside(config_path, capsys):
    # aot_eager: dynamo's tracing and the autograd graph, no code generation (that needs a GPU to matter)
    argv = ["--config", str(config_path), "--steps", "1", "--top", "3", "--compile", "default",
            "--compile-backend", "aot_eager"]
    assert profile_step.main(argv) == 0
    assert "compile=default" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--steps", "0"], "--steps 0: give a positive count"),
    (["--top", "-1"], "--top -1: give a positive count"),
    (["--compile", "default", "--compile-backend", "tensorrtx"], "--compile-backend tensorrtx: not a torch.compile"),
])
def test_rejects_counts_below_one(config_path, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        profile_step.main(["--config", str(config_path), *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_bad_config_key_is_an_error_not_a_traceback(config_path, capsys):
    assert profile_step.main(["--config", str(config_path), "--set", "model.attention=int4"]) == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("loss_impl", ["plain", "chunked"])
def test_the_step_runs_the_configured_loss(tmp_path, loss_impl):
    """The profiled step computes the trainer's loss (launcher.train.micro_batch_loss): with
    model.loss_impl chunked, a logsumexp per chunk of tokens and no whole-batch log-softmax."""
    from launcher.config import load_run_config

    run = {**RUN, "model": {**RUN["model"], "attention": "fpa", "smoothing": "none", "loss_impl": loss_impl}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run))
    config = load_run_config(path)
    tokens = config.train.micro_batch_size * config.model.seq_len
    config = config.model_copy(update={"model": config.model.model_copy(update={"loss_chunk_tokens": tokens // 4})})
    result = profile_step.profile_step(config, steps=1, top=1000)
    rows = result["rows"]
    assert min(result["issue_ms"]) > 0 and result["timeline"] is None   # on the CPU: no device timeline
    calls = {name: count for _, count, name in rows}
    if loss_impl == "chunked":
        assert calls.get("aten::logsumexp", 0) >= 4, sorted(calls)
        assert "aten::_log_softmax" not in calls, sorted(calls)
    else:
        assert calls.get("aten::_log_softmax") == 1, sorted(calls)
        assert "aten::logsumexp" not in calls, sorted(calls)


def test_device_timeline_splits_the_span_into_busy_overlap_and_idle_gaps():
    """Two steps of kernels (us): a, b on two streams at once, a gap, c; the union, the overlap and the gaps
    between named kernels, per step."""
    kernels = [(0, 10, "a"), (5, 12, "b"), (20, 30, "c"),            # step 1: busy 12 + 10, overlap 5, gap 8
               (40, 50, "a"), (45, 52, "b"), (60, 70, "c")]          # step 2: the same, 10 us after step 1's c
    t = profile_step.device_timeline(kernels, steps=2)
    assert t["span_ms"] == pytest.approx(70 / 2000)
    assert t["busy_ms"] == pytest.approx(44 / 2000)
    assert t["overlap_ms"] == pytest.approx(10 / 2000)
    assert t["idle_ms"] == pytest.approx(26 / 2000)
    assert t["gaps"] == [[pytest.approx(16 / 2000), 1.0, "b -> c"], [pytest.approx(10 / 2000), 0.5, "c -> a"]]
    assert sum(ms for ms, _, _ in t["gaps"]) == pytest.approx(t["idle_ms"])
    empty = profile_step.device_timeline([], steps=1)
    assert empty["busy_ms"] == 0.0 and empty["gaps"] == []


def test_the_replay_host_script_refuses_counts_below_one():
    """docs/measurements/replay-host.py (the CUDA graph trees' host time) names a bad count before it needs a GPU."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "docs/measurements/replay-host.py", "--attention", "token", "--steps", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--steps 0 --top 18: give positive counts" in proc.stderr, proc.stderr
