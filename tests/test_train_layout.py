"""World layout and TPS arithmetic (launcher.layout), DeepSpeed config derivation,
checkpoint markers and MFU, without starting any process group."""
from __future__ import annotations

import pytest

from launcher import checkpoint
from launcher.config import build_run_config
from launcher.engine import deepspeed_config
from launcher.layout import resolve_layout
from launcher.overrides import ConfigError
from launcher.throughput import mfu, train_flops_per_token


def config(model=None, train=None, parallel=None):
    return build_run_config({"model": {"preset": "llama-325m", **(model or {})},
                             "train": {"steps": 10, "micro_batch_size": 8, **(train or {})},
                             "parallel": parallel or {}})


@pytest.mark.parametrize("tps, world, sp, micro, accum", [
    (2_097_152, 64, 1, 8, 1),     # the paper's 2.1M = 512 x 4096 on 64 GPUs
    (2_097_152, 8, 1, 8, 8),      # ... on one 8-GPU node
    (2_097_152, 8, 2, 8, 16),     # SP 2 halves DP, doubles accumulation
    (262_144, 8, 1, 8, 1),        # 260K = 64 x 4096
    (262_144, 4, 4, 16, 4),
])
def test_tokens_per_step_resolves_to_micro_accum_dp(tps, world, sp, micro, accum):
    layout = resolve_layout(config(train={"tokens_per_step": tps, "micro_batch_size": micro},
                                   parallel={"sp": sp}), world)
    assert (layout.dp, layout.sp, layout.grad_accum) == (world // sp, sp, accum)
    assert layout.tokens_per_step == tps and layout.global_batch * 4096 == tps


def test_without_a_target_the_world_sets_the_tokens():
    layout = resolve_layout(config(train={"grad_accum_steps": 2}), 4)
    assert layout.tokens_per_step == 8 * 2 * 4 * 4096


@pytest.mark.parametrize("train, parallel, world, message", [
    ({"tokens_per_step": 262_144, "micro_batch_size": 3}, {}, 8,
     "train.tokens_per_step (262,144 = 64 sequences of 4096) cannot be met with "
     "train.micro_batch_size (3) x 8 data-parallel ranks"),
    ({"tokens_per_step": 262_144, "grad_accum_steps": 2}, {}, 8,
     "train.grad_accum_steps (2) contradicts train.tokens_per_step (262,144)"),
    ({}, {"sp": 4}, 6, "parallel.sp (4) must divide the world size (6 processes)"),
])
def test_layouts_that_cannot_work_name_the_keys(train, parallel, world, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_layout(config(train=train, parallel=parallel), world)


@pytest.mark.parametrize("model, train, parallel, message", [
    ({}, {}, {"sp": 3}, "model.num_heads (16) must be divisible by parallel.sp (3)"),
    ({"num_heads": 8, "hidden_size": 512, "seq_len": 100}, {}, {"sp": 8},
     "model.seq_len (100) must be divisible by parallel.sp (8)"),
    ({}, {"tokens_per_step": 5000}, {}, "train.tokens_per_step (5000) must be a whole number"),
    ({}, {}, {"zero_stage": 4}, "parallel.zero_stage"),
])
def test_static_layout_errors_fail_validation(model, train, parallel, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config(model=model, train=train, parallel=parallel)


def test_deepspeed_config_follows_the_run_config():
    cfg = config(train={"tokens_per_step": 2_097_152, "precision": "bf16"},
                 parallel={"sp": 2, "zero_stage": 3})
    ds = deepspeed_config(cfg, resolve_layout(cfg, 8))
    assert ds["train_micro_batch_size_per_gpu"] == 8 and ds["gradient_accumulation_steps"] == 16
    assert ds["zero_optimization"] == {"stage": 3}
    assert ds["bf16"] == {"enabled": True, "check_grad_overflow": False}   # off: launcher/config.py says why
    assert "sequence_parallel_size" not in ds  # see launcher.engine: issue 5248


def test_the_bf16_overflow_check_reaches_deepspeed_and_deepspeed_reads_it():
    """train.check_grad_overflow (launcher/config.py) is DeepSpeed's bf16.check_grad_overflow:
    in the JSON, and in the config DeepSpeed parses from it."""
    from deepspeed.runtime.precision_config import get_bfloat16_config

    for given, expected in (({}, False), ({"check_grad_overflow": True}, True),
                            ({"check_grad_overflow": False}, False)):
        cfg = config(train={"precision": "bf16", **given})
        ds = deepspeed_config(cfg, resolve_layout(cfg, 1))
        assert ds["bf16"] == {"enabled": True, "check_grad_overflow": expected}
        assert get_bfloat16_config(ds).check_grad_overflow is expected
    with pytest.raises(ConfigError, match="train.check_grad_overflow"):
        config(train={"check_grad_overflow": "sometimes"})


def test_fp32_gradient_accumulation_is_named_to_deepspeed_only_where_it_applies():
    """train.grad_accum_dtype (launcher/config.py): DeepSpeed's data_types.grad_accum_dtype only for
    fp32 with bf16 weights (its BF16_Optimizer at ZeRO 1); unnamed otherwise, as before the key
    existed (DeepSpeed then accumulates in the model's dtype; naming bf16 would refuse fp32 runs at
    ZeRO 0). Other ZeRO stages with fp32 are a config error that says what to change."""
    for precision, dtype, expected in (("bf16", "fp32", {"grad_accum_dtype": "fp32"}), ("bf16", "bf16", None),
                                       ("fp32", "fp32", None)):
        cfg = config(train={"precision": precision, "grad_accum_dtype": dtype})
        assert deepspeed_config(cfg, resolve_layout(cfg, 1)).get("data_types") == expected
    assert "data_types" not in deepspeed_config(config(), resolve_layout(config(), 1))
    with pytest.raises(ConfigError, match="train.grad_accum_dtype fp32 needs parallel.zero_stage 1"):
        config(train={"grad_accum_dtype": "fp32"}, parallel={"zero_stage": 2})
    with pytest.raises(ConfigError, match="train.grad_accum_dtype"):
        config(train={"grad_accum_dtype": "fp16"})


def test_resume_auto_without_a_dir_or_with_a_bad_marker(tmp_path):
    with pytest.raises(ConfigError, match="needs checkpoint.dir"):
        checkpoint.resolve_resume("auto", None)
    assert checkpoint.resolve_resume("auto", str(tmp_path)) is None  # fresh start
    (tmp_path / "latest").write_text("step00000007")
    with pytest.raises(ConfigError, match="step00000007.*missing"):
        checkpoint.resolve_resume("auto", str(tmp_path))
    (tmp_path / "step00000007").mkdir()
    assert checkpoint.resolve_resume("auto", str(tmp_path)) == (tmp_path, "step00000007")
    assert checkpoint.resolve_resume(str(tmp_path / "step00000007"), None) == (
        tmp_path, "step00000007")
    with pytest.raises(ConfigError, match="no checkpoint there"):
        checkpoint.resolve_resume(str(tmp_path / "nothing"), None)


def test_flops_per_token_matches_the_planner_and_mfu_is_a_fraction():
    from launcher.flops import flops_per_token as planned

    m = config().model
    assert train_flops_per_token(m) == planned(hidden=m.hidden_size, layers=m.num_layers,
                                               ffn=m.ffn_hidden_size, vocab=m.padded_vocab_size,
                                               seq_len=m.seq_len)
    assert mfu(100_000, 1e9, 1000.0) == pytest.approx(0.1)


def test_bench_parallel_layouts_name_dp_and_sp():
    from launcher.bench_parallel import layouts

    assert layouts(4, ["dp4", "dp2xsp2", "sp4"]) == [
        ("dp4", ["parallel.sp=1"]), ("dp2xsp2", ["parallel.sp=2"]), ("sp4", ["parallel.sp=4"])]
    assert [name for name, _ in layouts(2)] == ["dp2", "sp2"]
    with pytest.raises(ValueError, match="needs 3 GPUs"):
        layouts(4, ["dp3"])
    with pytest.raises(ValueError, match="dpAxspB"):
        layouts(4, ["dp2-sp2"])


def test_bench_parallel_compile_variants_and_table(tmp_path):
    """--compile both runs each cell eager and compiled; the table, read back from a real
    sqlite MLflow store, marks the compiled run and takes medians after the warm-up steps."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from launcher.bench_parallel import WARMUP_STEPS_SKIPPED, compile_variants, table

    assert compile_variants("off") == [("", ["train.compile=false"])]
    assert compile_variants("both") == [("", ["train.compile=false"]),
                                        ("-compiled", ["train.compile=true"])]
    store = tmp_path / "mlflow.db"
    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.create_experiment("bench")
    for name, compiled, speed in [("fpa-sp2", False, 100.0), ("fpa-sp2-compiled", True, 160.0)]:
        run = client.create_run(experiment, run_name=name)
        params = {"derived.dp": "1", "derived.sp": "2", "derived.micro_batch": "4",
                  "model.seq_len": "4096", "parallel.zero_stage": "1", "train.compile": str(compiled)}
        # compilation makes the first steps slow; they must not reach the median
        steps = [1.0] * WARMUP_STEPS_SKIPPED + [speed] * 5
        client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in params.items()],
                         metrics=[Metric("tokens_per_s", v, 0, i) for i, v in enumerate(steps)]
                         + [Metric("loss", 5.0, 0, i) for i in range(len(steps))])
        client.set_terminated(run.info.run_id)
    rows = table(store, "bench").splitlines()[2:]
    assert len(rows) == 2
    assert "ZeRO 1 |" in rows[0] and "| 100 |" in rows[0]
    assert "ZeRO 1, compiled |" in rows[1] and "| 160 |" in rows[1]
