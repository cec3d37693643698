"""The seed study: paired-gap statistics (exact values) and the command end to end on the CPU."""
from __future__ import annotations

import json
import math

import pytest
from mlflow.tracking import MlflowClient

from experiments import seeds


def test_paired_gaps_are_per_seed_differences():
    finals = {"fpa": {1: 4.0, 2: 5.0, 3: 6.0},
              "sagebwd-k": {1: 4.1, 2: 5.3, 3: 5.9},   # gaps +0.1, +0.3, -0.1
              "sagebwd-none": {1: 4.5}}                # one seed: no standard error
    rows = {r["variant"]: r for r in seeds.paired_gaps(finals)}
    assert rows["fpa"]["mean"] == pytest.approx(5.0) and rows["fpa"]["sd"] == pytest.approx(1.0)
    assert rows["fpa"]["gap"] is None
    k = rows["sagebwd-k"]
    assert k["gap"] == pytest.approx(0.1) and k["paired_seeds"] == 3
    assert k["gap_se"] == pytest.approx(0.2 / math.sqrt(3))   # sd of (0.1, 0.3, -0.1) is 0.2
    assert rows["sagebwd-none"]["gap"] == pytest.approx(0.5) and rows["sagebwd-none"]["gap_se"] is None
    table = seeds.markdown(seeds.paired_gaps(finals))
    assert "| sagebwd-k | 3 | 5.1000 | 0.9165 | +0.1000 ± 0.1155 | +0.9 |" in table
    assert "| sagebwd-none | 1 | 4.5000 | — | +0.5000 ± — | — |" in table


def test_seed_study_end_to_end_short(tmp_path, monkeypatch, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    out = tmp_path / "seeds"
    code = seeds.main(["--seeds", "2", "--out", str(out), "--name", "unit-study",
                       "--set", "model.preset=micro", "--set", "model.block_q=32",
                       "--set", "model.block_kv=32", "--set", "train.steps=4",
                       "--set", "schedule.warmup_steps=1", "--set", "eval.every=4",
                       "--set", "eval.batches=1", "--set", "tracking.system_metrics=false"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "| fpa | 2 |" in printed and "| sagebwd-k | 2 |" in printed
    data = json.loads((out / "seeds.json").read_text())
    assert data["seeds"] == [1337, 1338]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("sagebwd-demo").experiment_id],
                              filter_string="tags.seed_study = 'unit-study'")
    assert sorted(r.info.run_name for r in runs) == [
        "fpa-seed1337", "fpa-seed1338", "sagebwd-k-seed1337", "sagebwd-k-seed1338"]
    assert {r.data.params["seed"] for r in runs} == {"1337", "1338"}
    by_name = {r.info.run_name: r.data.metrics["eval_loss"] for r in runs}
    fpa = next(r for r in data["rows"] if r["variant"] == "fpa")
    assert fpa["mean"] == pytest.approx((by_name["fpa-seed1337"] + by_name["fpa-seed1338"]) / 2)


def test_seed_study_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit) as exit_info:
        seeds.main(["--seeds", "0"])
    assert exit_info.value.code == 2 and "at least one seed" in capsys.readouterr().err
    assert seeds.main(["--set", "model.attention=flash"]) == 2
    assert "model.attention" in capsys.readouterr().err


def test_a_signalled_run_stops_the_study(tmp_path, monkeypatch, capsys):
    """SIGTERM makes the trainer checkpoint and return (stopped_by set); the study must stop too,
    not start the next run, and leave that partial run out of the table."""
    import launcher.train
    real_train = launcher.train.train
    calls = []

    def train_then_stop(config):
        result = real_train(config)
        calls.append(config.tracking.run_name)
        if len(calls) == 2:
            result.stopped_by = "SIGTERM"
        return result

    monkeypatch.setattr(launcher.train, "train", train_then_stop)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    code = seeds.main(["--seeds", "2", "--out", str(tmp_path / "seeds"), "--name", "stopped",
                       "--set", "model.preset=micro", "--set", "model.block_q=32", "--set", "model.block_kv=32",
                       "--set", "train.steps=2", "--set", "schedule.warmup_steps=1", "--set", "eval.every=2",
                       "--set", "eval.batches=1", "--set", "tracking.system_metrics=false"])
    assert code == 1 and calls == ["fpa-seed1337", "sagebwd-k-seed1337"]
    assert "seed study stopped by SIGTERM during sagebwd-k seed 1337" in capsys.readouterr().err
    rows = {r["variant"]: r for r in json.loads((tmp_path / "seeds" / "seeds.json").read_text())["rows"]}
    assert rows["fpa"]["seeds"] == 1 and "sagebwd-k" not in rows
