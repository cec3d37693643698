"""Tracking never stops training (issue 26): the real trainer (in-process, one CPU rank)
against a real `mlflow server` on 127.0.0.1 that is absent at the start, then stopped and
started again mid-run; the journal, its upload later with `launcher.sync`, runs that end in
an error, and the launcher's one-line errors."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

import launcher.train as train_module
from launcher.config import build_run_config
from launcher.journal import Journal, Uploader
from launcher.sync import main as sync_main
from mlflow_server_process import MlflowServer

REPO = Path(__file__).resolve().parent.parent
STEPS = 16
RUN = {
    "seed": 5,
    "model": {"preset": "micro", "qk_norm": True},
    "schedule": {"warmup_steps": 1},
    "train": {"steps": STEPS, "micro_batch_size": 2, "log_every": 1},
    "eval": {"every": 8, "batches": 1},
    "tracking": {"experiment": "outage", "flush_every": 1, "system_metrics": False},
}


def config(uri: str, ckpt: Path, steps: int = STEPS, **tracking):
    return build_run_config({**RUN, "train": {**RUN["train"], "steps": steps},
                             "checkpoint": {"dir": str(ckpt), "every": 4},
                             "tracking": {**RUN["tracking"], "tracking_uri": uri, **tracking}})


def steps_of(client: MlflowClient, run_id: str, key: str = "loss") -> list[int]:
    return [m.step for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


@pytest.mark.timeout(600)
def test_training_outlives_a_tracking_outage_and_the_gap_is_filled(tmp_path):
    folder = tmp_path / "server"
    folder.mkdir()
    server = MlflowServer(folder)
    try:
        # 1. Nothing listens at the URI: a warning within seconds, every step runs, and the
        #    end of the run says how to upload the journal.
        said: list[str] = []
        started = time.monotonic()
        offline = train_module.train(config(server.url, tmp_path / "offline", steps=4),
                                     say=said.append)
        assert time.monotonic() - started < 60, said
        assert [s for s, _ in offline.train_loss] == [1, 2, 3, 4]
        first_step = next(i for i, line in enumerate(said) if "step 1/4" in line)
        assert any("is not reachable" in line for line in said[:first_step]), said
        journal_dir = tmp_path / "offline" / "tracking"
        assert any(f"python -m launcher.sync {journal_dir}" in line for line in said), said
        assert offline.run_id is None

        # 2. The server comes up; one command uploads the journal (twice: nothing doubles).
        server.start()
        assert sync_main([str(tmp_path / "offline")]) == 0
        assert sync_main([str(tmp_path / "offline")]) == 0
        client = MlflowClient(server.url)
        (run,) = client.search_runs([client.get_experiment_by_name("outage").experiment_id])
        assert run.info.status == "FINISHED"
        assert steps_of(client, run.info.run_id) == [1, 2, 3, 4]
        assert [m.value for m in sorted(client.get_metric_history(run.info.run_id, "loss"),
                                        key=lambda m: m.step)] == [v for _, v in offline.train_loss]
        assert run.data.params["model.preset"] == "micro"
        assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"config.yaml",
                                                                           "summary.json"}

        # 3. Stopped after step 5, back after step 10: steps 6-10 run while it is away, and
        #    their metrics reach the run in order once it is back.
        times: dict[str, float] = {}

        def outage(line: str) -> None:
            said.append(line)
            if f"step 5/{STEPS}" in line:
                server.stop()
                times["stopped"] = time.monotonic()
            elif f"step 10/{STEPS}" in line:
                times["step10"] = time.monotonic()
                server.start()   # blocks this step until the server answers

        said.clear()
        result = train_module.train(config(server.url, tmp_path / "outage"), say=outage)
        assert [s for s, _ in result.train_loss] == list(range(1, STEPS + 1))
        assert times["step10"] - times["stopped"] < 30, said   # nothing waited on the server
        assert any("MLflow at" in line and "failed" in line for line in said), said
        assert any("reachable again" in line for line in said), said
        run = client.get_run(result.run_id)
        assert run.info.status == "FINISHED"
        history = sorted(client.get_metric_history(result.run_id, "loss"), key=lambda m: m.step)
        assert [m.step for m in history] == list(range(1, STEPS + 1))      # once each
        assert [m.value for m in history] == [v for _, v in result.train_loss]
        assert [m.timestamp for m in history] == sorted(m.timestamp for m in history)
        assert steps_of(client, result.run_id, "eval_loss") == [8, 16]
    finally:
        server.stop()


def test_a_run_that_raises_ends_failed_in_mlflow(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    real_loss, calls = train_module.lm_loss, []

    def loss_that_raises_at_step_3(logits, targets):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("a bug at step 3")
        return real_loss(logits, targets)

    monkeypatch.setattr(train_module, "lm_loss", loss_that_raises_at_step_3)
    with pytest.raises(RuntimeError, match="a bug at step 3"):
        train_module.train(config(uri, tmp_path / "ckpt", steps=6), say=lambda _: None)
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("outage").experiment_id])
    assert run.info.status == "FAILED"
    assert steps_of(client, run.info.run_id) == [1, 2]
    records = [json.loads(line) for line in
               (tmp_path / "ckpt" / "tracking" / "journal.jsonl").read_text().splitlines()]
    assert records[-1]["op"] == "end" and records[-1]["status"] == "FAILED"


def test_journal_drops_a_torn_line_and_uploads_in_batches_once(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    journal = Journal(tmp_path / "j")
    journal.append({"op": "create", "ts": 1000, "experiment": "unit", "run_name": "r",
                    "tags": {"a": "1"}, "params": {"p": "2"}, "config_yaml": "p: 2\n"})
    for step in range(1, 1201):   # 2 metrics a step: three log_batch calls of <= 1000
        journal.append({"op": "metrics", "step": step, "ts": 1000 + step,
                        "values": {"loss": 1.0 / step, "lr": 0.1}})
    journal.close()
    with open(journal.path, "a") as f:
        f.write('{"i": 1201, "op": "metr')   # a process killed mid-write
    journal = Journal(tmp_path / "j")
    assert journal.count == 1201 and journal.max_step() == 1200
    journal.append({"op": "end", "ts": 9999, "status": "FINISHED"})
    uploader = Uploader(journal, uri)
    assert uploader.upload() == 1202
    assert Uploader(journal, uri).upload() == 0
    client = MlflowClient(uri)
    assert steps_of(client, uploader.run_id) == list(range(1, 1201))
    run = client.get_run(uploader.run_id)
    assert run.info.status == "FINISHED" and run.info.end_time == 9999
    assert run.data.params == {"p": "2"} and run.data.tags["a"] == "1"


def test_launcher_errors_are_one_line_unless_asked(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**RUN, "data": {"path": str(tmp_path / "no-data")}}))
    assert train_module.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ") and "no-data" in err, err
    assert train_module.main(["--config", str(path), "--traceback"]) == 2
    assert "Traceback (most recent call last)" in capsys.readouterr().err
    assert train_module.main(["--config", str(path), "--set", "train.stepz=1",
                              "--set", "parallel.sp=3", "--set", "optimizer.lr=-1"]) == 2
    err = capsys.readouterr().err
    for key in ("train.stepz", "optimizer.lr", "model.num_heads (2) must be divisible by "
                "parallel.sp (3)"):
        assert key in err, err


_RACE_WORKER = """
import sys, time
from experiments.grid.plan import plan_manifest
from experiments.grid.tracking import ensure_parent_run
plan = plan_manifest("paper-small", node="h100-1", check_paths=False)
start = float(sys.argv[2])
while time.time() < start:
    pass
print(ensure_parent_run(plan, sys.argv[1]))
"""


def test_grids_started_side_by_side_share_a_fresh_sqlite_store(tmp_path):
    """Two `experiments run` started at once on a new sqlite store: MLflow creates and migrates the
    store's tables on each process's first client, and without launcher.tracking.store_lock all but
    one failed ("table experiments already exists", "duplicate column name: step"; seen on a GPU
    host, and here 3 of 4). With it every process starts, and they find one grid parent run."""
    import os
    import subprocess
    import sys

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONPATH": str(REPO)}
    start = time.time() + 6   # after every interpreter has imported MLflow
    procs = [subprocess.Popen([sys.executable, "-c", _RACE_WORKER, uri, str(start)], env=env, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    failed = [err.strip().splitlines()[-1] for _, err, rc in results if rc != 0]
    assert not failed, failed
    assert len({out.strip() for out, _, _ in results}) == 1, "the grids made more than one parent run"


def test_store_lock_is_reentrant_bounded_and_never_a_reason_to_stop(tmp_path, capsys, monkeypatch):
    """store_lock (launcher/tracking.py) nests within a thread without waiting on itself; a lock held by a
    stopped process delays a caller by STORE_LOCK_WAIT_S at most, with a warning; and where the lock file
    cannot be made (a store nobody can write, which nobody migrates either) the caller goes on without it."""
    import subprocess
    import sys

    from launcher import tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    start = time.monotonic()
    with tracking.store_lock(uri):
        with tracking.store_lock(uri):   # e.g. experiment_id inside a grid's find-or-create
            pass
    assert time.monotonic() - start < 1 and "warning" not in capsys.readouterr().err

    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time\n"
                               f"h = open({str(tmp_path / 'mlflow.db.lock')!r}, 'a')\n"
                               "fcntl.flock(h, fcntl.LOCK_EX); print('held', flush=True); time.sleep(30)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(tracking, "STORE_LOCK_WAIT_S", 0.3)
        start = time.monotonic()
        with tracking.store_lock(uri):
            pass
        assert 0.3 <= time.monotonic() - start < 5
        assert "has been held for 0 s" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with tracking.store_lock(f"sqlite:///{blocked / 'mlflow.db'}"):   # its lock file cannot be made
        pass
