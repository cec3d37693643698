"""Checkpoints that are verified before they are loaded, and resumes that check what they
resume (issue 26): the real trainer (in-process, one CPU rank, DeepSpeed's engine), real bit
flips and truncations of its checkpoint files, a real MLflow sqlite store."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from launcher import checkpoint
from launcher.checkpoint_manifest import MANIFEST
from launcher.config import build_run_config
from launcher.overrides import ConfigError
from launcher.train import train

RUN = {
    "seed": 11,
    "model": {"preset": "micro", "qk_norm": True},
    "schedule": {"warmup_steps": 1},
    "train": {"steps": 6, "micro_batch_size": 2, "log_every": 1},
    "eval": {"every": 3, "batches": 1},
    "tracking": {"experiment": "ckpt", "system_metrics": False},
}
MODEL_FILE = "mp_rank_00_model_states.pt"
OPTIM_FILE = "zero_pp_rank_0_mp_rank_00_optim_states.pt"


def config(store: Path, ckpt: Path, steps: int = 6, **sections):
    raw = {**RUN, "train": {**RUN["train"], "steps": steps},
           "checkpoint": {"dir": str(ckpt), "every": 2, "keep_last": 3},
           "tracking": {**RUN["tracking"], "tracking_uri": f"sqlite:///{store / 'mlflow.db'}"}}
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return build_run_config(raw)


def flip(path: Path, at: float = 0.5, n: int = 4) -> None:
    data = bytearray(path.read_bytes())
    i = int(len(data) * at)
    data[i:i + n] = bytes(b ^ 0xFF for b in data[i:i + n])
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def loss_steps(client: MlflowClient, run_id: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss"))


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ckpt-store")


@pytest.fixture(scope="module")
def finished(store):
    """A 6-step run with checkpoints at steps 2, 4 and 6 (left unchanged by the tests)."""
    ckpt = store / "finished"
    return ckpt, train(config(store, ckpt), say=lambda _: None)


def test_manifest_lists_every_file_with_its_size_sha256_and_the_run(finished):
    ckpt, result = finished
    manifest = json.loads((ckpt / "step00000006" / MANIFEST).read_text())
    assert sorted(manifest["files"]) == [MODEL_FILE, "trainer_rank0.pt", OPTIM_FILE]
    assert manifest["files"][MODEL_FILE]["size"] == (ckpt / "step00000006" / MODEL_FILE).stat().st_size
    identity = manifest["identity"]
    assert identity["mlflow_run_id"] == result.run_id
    assert identity["checkpoint_dir"] == str(ckpt.resolve())
    assert identity["config"]["optimizer.lr"] == "0.0003" and len(identity["config_sha256"]) == 64


def test_a_bit_flip_falls_back_to_the_newest_good_checkpoint_and_resumes_exactly(store, finished):
    ckpt = store / "flipped"
    first = train(config(store, ckpt), say=lambda _: None)
    flip(ckpt / "step00000006" / MODEL_FILE)
    said: list[str] = []
    again = train(config(store, ckpt), resume="auto", say=said.append)
    warning = next(line for line in said if line.startswith("warning: resuming from"))
    assert f"{ckpt / 'step00000004'}, the newest checkpoint that verifies" in warning
    assert f"{ckpt / 'step00000006' / MODEL_FILE} fails its sha256 check" in warning
    assert again.resumed_from == 4
    assert again.train_loss == first.train_loss[4:]    # steps 5, 6: bit for bit
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    assert again.run_id == first.run_id                   # one MLflow run
    assert loss_steps(client, first.run_id) == first.train_loss   # each step once
    assert client.get_run(first.run_id).info.status == "FINISHED"

    # More steps is a safe change: said, and logged on the same run.
    said.clear()
    more = train(config(store, ckpt, steps=7), resume="auto", say=said.append)
    assert more.resumed_from == 6 and [s for s, _ in more.train_loss] == [7]
    assert any("train.steps 6 -> 7" in line for line in said), said
    run = client.get_run(first.run_id)
    assert run.data.tags["resume.changed.train.steps"] == "6 -> 7 at step 6"
    assert [s for s, _ in loss_steps(client, first.run_id)] == list(range(1, 8))


def test_truncation_and_a_bad_latest_never_mean_a_fresh_start(finished, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(finished[0], ckpt)
    said: list[str] = []
    for marker in ("", "garbage\n", None):     # empty, corrupt, missing `latest`
        if marker is None:
            (ckpt / "latest").unlink()
        else:
            (ckpt / "latest").write_text(marker)
        assert checkpoint.resolve_resume("auto", str(ckpt), say=said.append) == (
            ckpt, "step00000006")
    assert "is empty" in said[0] and "not a step tag" in said[1] and "is missing" in said[2]

    truncate(ckpt / "step00000006" / OPTIM_FILE)
    said.clear()
    assert checkpoint.resolve_resume("auto", str(ckpt), say=said.append) == (ckpt, "step00000004")
    assert f"{ckpt / 'step00000006' / OPTIM_FILE} has " in said[0] and "truncated" in said[0]
    with pytest.raises(ConfigError, match="truncated"):    # an explicit folder: no fallback
        checkpoint.resolve_resume(str(ckpt / "step00000006"), None)

    flip(ckpt / "step00000004" / "trainer_rank0.pt", at=0.9)
    (ckpt / "step00000002" / MANIFEST).unlink()            # as if killed mid-save
    with pytest.raises(ConfigError) as err:
        checkpoint.resolve_resume("auto", str(ckpt))
    text = str(err.value)
    assert text.startswith(f"no checkpoint in {ckpt} can be loaded")
    assert "step00000006:" in text and "step00000004:" in text and "step00000002:" in text


def test_resuming_with_another_config_is_refused_with_the_keys(store, finished):
    ckpt, _ = finished
    with pytest.raises(ConfigError) as err:
        train(config(store, ckpt, optimizer={"lr": 1e-3}, seed=12), resume="auto")
    text = str(err.value)
    assert "was written with another config" in text
    assert "optimizer.lr: 0.0003 in the checkpoint, now 0.001" in text
    assert "seed: 11 in the checkpoint, now 12" in text
    assert "train.steps" in text   # named among the keys that may change


def test_a_copied_checkpoint_folder_never_writes_into_the_original_run(store, finished, tmp_path):
    ckpt, original = finished
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    before = client.get_run(original.run_id)
    summary = client.download_artifacts(original.run_id, "summary.json", str(tmp_path))
    summary_before = Path(summary).read_text()
    copy = tmp_path / "copy"
    shutil.copytree(ckpt, copy)
    said: list[str] = []
    forked = train(config(store, copy, steps=8), resume="auto", say=said.append)
    assert forked.run_id != original.run_id and forked.resumed_from == 6
    assert any("continues in a new MLflow run" in line for line in said), said
    new = client.get_run(forked.run_id)
    assert new.data.tags["sagebwd.forked_from_run"] == original.run_id
    assert [s for s, _ in loss_steps(client, forked.run_id)] == [7, 8]
    after = client.get_run(original.run_id)
    assert after.info.status == before.info.status == "FINISHED"
    assert after.info.end_time == before.info.end_time
    assert loss_steps(client, original.run_id) == original.train_loss
    (tmp_path / "again").mkdir()
    again = client.download_artifacts(original.run_id, "summary.json", str(tmp_path / "again"))
    assert Path(again).read_text() == summary_before


def test_deepspeeds_bf16_optimizer_checkpoints_and_resumes_exactly(store):
    """train.grad_accum_dtype fp32 in bf16: DeepSpeed's BF16_Optimizer (not its ZeRO-1 optimizer)
    writes the optimizer state, and a fallback resume replays the steps bit for bit."""
    ckpt = store / "bf16-optimizer"
    bf16 = {"precision": "bf16", "grad_accum_dtype": "fp32"}
    first = train(config(store, ckpt, steps=4, train={**RUN["train"], "steps": 4, **bf16}), say=lambda _: None)
    files = json.loads((ckpt / "step00000004" / MANIFEST).read_text())["files"]
    assert sorted(files) == ["bf16_" + OPTIM_FILE, MODEL_FILE, "trainer_rank0.pt"]
    flip(ckpt / "step00000004" / MODEL_FILE)
    again = train(config(store, ckpt, steps=4, train={**RUN["train"], "steps": 4, **bf16}), resume="auto",
                  say=lambda _: None)
    assert again.resumed_from == 2
    assert again.train_loss == first.train_loss[2:]    # steps 3, 4: bit for bit
