"""The step loop reads the device only at its read points (launcher/step_metrics.py), and logs
what the trainer logged when it read every step's loss (one CPU rank, in-process).

Host reads are counted by wrapping torch.Tensor's read methods and attributing each call to the
first caller outside torch: calls from launcher/, model/ and sagebwd/ count; DeepSpeed's own
(its ZeRO step reads the grad norm, see docs/benchmarks.md) do not, but for the test that points
the hook at DeepSpeed's modules and counts the reads inside `engine.step()`. Reads inside C++ (a
boolean mask's indexing, nonzero) are not seen this way.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import torch

import launcher.train as train_module
from launcher.config import build_run_config
from launcher.journal import Journal

GOLDEN = Path(__file__).parent / "golden" / "train_metrics_cpu.json"
# Read points: step 1 (first), 5 and 10 (eval), 7 (log), 8 (checkpoint), 10 (last): the
# steps 2-4, 6 and 9 are read together with the read point after them.
GOLDEN_RUN = {
    "seed": 1, "model": {"preset": "micro", "qk_norm": True},
    "optimizer": {"lr": 3e-3}, "schedule": {"warmup_steps": 2},
    "train": {"steps": 10, "micro_batch_size": 2, "grad_accum_steps": 2, "log_every": 7},
    "eval": {"every": 5, "batches": 2},
    "checkpoint": {"every": 8},
    "tracking": {"experiment": "golden", "system_metrics": False, "run_name": "golden"},
}
READ_POINTS = [1, 5, 7, 8, 10]
COMPARED = ("loss", "lr", "grad_norm", "tokens_seen", "eval_loss")   # the rest are timings
HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__format__")
OURS = ("launcher", "model", "sagebwd")


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


def cpu_model() -> str:
    """The CPU as its vendor, family and model numbers (/proc/cpuinfo): two x86 parts with the same vector
    capability (AVX512) still round the run's fp32 sums differently in the last bits."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return f"{fields.get('vendor_id', '?')} family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"


def test_logged_values_match_the_golden_of_the_every_step_reads(batched):
    """The golden was captured from the unmodified trainer (commit 412ff0c, which read the loss
    and grad norm every step) on the CPU, torch and thread count it names. There the
    values must be identical; elsewhere CPU kernels may round otherwise, so fp32 rounding."""
    golden = json.loads(GOLDEN.read_text())
    result, metrics, progress = batched
    same_machine = (golden["torch"], golden["cpu_capability"], golden["threads"], golden["cpu_model"]) == (
        torch.__version__, torch.backends.cpu.get_cpu_capability(), torch.get_num_threads(), cpu_model())
    if same_machine:
        assert metrics == golden["metrics"]
        assert progress == golden["progress"]
        assert [list(pair) for pair in result.eval_loss] == golden["eval_loss"]
    else:   # pytest.approx takes one level of dict: compare step by step
        assert metrics.keys() == golden["metrics"].keys()
        for step, values in golden["metrics"].items():
            assert metrics[step] == pytest.approx(values, rel=1e-5), step
    assert [s for s, _ in result.train_loss] == list(range(1, 11))
    assert [v for _, v in result.train_loss] == [metrics[str(s)]["loss"] for s in range(1, 11)]


def test_reading_every_step_logs_the_same_values(batched, tmp_path):
    """log_every 1 makes every step a read point (the old reading pattern): the same numbers,
    on any machine."""
    result, metrics, _ = run(tmp_path, log_every=1)
    assert metrics == batched[1]
    assert result.train_loss == batched[0].train_loss and result.eval_loss == batched[0].eval_loss


def count_host_reads(monkeypatch, steps_done, packages=OURS,
                     skip_torch=()) -> list[tuple[int, str, str]]:
    """-> a list that fills with (steps done, calling module, method) for each read of a
    tensor's value by the code of `packages` (ours by default); a read made inside a torch
    module named in `skip_torch` (e.g. "torch.optim") is left out."""
    events = []

    def caller_outside_torch() -> str | None:
        frame = sys._getframe(2)
        while frame and frame.f_globals.get("__name__", "").split(".")[0] == "torch":
            if frame.f_globals["__name__"].startswith(skip_torch):
                return None
            frame = frame.f_back
        return frame.f_globals.get("__name__", "") if frame else ""

    for name in HOST_READS:
        def read(self, *args, _original=getattr(torch.Tensor, name), _name=name, **kwargs):
            module = caller_outside_torch()
            if module is not None and module.split(".")[0] in packages:
                events.append((steps_done(), module, _name))
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, read)
    return events


def test_the_step_loop_reads_the_device_only_at_read_points(monkeypatch, tmp_path):
    """SageBwd (its simulation on the CPU) and the chunked loss: the model's GPU path, here."""
    returned, reads_at = [], []
    real_step, real_read = train_module.train_step, train_module.read_metrics

    def step(*args):
        returned.append(real_step(*args))
        return returned[-1]

    def read(steps):
        reads_at.append(len(returned))
        return real_read(steps)

    monkeypatch.setattr(train_module, "train_step", step)
    monkeypatch.setattr(train_module, "read_metrics", read)
    events = count_host_reads(monkeypatch, lambda: len(returned))
    result, _, _ = run(tmp_path, model={"attention": "sagebwd", "smoothing": "k",
                                        "loss_impl": "chunked", "loss_chunk_tokens": 48})
    assert result.diverged_at is None and len(result.train_loss) == 10
    # each step hands back device tensors, not numbers: (loss, grad norm), float64 scalars
    assert all(torch.is_tensor(t) and t.dtype == torch.float64 and t.dim() == 0
               for pair in returned for t in pair)
    assert reads_at == READ_POINTS
    assert {done for done, _, _ in events} == set(READ_POINTS), events
    # the hook sees the loop's one read: read_metrics' copy of the pending steps
    assert ("launcher.step_metrics", "tolist") in {(m, how) for _, m, how in events}


def test_the_step_loop_collects_garbage_on_its_schedule(monkeypatch, tmp_path):
    """train.gc_every 4: Python's automatic collector off through the steps, a young collection after steps 4 and
    8 (none else of generation 1 or 2 once the loop runs), the collector back on after the run."""
    import gc

    states, collections, real_step = [], [], train_module.train_step

    def step(*args):
        states.append(gc.isenabled())
        return real_step(*args)

    def record(phase, info):
        if phase == "stop" and info["generation"] > 0:
            collections.append((len(states), info["generation"]))

    monkeypatch.setattr(train_module, "train_step", step)
    gc.callbacks.append(record)
    try:
        result, _, _ = run(tmp_path, gc_every=4)
    finally:
        gc.callbacks.remove(record)
    assert result.diverged_at is None and states == [False] * 10 and gc.isenabled()
    in_loop = [c for c in collections if c[0] >= 1]
    assert in_loop == [(4, 1), (8, 1)], collections


def test_a_stop_signal_between_read_points_ends_its_own_step(monkeypatch, tmp_path):
    """SIGUSR1 during step 3 (not a read point): the step is read, checkpointed and the run
    stops after it, as when every step was read (the vote costs no device read)."""
    real_loss, calls = train_module.lm_loss, []

    def loss_and_a_signal_in_step_3(logits, targets):
        calls.append(1)
        if len(calls) == 3 * GOLDEN_RUN["train"]["grad_accum_steps"]:
            os.kill(os.getpid(), signal.SIGUSR1)
        return real_loss(logits, targets)

    monkeypatch.setattr(train_module, "lm_loss", loss_and_a_signal_in_step_3)
    result, metrics, _ = run(tmp_path)
    assert result.stopped_by == "SIGUSR1" and result.diverged_at is None
    assert [s for s, _ in result.train_loss] == [1, 2, 3] and sorted(metrics, key=int) == ["1", "2", "3"]
    assert (tmp_path / "ckpt" / "latest").read_text() == "step00000003"


HAS_OVERFLOW = ("deepspeed.runtime.zero.stage_1_and_2", "item")      # the overflow check's
INVALID_NORM = ("deepspeed.runtime.utils", "__bool__")                # is_invalid_grad_norm


@pytest.mark.parametrize("check, grad_clip, expected", [
    # the overflow check's .item(), then is_invalid_grad_norm: once in step() because of the
    # check, once per parameter group (decay, no decay) in the clipping
    (True, 1.0, [HAS_OVERFLOW, INVALID_NORM, INVALID_NORM, INVALID_NORM]),
    (False, 1.0, [INVALID_NORM, INVALID_NORM]),     # the clipping's two remain
    (False, 0.0, []),                               # no clipping: none
], ids=["check-on", "check-off", "check-off-no-clip"])
def test_deepspeed_reads_the_device_inside_its_bf16_zero1_step(monkeypatch, tmp_path, check,
                                                               grad_clip, expected):
    """DeepSpeed 0.19.8's own host reads inside `engine.step()`, per optimizer step, in the
    trainer's engine with `train.precision: bf16` (on the CPU: the same ZeRO-1 optimizer code as
    on a GPU) and train.check_grad_overflow on or off (docs/benchmarks.md, "Host reads"). The
    client AdamW's reads are left out: on a GPU it is fused and reads nothing; on the CPU its
    step counter is a host tensor (one .item() per parameter group, not a device read)."""
    calls = []   # one entry per engine.step() call: whether it was an accumulation boundary
    inside = [False]
    real_build = train_module.build_engine

    def build_and_count(*args, **kwargs):
        engine = real_build(*args, **kwargs)
        real_step = engine.step

        def step(*a, **k):
            calls.append(engine.is_gradient_accumulation_boundary())
            inside[0] = True
            try:
                return real_step(*a, **k)
            finally:
                inside[0] = False
        engine.step = step
        return engine

    monkeypatch.setattr(train_module, "build_engine", build_and_count)
    # (engine.step() calls so far, or None for a read outside engine.step())
    events = count_host_reads(monkeypatch, lambda: len(calls) if inside[0] else None,
                              packages=("deepspeed",), skip_torch=("torch.optim",))
    steps = 3
    raw = json.loads(json.dumps(GOLDEN_RUN))
    raw["train"].update(steps=steps, precision="bf16", check_grad_overflow=check)
    raw["optimizer"]["grad_clip"] = grad_clip
    raw["checkpoint"] = {}
    raw["tracking"]["tracking_uri"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = train_module.train(build_run_config(raw), say=lambda _: None)
    assert result.diverged_at is None and len(result.train_loss) == steps
    accum = GOLDEN_RUN["train"]["grad_accum_steps"]
    assert calls == ([False] * (accum - 1) + [True]) * steps
    # per engine.step() call (numbered from 1): the expected reads at each boundary, none else
    per_call = [[(module, how) for n, module, how in events if n == i]
                for i in range(1, len(calls) + 1)]
    assert per_call == [expected if boundary else [] for boundary in calls], events
    # and DeepSpeed reads nothing outside engine.step() (forward, backward, the grad norm, eval)
    assert [e for e in events if e[0] is None] == []
