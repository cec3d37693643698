"""Run config: YAML + overrides -> validated RunConfig, with errors that name the key."""
from __future__ import annotations

import math

import pytest
import yaml

from launcher.config import ScheduleConfig, build_run_config, load_run_config
from launcher.overrides import ConfigError, apply_overrides, parse_override
from launcher.schedule import lr_multiplier

BASE = {"model": {"preset": "micro"}, "train": {"steps": 10, "micro_batch_size": 2}}


def write(tmp_path, raw) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_yaml_and_overrides_resolve_presets_and_types(tmp_path):
    cfg = load_run_config(write(tmp_path, BASE), [
        "optimizer.lr=3e-4", "model.attention=sagebwd", "model.smoothing=qk",
        "model.qk_norm=true", "train.grad_accum_steps=4", "tracking.run_name=abc"])
    assert cfg.optimizer.lr == 3e-4 and isinstance(cfg.optimizer.lr, float)
    assert cfg.model.hidden_size == 128 and cfg.model.seq_len == 64  # from the preset
    assert (cfg.model.smooth_q, cfg.model.smooth_k, cfg.model.qk_norm) == (True, True, True)
    assert cfg.tokens_per_step == 2 * 4 * 64
    assert cfg.tracking.run_name == "abc"
    resolved = cfg.to_dict()
    assert resolved["model"]["num_layers"] == 1 and resolved["model"]["preset"] == "micro"
    assert build_run_config(resolved) == cfg  # the logged config rebuilds the same run


def test_explicit_model_fields_override_the_preset(tmp_path):
    raw = {**BASE, "model": {"preset": "micro", "num_layers": 3}}
    assert load_run_config(write(tmp_path, raw)).model.num_layers == 3


@pytest.mark.parametrize("overrides,message", [
    (["model.n_layers=3"], r"model\.n_layers: unknown key"),
    (["trian.steps=3"], r"trian: unknown key"),
    (["train.steps=many"], r"train\.steps: .*valid integer.*'many'"),
    (["train.steps=0"], r"train\.steps: .*greater than 0"),
    (["train.gc_every=-1"], r"train\.gc_every: .*greater than or equal to 0"),
    (["optimizer.lr=-1"], r"optimizer\.lr: .*greater than 0"),
    (["model.attention=sagebwd", "model.seq_len=80"], r"seq_len \(80\) must be a multiple of"),
    (["model.smoothing=k"], r"only applies to attention='sagebwd'"),
    (["schedule.warmup_steps=11"], r"warmup_steps \(11\) exceeds train\.steps \(10\)"),
    (["schedule.min_lr_ratio=2"], r"schedule\.min_lr_ratio"),
    (["model.preset=gpt5"], r"unknown model preset 'gpt5'"),
    (["train.compile=sometimes"], r"train\.compile: .*valid boolean.*'sometimes'"),
    (["train.compile_mode=max-autotune"], r"train\.compile_mode: .*'default' or 'reduce-overhead'"),
    (["train.compile_mode=reduce-overhead"], r"compile_mode reduce-overhead needs train\.compile: true"),
    (["train.compile=true", "train.compile_mode=reduce-overhead", "parallel.sp=2"],
     r"compile_mode reduce-overhead runs with parallel\.sp 1 only .* not 2"),
])
def test_bad_values_are_reported_with_their_key(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(write(tmp_path, BASE), overrides)


def test_every_problem_is_reported_at_once(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_run_config(write(tmp_path, BASE), ["train.steps=x", "eval.every=0", "foo=1"])
    text = str(err.value)
    assert "train.steps" in text and "eval.every" in text and "foo: unknown key" in text


def test_missing_section_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"train: required but not set"):
        load_run_config(write(tmp_path, {"model": {"preset": "micro"}}))
    with pytest.raises(ConfigError, match="does not exist"):
        load_run_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize("text,message", [
    ("optimizer.lr", "must look like key.path=value"),
    ("=3", "must look like key.path=value"),
    ("a..b=3", "empty key segment"),
])
def test_malformed_overrides(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_override(text)


def test_override_cannot_descend_into_a_value():
    with pytest.raises(ConfigError, match="is a value"):
        apply_overrides({"train": {"steps": 3}}, ["train.steps.max=4"])


def test_overrides_do_not_mutate_the_input():
    raw = {"train": {"steps": 3}}
    assert apply_overrides(raw, ["train.steps=5", "eval.every=2"]) == {
        "train": {"steps": 5}, "eval": {"every": 2}}
    assert raw == {"train": {"steps": 3}}


def test_warmup_then_cosine_to_the_floor():
    sched = ScheduleConfig(warmup_steps=10, min_lr_ratio=0.1)
    lrs = [lr_multiplier(s, 110, sched) for s in range(110)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(b > a for a, b in zip(lrs[:10], lrs[1:10]))        # linear warmup
    assert all(b <= a for a, b in zip(lrs[10:], lrs[11:]))        # then never rises
    assert lrs[-1] == pytest.approx(0.1)                           # ends at the floor
    mid = 10 + 99 // 2
    assert lrs[mid] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 49 / 99)))
