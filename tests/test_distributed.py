"""Multi-process CPU worlds (gloo) through the real trainer CLI, DeepSpeed engine,
DeepSpeed-Ulysses DistributedAttention and a real MLflow sqlite store.

Every world below trains on the same global batch (4 sequences of 64 tokens per step), so
all of them must give the reference's loss and pre-clip grad norm per step: DP=2, SP=2
(ZeRO stages 0 and 3: DeepSpeed issue 5248 made SP gradients stage dependent), DP=2 x SP=2
(4 processes, started through Slurm's variables); DP=2 and SP=2 in bf16 with DeepSpeed's
BF16_Optimizer must give their own one-process bf16 curve; and a run killed with SIGKILL or
stopped with SIGUSR1, then resumed with `--resume auto`, must repeat the reference bit for bit
in one MLflow run.

Each process is started directly (RANK/WORLD_SIZE/MASTER_* as torchrun would set them) and
every wait has a deadline: a rank that fails must not leave its peers hanging the suite.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parent.parent
STEPS = 6
PROCESS_DEADLINE_S = 240
BASE = ["--config", "experiments/configs/cpu-tiny.yaml",
        "--set", "model.preset=micro", "--set", "model.block_q=32", "--set", "model.block_kv=32",
        "--set", f"train.steps={STEPS}", "--set", "train.log_every=1",
        "--set", "schedule.warmup_steps=1", "--set", "eval.every=3", "--set", "eval.batches=1",
        "--set", "tracking.system_metrics=false", "--set", "tracking.flush_every=1",
        "--set", "tracking.experiment=distributed"]

pytestmark = pytest.mark.timeout(900)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class World:
    """N trainer processes of one run; logs under log_dir."""

    def __init__(self, n: int, args: list[str], log_dir: Path, slurm: bool = False):
        log_dir.mkdir(parents=True, exist_ok=True)
        port = str(_free_port())
        self.procs, self.logs = [], []
        for r in range(n):
            env = {k: v for k, v in os.environ.items()
                   if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK") and not k.startswith("SLURM_")}
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1",
                       PYTHONUNBUFFERED="1")
            if slurm:  # what srun gives each task; the trainer maps it to RANK/WORLD_SIZE
                env.update(SLURM_PROCID=str(r), SLURM_NTASKS=str(n), SLURM_LOCALID=str(r))
            else:
                env.update(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r))
            log = log_dir / f"rank{r}.log"
            self.logs.append(log)
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "launcher.train", *args], cwd=REPO, env=env,
                stdout=open(log, "w"), stderr=subprocess.STDOUT))

    def wait(self, deadline_s: float = PROCESS_DEADLINE_S) -> list[int]:
        end = time.monotonic() + deadline_s
        try:
            return [p.wait(timeout=max(1.0, end - time.monotonic())) for p in self.procs]
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"world did not finish in {deadline_s}s:\n{self.output()}")

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()

    def output(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in self.logs)

    def wait_for_line(self, text: str, deadline_s: float = PROCESS_DEADLINE_S) -> None:
        end = time.monotonic() + deadline_s
        while text not in self.logs[0].read_text():
            if time.monotonic() > end or any(p.poll() is not None for p in self.procs):
                self.kill()
                pytest.fail(f"never saw {text!r}:\n{self.output()}")
            time.sleep(0.2)


def run_world(n: int, name: str, store: Path, extra: list[str], slurm: bool = False) -> None:
    args = [*BASE, "--set", f"tracking.run_name={name}",
            "--set", f"tracking.tracking_uri=sqlite:///{store / 'mlflow.db'}", *extra]
    world = World(n, args, store / name, slurm=slurm)
    codes = world.wait()
    assert codes == [0] * n, world.output()


def curves(store: Path, name: str) -> dict[str, list[tuple[int, float]]]:
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    exp = client.get_experiment_by_name("distributed")
    runs = [r for r in client.search_runs([exp.experiment_id]) if r.info.run_name == name]
    assert len(runs) == 1, f"{len(runs)} MLflow runs named {name}"
    run_id = runs[0].info.run_id
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
            for key in ("loss", "grad_norm", "eval_loss")} | {"_status": runs[0].info.status}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("distributed")


@pytest.fixture(scope="module")
def reference(store):
    """One process, micro batch 4: the curve every other world must reproduce."""
    run_world(1, "reference", store, ["--set", "train.micro_batch_size=4"])
    return curves(store, "reference")


@pytest.fixture(scope="module")
def dp2(store):
    """Two data-parallel processes, micro batch 2, ZeRO 1; the interrupted runs must repeat
    it bit for bit."""
    run_world(2, "dp2", store, ["--set", "train.micro_batch_size=2"])
    return curves(store, "dp2")


# DeepSpeed's ZeRO-1/2 grad norm differs from the plain norm of the same gradients by
# ~1e-4 relative here (it adds one small norm-scale gradient twice); stage 0 and 3 agree
# with the plain norm. The tolerance is far below the sp-fold error of issue 5248.
GRAD_NORM_REL = 1e-3


def assert_same_curves(got, want, rel=1e-5, grad_norm_rel=GRAD_NORM_REL):
    for key in ("loss", "grad_norm", "eval_loss"):
        assert [s for s, _ in got[key]] == [s for s, _ in want[key]], key
        tol = grad_norm_rel if key == "grad_norm" else rel
        assert [v for _, v in got[key]] == pytest.approx([v for _, v in want[key]], rel=tol), key


def test_data_parallel_matches_one_process(dp2, reference):
    assert dp2["_status"] == "FINISHED"
    assert len(dp2["loss"]) == STEPS and dp2["loss"][-1][1] < dp2["loss"][0][1]
    assert_same_curves(dp2, reference)


@pytest.mark.parametrize("name, n, extra, slurm", [
    ("sp2-zero0", 2, ["--set", "train.micro_batch_size=4", "--set", "parallel.sp=2",
                      "--set", "parallel.zero_stage=0"], False),
    ("sp2-zero3", 2, ["--set", "train.micro_batch_size=4", "--set", "parallel.sp=2",
                      "--set", "parallel.zero_stage=3"], False),
    # the model under torch.compile, Ulysses' all-to-alls inside it (train.compile)
    ("sp2-zero0-compiled", 2, ["--set", "train.micro_batch_size=4", "--set", "parallel.sp=2",
                               "--set", "parallel.zero_stage=0", "--set", "train.compile=true"], False),
    # the LM head and loss chunked inside the model (model.loss_impl), on each SP shard
    ("sp2-zero1-chunked-loss", 2, ["--set", "train.micro_batch_size=4", "--set", "parallel.sp=2",
                                   "--set", "model.loss_impl=chunked", "--set", "model.loss_chunk_tokens=96"],
     False),
    ("dp2xsp2-zero2-slurm", 4, ["--set", "train.micro_batch_size=2", "--set", "parallel.sp=2",
                                "--set", "parallel.zero_stage=2",
                                "--set", "train.tokens_per_step=256"], True),
])
def test_world_matches_one_process(store, reference, name, n, extra, slurm):
    run_world(n, name, store, extra, slurm=slurm)
    got = curves(store, name)
    assert got["_status"] == "FINISHED"
    assert len(got["loss"]) == STEPS and got["loss"][-1][1] < got["loss"][0][1]
    assert_same_curves(got, reference)


# train.grad_accum_dtype fp32 in bf16: DeepSpeed builds its BF16_Optimizer (fp32 gradients) instead of its ZeRO-1 one.
BF16_FP32_ACCUMULATION = ["--set", "train.precision=bf16", "--set", "train.grad_accum_dtype=fp32"]


@pytest.fixture(scope="module")
def bf16_reference(store):
    """One process in bf16 with fp32 gradient accumulation: the curve its DP and SP worlds must give."""
    run_world(1, "reference-bf16-fp32acc", store, ["--set", "train.micro_batch_size=4", *BF16_FP32_ACCUMULATION])
    return curves(store, "reference-bf16-fp32acc")


@pytest.mark.parametrize("name, extra", [
    ("dp2-bf16-fp32acc", ["--set", "train.micro_batch_size=2"]),
    ("sp2-bf16-fp32acc", ["--set", "train.micro_batch_size=4", "--set", "parallel.sp=2"]),
])
def test_bf16_optimizer_worlds_match_one_process(store, bf16_reference, name, extra):
    """BF16_Optimizer (opt-in: +8-9% tokens/s on one H200, docs/benchmarks.md) reduces its gradients over DP and over
    Ulysses' SP group: the curve of one process, up to bf16's rounding of sums split another way (measured by
    docs/measurements/bf16-optimizer-worlds-cpu.py: loss within 3e-5 relative, pre-clip grad norm within 2e-3). A
    rank's share of the gradient left out moves the norm by far more than the 1e-2 allowed (one process on half the
    batch: 27-49% per step)."""
    run_world(2, name, store, [*extra, *BF16_FP32_ACCUMULATION])
    assert "begin bf16_optimizer" in (store / name / "rank0.log").read_text()   # DeepSpeed's note as it builds it
    got = curves(store, name)
    assert got["_status"] == "FINISHED"
    assert_same_curves(got, bf16_reference, rel=2e-4, grad_norm_rel=1e-2)


def test_uneven_head_split_fails_on_every_rank_with_the_key(store):
    """micro has 2 heads: sp=4 cannot split them, and no rank may hang on the others."""
    args = [*BASE, "--set", "parallel.sp=4",
            "--set", f"tracking.tracking_uri=sqlite:///{store / 'mlflow.db'}"]
    world = World(4, args, store / "uneven")
    assert world.wait(120) == [2] * 4, world.output()
    assert "model.num_heads (2) must be divisible by parallel.sp (4)" in world.logs[0].read_text()


def test_tps_that_cannot_be_met_names_the_keys(store):
    args = [*BASE, "--set", "train.micro_batch_size=3", "--set", "train.tokens_per_step=256",
            "--set", f"tracking.tracking_uri=sqlite:///{store / 'mlflow.db'}"]
    world = World(2, args, store / "bad-tps")
    assert world.wait(120) == [2, 2], world.output()
    text = world.logs[0].read_text()
    assert "train.tokens_per_step (256" in text and "train.micro_batch_size (3)" in text


def test_deepspeed_launcher_runs_the_trainer_as_dp2(store, dp2):
    """DeepSpeed's own `deepspeed` launcher (it sets RANK/LOCAL_RANK/WORLD_SIZE and appends
    --local_rank=N) starts the same DP=2 world: the same curve, bit for bit."""
    name = "deepspeed-launcher"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
           and not k.startswith("SLURM_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    deepspeed = Path(sys.executable).with_name("deepspeed")
    cmd = [str(deepspeed), "--num_gpus", "2", "--master_port", str(_free_port()), "--module",
           "launcher.train", *BASE, "--set", "train.micro_batch_size=2",
           "--set", f"tracking.run_name={name}",
           "--set", f"tracking.tracking_uri=sqlite:///{store / 'mlflow.db'}"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=PROCESS_DEADLINE_S)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "--local_rank=1" in done.stdout + done.stderr   # the launcher's own argument
    assert "2 DP" in done.stdout
    got = curves(store, name)
    assert got["_status"] == "FINISHED"
    assert_same_curves(got, dp2, rel=0, grad_norm_rel=0)


@pytest.mark.parametrize("how", ["sigkill", "sigusr1"])
def test_interrupted_run_resumes_to_the_same_trajectory_in_one_mlflow_run(store, dp2, how):
    name = f"resume-{how}"
    ckpt = store / name / "checkpoints"
    args = [*BASE, "--set", "train.micro_batch_size=2", "--set", f"tracking.run_name={name}",
            "--set", f"tracking.tracking_uri=sqlite:///{store / 'mlflow.db'}",
            "--set", f"checkpoint.dir={ckpt}", "--set", "checkpoint.every=2",
            "--set", "checkpoint.keep_last=1", "--resume", "auto"]
    world = World(2, args, store / name / "first")
    if how == "sigkill":   # a crash: no chance to save; resume from the step-2 checkpoint
        world.wait_for_line("checkpoint saved at step 2")
        world.wait_for_line(f"step 3/{STEPS}")
        world.kill()
        assert (ckpt / "latest").read_text() == "step00000002"
    else:                  # Slurm's pre-timeout signal, to one rank only: both must stop
        world.wait_for_line(f"step 3/{STEPS}")
        world.procs[1].send_signal(signal.SIGUSR1)
        codes = world.wait()
        assert codes == [0, 0], world.output()
        assert "a peer rank's signal: stopped after step" in world.logs[0].read_text()
        stopped_at = int((ckpt / "latest").read_text().removeprefix("step"))
        assert 3 <= stopped_at < STEPS, world.output()
        assert curves(store, name)["_status"] == "KILLED"
    resumed = World(2, args, store / name / "second")
    assert resumed.wait() == [0, 0], resumed.output()
    assert "resumed at step" in resumed.logs[0].read_text()
    got = curves(store, name)   # exactly one MLflow run with this name
    assert got["_status"] == "FINISHED"
    # The killed attempt logged step 3 past its checkpoint; the resumed run replays it and
    # must not log it again: one point per step.
    for key in ("loss", "grad_norm", "eval_loss"):
        steps = [step for step, _ in got[key]]
        assert len(steps) == len(set(steps)), (key, got[key])
    assert_same_curves(got, dp2, rel=0, grad_norm_rel=0)  # bit-identical
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("step")) == [
        f"step{STEPS:08d}"]   # keep_last=1 pruned the older ones


def test_world_env_precedence_launcher_then_slurm_then_one_process(monkeypatch):
    from launcher.distributed import ONE_PROCESS_MARK, world_env_from_launcher

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", ONE_PROCESS_MARK,
                "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID", "MASTER_ADDR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("MASTER_ADDR", "head")
    assert world_env_from_launcher() == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                                         "MASTER_ADDR": "head", "MASTER_PORT": "20077"}
    monkeypatch.setenv("RANK", "0")          # torchrun's variables win over Slurm's
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert world_env_from_launcher() == {}
    for key in ("SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(key)
    # a one-process env inherited from a parent that trained in-process is replaced
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv(ONE_PROCESS_MARK, "29500")
    fresh = world_env_from_launcher()
    assert fresh["WORLD_SIZE"] == "1" and fresh["MASTER_PORT"] != "29500"


def test_sequence_parallel_gradients_under_compile_equal_eager():
    """SP=2 with the model under torch.compile: the same gradients as eager, and DeepSpeed's
    all-to-alls kept out of the compiled graphs (traced, their gradient was lost on NCCL; the
    2-GPU form of this check is tests/test_sp_compile_gpu.py)."""
    from tests.sp_compile_worker import launch

    done = launch("--attention", "fpa", timeout=PROCESS_DEADLINE_S)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "on gloo" in out and "all-to-alls traced into compiled graphs: 0; OK" in out, out[-4000:]
