"""Process-group setup for the trainer: one code path for a single process, for
`torchrun`/`deepspeed`-launched worlds and for plain `srun` (Slurm's variables), plus the
sequence-parallel groups."""
from __future__ import annotations

import gc
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

REPO_ROOT = Path(__file__).resolve().parent.parent
SINGLE_PROCESS_ENV = {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "LOCAL_RANK": "0",
                      "WORLD_SIZE": "1"}
ONE_PROCESS_MARK = "SAGEBWD_ONE_PROCESS_PORT"
# A rank that dies mid-collective must not leave its peers waiting for DeepSpeed's 30 min.
COLLECTIVE_TIMEOUT = timedelta(minutes=int(os.environ.get("SAGEBWD_COLLECTIVE_TIMEOUT_MIN", "10")))


def _free_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _first_slurm_host() -> str:
    import subprocess

    nodes = os.environ.get("SLURM_JOB_NODELIST", "127.0.0.1")
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True,
                             text=True, timeout=30, check=True).stdout.split()
        return out[0] if out else nodes
    except (OSError, subprocess.SubprocessError):
        return nodes


def world_env_from_launcher() -> dict[str, str]:
    """RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* for this process.

    A launcher's variables (torchrun, deepspeed) win; else Slurm's (one task per rank under
    srun); else a one-process world on a free port, so parallel test runs do not collide.
    """
    env = os.environ
    # Our own one-process env, inherited from a parent that trained in-process (a test
    # session), is stale: its port is the parent's. A launcher's env has another port.
    inherited = env.get(ONE_PROCESS_MARK) is not None and env.get(ONE_PROCESS_MARK) == env.get(
        "MASTER_PORT")
    if "RANK" in env and "WORLD_SIZE" in env and not inherited:
        return {}
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        job = int(env.get("SLURM_JOB_ID", "0"))
        return {"RANK": env["SLURM_PROCID"], "WORLD_SIZE": env["SLURM_NTASKS"],
                "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
                "MASTER_ADDR": env.get("MASTER_ADDR") or _first_slurm_host(),
                "MASTER_PORT": env.get("MASTER_PORT") or str(20000 + job % 20000)}
    port = _free_port()
    return {**SINGLE_PROCESS_ENV, "MASTER_PORT": port, ONE_PROCESS_MARK: port}


def init_process_group() -> None:
    """Initialise torch.distributed if nobody has yet (nccl on GPU, gloo on CPU).

    We create the group ourselves, before deepspeed.initialize, so DeepSpeed adopts it
    instead of running its MPI discovery.
    """
    if dist.is_initialized():
        return
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO_ROOT / ".cache" / "torch_extensions"))
    os.environ.update(world_env_from_launcher())
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend="nccl", timeout=COLLECTIVE_TIMEOUT)
    else:
        # A CPU world by choice: said to DeepSpeed before its first import, it does not guess
        # (and warn that it was "unable to detect" an accelerator).
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        dist.init_process_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)
        skip_deepspeed_shm_comm()


def any_rank(flag: bool) -> bool:
    """Whether `flag` is set on any rank, the same answer on every rank. The all-reduce runs
    in host memory (gloo), so asking every step never waits for the device's queue."""
    if world_size() == 1:
        return flag
    votes = torch.tensor([int(flag)])
    dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=_host_memory_group())
    return bool(votes.item())


_gloo_beside_nccl: dist.ProcessGroup | None = None


def _host_memory_group() -> dist.ProcessGroup | None:
    """None (the default group) where it is gloo already; beside NCCL a gloo group, made on
    first use (new_group is collective: every rank votes at the same steps)."""
    global _gloo_beside_nccl
    if dist.get_backend() == "gloo":
        return None
    if _gloo_beside_nccl is None:
        _gloo_beside_nccl = dist.new_group(backend="gloo")
    return _gloo_beside_nccl


def exit_after_run(code: int) -> None:
    """End a command that may have trained in this process (launcher.train, a seed study, the demo, a
    throughput benchmark): its process group first, as shutdown_process_group says why (and NCCL warns
    at exit when it is left), then the exit code. In-process callers of those mains keep their group
    (DeepSpeed and the SP-group cache hold it for the next run in the same process)."""
    shutdown_process_group()
    sys.exit(code)


def shutdown_process_group() -> None:
    """Destroy the process group at the end of a command-line run.

    Left to the interpreter's exit, the group's gloo threads can be torn down while still
    joinable, which aborts the process after a finished run ("terminate called without an
    active exception", exit -6: seen once in CI, rank 1 of an SP=2 ZeRO-3 run on the CPU).
    The barrier first: a rank that tore its group down while its peer was still in the run's
    last collective aborted the same way (seen once more in CI, the DP=2 run under DeepSpeed's
    own launcher, after all six steps had finished).
    The collections around it: gloo's async work objects hold tensors, and one kept alive by a
    reference cycle (an engine's or a hook's) would otherwise be freed at interpreter
    finalisation, where releasing its tensors takes the GIL of an interpreter being torn down
    (PyTorch's own diagnosis of this abort, pytorch/pytorch#179291); collected here, they are freed
    while everything is still alive, and the group's last references with them.
    """
    global _gloo_beside_nccl
    if dist.is_initialized():
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
    _gloo_beside_nccl = None
    gc.collect()


def skip_deepspeed_shm_comm() -> None:
    """Stop DeepSpeed's CPU accelerator from compiling its shared-memory all-reduce op.

    DeepSpeed builds `deepspeed_shm_comm` (a C++ extension, 30-115 s on 2 cores the first
    time) whenever it wraps a process group on the CPU, but only `inference_all_reduce`
    (tensor-parallel inference) uses it; training collectives go through torch.distributed.
    So we mark the op incompatible in DeepSpeed's op table (one module-level dict whose edits
    persist) in every CPU world, and no multi-process test pays for the build.
    """
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def sequence_parallel_group(sp: int) -> tuple[dist.ProcessGroup | None, int]:
    """(this rank's SP group, its rank in it). Groups are blocks of sp consecutive ranks,
    the layout data_prep.loader.data_parallel_coords assumes. Every rank must call this
    (new_group is collective), also for groups it is not in."""
    if sp == 1:
        return None, 0
    me, world = rank(), world_size()
    mine = None
    for start in range(0, world, sp):
        group = dist.new_group(list(range(start, start + sp)))
        if start <= me < start + sp:
            mine = group
    return mine, me % sp


def broadcast_object(value, src: int = 0):
    """Rank src's `value` on every rank (e.g. the MLflow run id)."""
    if world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=src)
    return box[0]
