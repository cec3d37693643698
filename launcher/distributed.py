"""Process-group setup for the trainer: one code path for a single CPU process and for
`torchrun`/`deepspeed` launched worlds."""
from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

REPO_ROOT = Path(__file__).resolve().parent.parent
SINGLE_PROCESS_ENV = {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "LOCAL_RANK": "0",
                      "WORLD_SIZE": "1"}


def _free_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def init_process_group() -> None:
    """Initialise torch.distributed if nobody has yet.

    Without a launcher we fill in a one-process world (on a free port, so parallel test
    runs do not collide). We create the group ourselves, before deepspeed.initialize, so
    DeepSpeed adopts it instead of running its MPI discovery.
    """
    if dist.is_initialized():
        return
    # Multi-process CPU worlds still build DeepSpeed's C++ ops: keep them in the repo cache
    # so the cost (~30 s) is paid once per checkout.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO_ROOT / ".cache" / "torch_extensions"))
    if "WORLD_SIZE" not in os.environ:
        os.environ.update(SINGLE_PROCESS_ENV, MASTER_PORT=_free_port())
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend)
    if int(os.environ["WORLD_SIZE"]) == 1:
        skip_deepspeed_shm_comm()


def skip_deepspeed_shm_comm() -> None:
    """Stop DeepSpeed's CPU accelerator from compiling its shared-memory all-reduce op.

    DeepSpeed builds `deepspeed_shm_comm` (a C++ extension, ~30 s on 2 cores the first
    time) whenever it wraps a process group on the CPU. In a one-process world there is
    nothing to all-reduce, so we mark the op incompatible in DeepSpeed's op table (one
    module-level dict whose edits persist); DeepSpeed then uses plain torch.distributed.
    """
    if torch.cuda.is_available():
        return
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0
