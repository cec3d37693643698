"""Manifests: expansion of the shipped grids, layout arithmetic, and the errors a bad
manifest gets (each naming the file and the key), plus the local executor on the CPU."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from experiments.grid.errors import ManifestError
from experiments.grid.plan import plan_manifest
from experiments.paths import REPO_ROOT

PYTHON = sys.executable
SMOKE_BASE = {
    "name": "t", "node": "cpu", "base_config": "experiments/configs/cpu-tiny.yaml",
    "overrides": {"model.preset": "micro", "model.block_q": 32, "model.block_kv": 32},
    "tps": {"128": {"tokens": 128, "steps": 4, "warmup_steps": 1}},
}


def write_manifest(tmp_path: Path, raw: dict, name: str = "manifest.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def manifest_error(tmp_path, raw, **kwargs) -> str:
    path = write_manifest(tmp_path, raw)
    with pytest.raises(ManifestError) as err:
        plan_manifest(path, **kwargs)
    message = str(err.value)
    assert str(path) in message, message
    return message


# --- the shipped manifests -------------------------------------------------------------

def test_main_on_b200_is_the_papers_grid():
    plan = plan_manifest("main", node="b200", check_paths=False)
    runs = {r.name: r for r in plan.runs}
    assert list(runs) == [
        "main-tps2.1m-fpa-qknorm", "main-tps260k-fpa-qknorm",
        "main-tps2.1m-sagebwd-qknorm-k", "main-tps2.1m-sagebwd-noqknorm-k",
        "main-tps260k-sagebwd-qknorm-k", "main-tps260k-sagebwd-noqknorm-k"]
    big, small = runs["main-tps2.1m-sagebwd-qknorm-k"], runs["main-tps260k-sagebwd-qknorm-k"]
    # 2.1M = 512 x 4096 over 8 GPUs: 64 sequences per rank = micro 8 x accum 8.
    assert (big.world, big.layout.micro_batch, big.layout.grad_accum) == (8, 8, 8)
    assert big.layout.global_batch * 4096 == big.tps == 2097152
    assert (big.steps, small.steps) == (37500, 300000)
    assert (small.layout.micro_batch, small.layout.grad_accum, small.layout.global_batch) == (8, 1, 64)
    assert big.tokens == small.tokens == 78_643_200_000   # the same token budget
    assert "--set" in big.argv and "model.smoothing=k" in big.argv
    assert "schedule.warmup_steps=1000" in big.argv and "schedule.warmup_steps=7500" in small.argv
    assert "tracking.run_name=main-tps2.1m-sagebwd-qknorm-k" in big.argv
    # the trainer tags its MLflow run with the manifest's TPS label, which compare shows
    assert "tracking.tps_label=2.1m" in big.argv and "tracking.tps_label=260k" in small.argv
    assert plan.experiment == "sagebwd-main"


def test_names_are_stable_and_node_independent():
    b200 = [r.name for r in plan_manifest("main", node="b200", check_paths=False).runs]
    again = [r.name for r in plan_manifest("main", node="b200", check_paths=False).runs]
    rtx = plan_manifest("main", node="rtx4090", check_paths=False).runs
    assert b200 == again == [r.name for r in rtx]
    # 24 GB: micro-batch 1, so 2.1M TPS needs 64 accumulation steps per rank.
    assert (rtx[0].layout.micro_batch, rtx[0].layout.grad_accum) == (1, 64)


def test_ablation_covers_none_k_qk_at_both_tps():
    names = [r.name for r in plan_manifest("ablation-smoothing", check_paths=False).runs]
    for tps in ("2.1m", "260k"):
        assert f"ablation-smoothing-tps{tps}-fpa-qknorm" in names
        for smoothing in ("none", "k", "qk"):
            assert f"ablation-smoothing-tps{tps}-sagebwd-qknorm-{smoothing}" in names
    assert len(names) == 8


def test_quant_is_a_grid_axis():
    runs = {r.name: r for r in plan_manifest("quant-contracts", check_paths=False).runs}
    for tps in ("2.1m", "260k"):
        block, token = runs[f"quant-contracts-tps{tps}-sagebwd-qknorm-k"], \
            runs[f"quant-contracts-tps{tps}-sagebwd-qknorm-k-token"]
        assert "model.quant=token" in token.argv and "model.quant=block" in block.argv
        assert (block.axes["quant"], token.axes["quant"]) == ("block", "token")
        assert "quant" not in runs[f"quant-contracts-tps{tps}-fpa-qknorm"].axes
    assert len(runs) == 6


def test_paper_small_is_the_papers_grid_scaled_to_one_gpu():
    """Issue 25's grid: Figure 1 with three seeds, the smoothing ablation, the token row (three seeds)."""
    plan = plan_manifest("paper-small", node="h100-1", check_paths=False)
    runs = {r.name: r for r in plan.runs}
    seeds = ("s0", "s1", "s2")
    figure1 = [f"paper-small-tps{t}-{cell}-{s}" for t in ("128k", "16k")
               for cell in ("fpa-qknorm", "sagebwd-qknorm-k") for s in seeds]
    figure1 += [f"paper-small-tps128k-sagebwd-noqknorm-k-{s}" for s in seeds]
    ablation = [f"paper-small-tps{t}-sagebwd-qknorm-{m}-s0" for t in ("128k", "16k") for m in ("none", "qk")]
    token = [f"paper-small-tps{t}-sagebwd-qknorm-k-token-{s}" for t in ("128k", "16k") for s in seeds]
    assert sorted(runs) == sorted(figure1 + ablation + token) and len(runs) == 25
    assert not any("tps16k-sagebwd-noqknorm" in name for name in runs)  # no-QK-norm: large TPS only
    for t in ("128k", "16k"):  # the token row matches Figure 1's block cell but for the contract
        token_run, block_run = runs[f"paper-small-tps{t}-sagebwd-qknorm-k-token-s0"], \
            runs[f"paper-small-tps{t}-sagebwd-qknorm-k-s0"]
        assert "model.quant=token" in token_run.argv and "model.quant=token" not in block_run.argv
        assert (token_run.axes["quant"], block_run.axes["quant"]) == ("token", "block")
    for name, run in runs.items():  # the seed is the variant's only override
        assert f"seed={int(name[-1])}" in run.argv and run.axes["variant"] == name[-2:]
    big, small = runs["paper-small-tps128k-fpa-qknorm-s0"], runs["paper-small-tps16k-fpa-qknorm-s0"]
    assert big.tps == 8 * small.tps == 131072 and big.layout.global_batch * 1024 == big.tps
    assert {r.tokens for r in runs.values()} == {2**24}  # one token budget at both TPS
    assert "schedule.warmup_steps=12" in big.argv and "schedule.warmup_steps=96" in small.argv
    assert (big.world, big.gpus_per_node) == (1, 1)


def test_paper_small_model_and_its_gpu_estimate():
    """The size and GPU time the manifest's comments and docs/results.md quote."""
    from launcher.config import load_run_config
    from launcher.flops import BF16_DENSE_PEAK_TFLOPS, train_flops_per_token

    plan = plan_manifest("paper-small", node="h100-1", check_paths=False)
    config = load_run_config(plan.runs[0].base_config, list(plan.runs[0].overrides))
    m = config.model
    assert (m.seq_len, m.hidden_size, m.num_layers, m.num_heads, m.head_dim) == (1024, 512, 8, 8, 64)
    body = m.num_layers * (4 * m.hidden_size**2 + 3 * m.hidden_size * m.ffn_hidden_size)
    assert round(body / 1e6, 1) == 27.3 and round((body + m.padded_vocab_size * m.hidden_size) / 1e6) == 53
    flops = train_flops_per_token(m)
    assert round(flops / 1e6) == 343
    total = sum(r.tokens for r in plan.runs) * flops
    minutes = total / (0.30 * BF16_DENSE_PEAK_TFLOPS["H100"] * 1e12) / 60
    assert round(minutes, 1) == 8.1
    lr = plan_manifest("paper-small-lr", node="h100-1", check_paths=False).runs
    assert [r.name.rsplit("-", 1)[1] for r in lr] == [
        "lr0.0005", "lr0.001", "lr0.002", "lr0.004", "lr0.008", "lr0.016", "lr0.032"]
    assert {r.tps for r in lr} == {131072} and {r.tokens for r in lr} == {2**24}
    assert all(r.axes["attention"] == "fpa" and r.axes["qk_norm"] == "true" for r in lr)


def test_non_training_manifests_expand_to_trace_commands():
    sigma = plan_manifest("sigma-sweep", check_paths=False)
    assert [r.name for r in sigma.runs] == ["sigma-sweep-seq1024-causal", "sigma-sweep-seq1024-full",
                                            "sigma-sweep-seq4096-causal", "sigma-sweep-seq4096-full"]
    argv = sigma.runs[0].argv
    assert argv[1:4] == ("-m", "sagebwd.trace", "sigma") and "--causal" in argv
    assert str(sigma.runs[0].run_dir / "sigma.json") in argv
    trace = plan_manifest("intermediate-trace", check_paths=False)
    assert {r.name for r in trace.runs} == {"intermediate-trace-k", "intermediate-trace-qk"}


def test_every_shipped_manifest_and_node_profile_loads():
    from experiments.paths import MANIFESTS_DIR
    from experiments.grid.nodes import available_nodes, load_node_profile

    assert set(available_nodes()) >= {"b200", "rtx4090", "h100", "h200", "h100-1", "cpu"}
    assert load_node_profile("b200").bf16_peak_tflops == 2250
    for path in MANIFESTS_DIR.glob("*.yaml"):
        assert plan_manifest(path, check_paths=False).runs, path


def test_only_selects_by_glob_and_says_when_nothing_matches():
    plan = plan_manifest("main", only="main-tps260k-*", check_paths=False)
    assert [r.name for r in plan.runs] == ["main-tps260k-fpa-qknorm", "main-tps260k-sagebwd-qknorm-k",
                                           "main-tps260k-sagebwd-noqknorm-k"]
    with pytest.raises(ManifestError, match="matches no run"):
        plan_manifest("main", only="nope-*", check_paths=False)


# --- errors name the file and the key ----------------------------------------------------

def test_unknown_keys_are_named(tmp_path):
    message = manifest_error(tmp_path, {**SMOKE_BASE, "gird": []})
    assert "gird: unknown key" in message
    message = manifest_error(tmp_path, {**SMOKE_BASE, "grid": [{"attention": ["fpa"], "qknorm": [True]}]})
    assert "grid[0].qknorm: unknown key" in message


def test_an_unknown_quant_contract_is_named(tmp_path):
    raw = {**SMOKE_BASE, "grid": [{"attention": ["sagebwd"], "quant": ["int4"]}]}
    assert "grid[0].quant[0]" in manifest_error(tmp_path, raw)


def test_wrong_types_are_named(tmp_path):
    message = manifest_error(tmp_path, {**SMOKE_BASE, "grid": [{"qk_norm": ["maybe"]}]})
    assert "grid[0].qk_norm[0]" in message and "maybe" in message
    message = manifest_error(tmp_path, {**SMOKE_BASE, "tps": {"x": {"tokens": "lots", "steps": 1,
                                                                     "warmup_steps": 0}}})
    assert "tps.x.tokens" in message
    message = manifest_error(tmp_path, {**SMOKE_BASE, "grid": [{"smoothing": ["q"]}]})
    assert "grid[0].smoothing[0]" in message


def test_a_tps_the_node_cannot_reach(tmp_path):
    # 3 sequences of 4096 cannot split over the 8 data-parallel ranks of a B200 node.
    raw = {**SMOKE_BASE, "node": "b200", "base_config": "experiments/manifests/base/paper-325m.yaml",
           "overrides": {}, "tps": {"12k": {"tokens": 3 * 4096, "steps": 10, "warmup_steps": 1}}}
    message = manifest_error(tmp_path, raw, check_paths=False)
    assert "tps.12k.tokens" in message and "DP=8" in message
    raw["tps"] = {"odd": {"tokens": 4096 * 8 + 1, "steps": 10, "warmup_steps": 1}}
    assert "tps.odd.tokens" in manifest_error(tmp_path, raw, check_paths=False)


def test_sequence_parallel_must_divide_world_seq_and_heads(tmp_path):
    raw = {**SMOKE_BASE, "node": "b200", "base_config": "experiments/manifests/base/paper-325m.yaml",
           "overrides": {}, "parallel": {"sp": 3},
           "tps": {"2.1m": {"tokens": 2097152, "steps": 10, "warmup_steps": 1}}}
    message = manifest_error(tmp_path, raw, check_paths=False)
    assert "parallel.sp" in message and "world size (8)" in message


def test_a_missing_data_path_is_named_before_anything_runs(tmp_path):
    raw = {**SMOKE_BASE, "overrides": {**SMOKE_BASE["overrides"], "data.path": "data/nowhere"}}
    message = manifest_error(tmp_path, raw)
    assert "overrides.data.path" in message and "data_prep prepare" in message
    assert plan_manifest(write_manifest(tmp_path, raw), check_paths=False).runs


def test_overrides_may_not_touch_what_the_layout_computes(tmp_path):
    raw = {**SMOKE_BASE, "overrides": {**SMOKE_BASE["overrides"], "train.micro_batch_size": 4}}
    assert "overrides.train.micro_batch_size" in manifest_error(tmp_path, raw)


def test_a_cell_the_trainer_would_reject_is_named(tmp_path):
    # FPA has no quantisation to precondition: the run config forbids smoothing there.
    raw = {**SMOKE_BASE, "grid": [{"attention": ["fpa"], "smoothing": ["k"]}]}
    message = manifest_error(tmp_path, raw)
    assert "grid[0]" in message and "model.smoothing" in message


def test_grid_must_reference_defined_tps_points(tmp_path):
    message = manifest_error(tmp_path, {**SMOKE_BASE, "grid": [{"tps": ["2.1m"]}]})
    assert "grid[0].tps" in message and "'2.1m'" in message


def test_command_manifest_problems(tmp_path):
    raw = {"name": "c", "kind": "command", "node": "cpu", "command": ["{python}", "{nope}"],
           "inputs": {"x": "missing/file.pt"}}
    assert "command: unknown placeholder {nope}" in manifest_error(tmp_path, raw)
    raw["command"] = ["{python}", "{inputs.x}"]
    assert "inputs.x: missing/file.pt does not exist" in manifest_error(tmp_path, raw)


def test_node_profiles_are_validated(tmp_path):
    with pytest.raises(ManifestError, match="unknown node profile 'b300'"):
        plan_manifest("main", node="b300", check_paths=False)
    bad = tmp_path / "mynode.yaml"
    bad.write_text(yaml.safe_dump({"name": "mynode", "accelerator": "gpu", "gpus_per_node": 0,
                                   "gpu_memory_gib": 1, "default_micro_batch": 1, "zero_stage": 5}))
    with pytest.raises(ManifestError) as err:
        plan_manifest("main", node=str(bad), check_paths=False)
    assert str(bad) in str(err.value) and "zero_stage" in str(err.value)


# --- the CLI and the local executor ------------------------------------------------------

def run_cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "experiments", *args], cwd=REPO_ROOT, text=True,
                          capture_output=True, timeout=300, **kwargs)


def test_expand_prints_the_run_table():
    out = run_cli("expand", "main", "--node", "b200")
    assert out.returncode == 0, out.stderr
    assert "main-tps2.1m-sagebwd-qknorm-k" in out.stdout and "78.6B" in out.stdout
    header = out.stdout.splitlines()[1].split()
    assert header[:2] == ["name", "tps"] and {"world", "accum", "steps", "tokens"} <= set(header)


def test_expand_of_an_invalid_manifest_exits_2_naming_file_and_key(tmp_path):
    path = write_manifest(tmp_path, {**SMOKE_BASE, "grid": [{"attention": ["int4"]}]})
    out = run_cli("expand", str(path))
    assert out.returncode == 2
    assert f"{path}: grid[0].attention[0]" in out.stderr


def test_local_executor_runs_the_smoke_grid_with_the_real_trainer(tmp_path):
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    out = run_cli("run", "smoke", "--only", "smoke-tps128-fpa-qknorm", "--runs-dir",
                  str(tmp_path / "runs"), env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "1/1 runs finished" in out.stdout
    log = tmp_path / "runs" / "smoke" / "smoke-tps128-fpa-qknorm" / "local.log"
    assert "step 6/6" in log.read_text()

    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("sagebwd-smoke")
    runs = client.search_runs([experiment.experiment_id])
    by_name = {r.info.run_name: r for r in runs}
    assert by_name["smoke-tps128-fpa-qknorm"].info.status == "FINISHED"
    assert by_name["smoke@cpu"].data.tags["sagebwd.role"] == "grid"   # the grid's parent run
    assert by_name["smoke-tps128-fpa-qknorm"].data.tags.get("mlflow.parentRunId") == \
        by_name["smoke@cpu"].info.run_id


def test_run_rejects_a_parallel_count_below_one_before_planning():
    out = run_cli("run", "smoke", "--parallel", "0")
    assert out.returncode == 2 and "--parallel: '0': give how many runs may share" in out.stderr
    assert "smoke-tps128" not in out.stdout   # no plan table: nothing was planned


def test_local_executor_runs_jobs_side_by_side_into_one_store(tmp_path):
    """--parallel 2: both smoke runs at once, each logging to its own local.log, one parent run."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    out = run_cli("run", "smoke", "--parallel", "2", "--runs-dir", str(tmp_path / "runs"), env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "2/2 runs finished" in out.stdout
    names = ["smoke-tps128-fpa-qknorm", "smoke-tps128-sagebwd-qknorm-k"]
    for name in names:
        assert "step 6/6" in (tmp_path / "runs" / "smoke" / name / "local.log").read_text()
        assert f"{name} finished in" in out.stdout
    assert "step 6/6" not in out.stdout   # the runs' own output went to their logs

    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("sagebwd-smoke")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {*names, "smoke@cpu"}
    parent = runs["smoke@cpu"].info.run_id
    for name in names:   # finished, and nested under the grid's parent run (the MLflow UI folds them)
        assert runs[name].info.status == "FINISHED"
        assert runs[name].data.tags.get("mlflow.parentRunId") == parent
