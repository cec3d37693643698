"""`python -m slurm` against a real one-node Slurm on localhost (scripts/slurm_cluster.sh
installs and starts it when missing; as root, in ~20 s on a fresh Debian machine).

Real jobs run the real trainer on the CPU; MLflow is checked afterwards. Slurm holds a
requeued batch job for ~2 minutes before it may start again; the requeue test lifts that
hold (`scontrol update StartTime=now`) so it takes seconds.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from experiments.paths import REPO_ROOT

CLUSTER_SCRIPT = REPO_ROOT / "scripts" / "slurm_cluster.sh"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
            "BOOT_FAIL", "DEADLINE"}


def cluster(command: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CLUSTER_SCRIPT), command], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module", autouse=True)
def slurm_cluster():
    """Start the test cluster (installing Slurm if needed); stop it afterwards if we started it."""
    if os.geteuid() != 0:
        pytest.skip("the test cluster installs Slurm with apt and runs its daemons as root "
                    "(SlurmUser=root); run the tests as root, as CI does")
    was_running = cluster("status").returncode == 0
    started = time.perf_counter()
    out = cluster("start")
    assert out.returncode == 0, f"slurm_cluster.sh start failed:\n{out.stdout}\n{out.stderr}"
    conf = re.search(r"export SLURM_CONF=(\S+)", out.stdout).group(1)
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    print(f"slurm test cluster ready in {time.perf_counter() - started:.1f}s ({conf})")
    yield conf
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous
    if not was_running:
        cluster("stop")


@pytest.fixture
def profile(tmp_path) -> Path:
    """A Slurm profile that keeps runs, ledger and MLflow store inside the test's folder."""
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump({"runs_dir": str(tmp_path / "runs"), "time": "00:10:00",
                                    "tracking_uri": f"sqlite:///{tmp_path}/mlflow.db"}))
    return path


def slurm_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slurm", *args], cwd=REPO_ROOT, text=True,
                          capture_output=True, timeout=300)


def ledger_jobs(tmp_path: Path) -> dict[str, str]:
    from slurm.ledger import Ledger

    return {e.run: e.job_id for e in Ledger(tmp_path / "runs").latest().values()}


def job_info(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
    return dict(re.findall(r"(\w+)=(\S*)", out.stdout))


def wait_for(job_id: str, states: set[str], timeout: float = 300) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = job_info(job_id)
        if info.get("JobState") in states:
            return info
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} not in {states} after {timeout}s: {job_info(job_id)}")


def write_manifest(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / f"{raw['name']}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_smoke_manifest_runs_as_slurm_jobs_and_logs_to_mlflow(tmp_path, profile):
    out = slurm_cli("submit", "smoke", "--profile", str(profile))
    assert out.returncode == 0, out.stderr
    jobs = ledger_jobs(tmp_path)
    assert set(jobs) == {"smoke-tps128-fpa-qknorm", "smoke-tps128-sagebwd-qknorm-k"}
    for name, job_id in jobs.items():
        info = wait_for(job_id, TERMINAL)
        log = tmp_path / "runs" / "smoke" / name / f"slurm-{job_id}.out"
        assert info["JobState"] == "COMPLETED", log.read_text()[-3000:]
        assert f"[{name}] step 6/6" in log.read_text()
        assert (log.parent / "slurm-exit").read_text().split() == [job_id, "0"]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("sagebwd-smoke")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    for name in jobs:
        assert runs[name].info.status == "FINISHED"
        assert runs[name].data.metrics["eval_loss"] > 0
    assert runs["smoke@cpu"].data.tags["sagebwd.role"] == "grid"

    # The ledger stops a second submit from duplicating finished runs.
    again = slurm_cli("submit", "smoke", "--profile", str(profile))
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("skipped: finished") == 2
    assert ledger_jobs(tmp_path) == jobs
    status = slurm_cli("status", "smoke", "--profile", str(profile))
    assert status.stdout.count("COMPLETED") == 2


def test_an_invalid_manifest_never_reaches_sbatch(tmp_path, profile):
    path = write_manifest(tmp_path, {
        "name": "broken", "node": "cpu", "base_config": "experiments/configs/cpu-tiny.yaml",
        "overrides": {"model.preset": "micro", "data.path": "data/not-prepared"},
        "tps": {"128": {"tokens": 128, "steps": 2, "warmup_steps": 0}}})
    out = slurm_cli("submit", str(path), "--profile", str(profile))
    assert out.returncode == 2
    assert f"{path}: overrides.data.path" in out.stderr
    assert not (tmp_path / "runs").exists()   # no ledger, no scripts, no run folders
    queued = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%j"], capture_output=True, text=True)
    assert "broken-" not in queued.stdout


def command_manifest(tmp_path: Path, name: str, script: str, **extra) -> Path:
    worker = tmp_path / f"{name}.py"
    worker.write_text(script)
    return write_manifest(tmp_path, {"name": name, "kind": "command", "node": "cpu",
                                     "command": ["{python}", str(worker), "{run_dir}"], **extra})


def test_array_submission_and_cancel(tmp_path, profile):
    manifest = command_manifest(
        tmp_path, "naps", "import sys, time; time.sleep(float(sys.argv[2]))\n",
        grid=[{"length": {"short": ["0"], "long": ["300"]}}])
    out = slurm_cli("submit", str(manifest), "--array", "--profile", str(profile))
    assert out.returncode == 0, out.stderr
    jobs = ledger_jobs(tmp_path)
    array_id = jobs["naps-short"].split("_")[0]
    assert jobs == {"naps-short": f"{array_id}_0", "naps-long": f"{array_id}_1"}
    assert wait_for(jobs["naps-short"], TERMINAL)["JobState"] == "COMPLETED"
    wait_for(jobs["naps-long"], {"RUNNING"})

    # A running job is not submitted twice.
    again = slurm_cli("submit", str(manifest), "--profile", str(profile))
    assert "naps-long" in again.stdout and "is RUNNING" in again.stdout
    assert "finished" in again.stdout

    cancel = slurm_cli("cancel", str(manifest), "--profile", str(profile))
    assert cancel.returncode == 0, cancel.stderr
    assert f"cancelled naps-long (job {array_id}_1" in cancel.stdout
    assert wait_for(jobs["naps-long"], TERMINAL)["JobState"] == "CANCELLED"
    status = slurm_cli("status", str(manifest), "--profile", str(profile))
    assert "CANCELLED" in status.stdout and "COMPLETED" in status.stdout


def release_requeue_hold(job_id: str) -> None:
    """Start a requeued job now instead of after Slurm's ~120 s hold. slurmd revokes the
    job's credential at the requeue and refuses a relaunch stamped in the same second
    ("Job credential revoked", the job then ends FAILED), so let that second pass first."""
    time.sleep(2)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True)


RESUMABLE_WORKER = """\
import os, signal, sys, time
from pathlib import Path

run_dir = Path(sys.argv[1])
checkpoint = run_dir / "checkpoint"
if checkpoint.exists():
    print(f"resumed from checkpoint at step {checkpoint.read_text()}", flush=True)
    sys.exit(0)
stop = []
signal.signal(signal.SIGUSR1, lambda *_: stop.append(1))
(run_dir / "ready").touch()
for step in range(3000):
    if stop:
        checkpoint.write_text(str(step))
        print(f"USR1 at step {step}: checkpoint saved, exiting", flush=True)
        sys.exit(0)
    time.sleep(0.1)
sys.exit(3)
"""


def test_usr1_checkpoints_requeues_and_resumes(tmp_path, profile):
    """The job-script side of preemption, with a stand-in that checkpoints on USR1 (the
    trainer's own checkpointing is tested below once it exists)."""
    manifest = command_manifest(tmp_path, "resumable", RESUMABLE_WORKER, resumes_on_signal=True)
    out = slurm_cli("submit", str(manifest), "--profile", str(profile))
    assert out.returncode == 0, out.stderr
    job_id = ledger_jobs(tmp_path)["resumable"]
    run_dir = tmp_path / "runs" / "resumable" / "resumable"
    deadline = time.monotonic() + 60
    while not (run_dir / "ready").exists():
        assert time.monotonic() < deadline, job_info(job_id)
        time.sleep(0.2)
    # What --signal=B:USR1@120 does two minutes before the time limit:
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], check=True)
    info = wait_for(job_id, {"PENDING"} | TERMINAL, timeout=60)
    assert info["JobState"] == "PENDING" and info["Restarts"] == "1", info
    release_requeue_hold(job_id)
    assert wait_for(job_id, TERMINAL, timeout=120)["JobState"] == "COMPLETED"
    log = (run_dir / f"slurm-{job_id}.out").read_text()
    assert "checkpoint saved" in log and "requeueing job" in log
    assert "resumed from checkpoint" in log and "restart 1" in log
    assert (run_dir / "slurm-exit").read_text().split() == [job_id, "0"]
    assert ledger_jobs(tmp_path) == {"resumable": job_id}   # one job, one ledger entry


def test_the_trainer_checkpoints_on_usr1_requeues_and_resumes_into_one_mlflow_run(tmp_path, profile):
    manifest = write_manifest(tmp_path, {
        "name": "requeue", "node": "cpu", "base_config": "experiments/configs/cpu-tiny.yaml",
        "experiment": "sagebwd-requeue",
        "overrides": {"model.preset": "micro", "model.block_q": 32, "model.block_kv": 32,
                      "train.log_every": 1, "eval.every": 1000, "eval.batches": 1},
        "tps": {"128": {"tokens": 128, "steps": 400, "warmup_steps": 1}},
        "grid": [{"attention": ["fpa"], "qk_norm": [True]}]})
    out = slurm_cli("submit", str(manifest), "--profile", str(profile))
    assert out.returncode == 0, out.stderr
    (name, job_id), = ledger_jobs(tmp_path).items()
    log = tmp_path / "runs" / "requeue" / name / f"slurm-{job_id}.out"
    deadline = time.monotonic() + 180
    while "step 3/400" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, job_info(job_id)
        time.sleep(0.5)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], check=True)
    info = wait_for(job_id, {"PENDING"} | TERMINAL, timeout=120)
    assert info["JobState"] == "PENDING" and info["Restarts"] == "1", log.read_text()[-3000:]
    release_requeue_hold(job_id)
    assert wait_for(job_id, TERMINAL, timeout=300)["JobState"] == "COMPLETED", log.read_text()[-3000:]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("sagebwd-requeue")
    runs = [r for r in client.search_runs([experiment.experiment_id]) if r.info.run_name == name]
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "loss")]
    assert max(steps) == 400
