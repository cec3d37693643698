"""torchrun worker, 2 ranks: the gradients of a Llama with DeepSpeed-Ulysses SP=2 are the same
with the model under torch.compile as without it.

    python -m torch.distributed.run --standalone --nproc-per-node=2 tests/sp_compile_worker.py \
        [--attention fpa|sagebwd] [--dtype float32|bfloat16]

Each rank runs its sequence shard, the SP ranks' partial gradients are summed (as DeepSpeed's
gradient all-reduce does), and rank 0 prints the largest relative L2 difference between eager and
compiled over all parameters. It also counts the all-to-alls that torch.compile traced into its
graphs: traced, DeepSpeed's exchange lost its gradient on NCCL (relative difference 1.0, 2 x H200;
gloo kept it), so the Ulysses wrapper runs eagerly and the count must be 0. Exit 1 if either
check fails. gloo on the CPU, NCCL on GPUs (tests/test_distributed.py, tests/test_sp_compile_gpu.py).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
REPO = Path(__file__).resolve().parent.parent


def launch(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run this worker on 2 local ranks under torchrun (for the tests)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           __file__, *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def summed_grads(model, x, y, start: int) -> dict[str, torch.Tensor]:
    from launcher.train import lm_loss

    model.zero_grad(set_to_none=True)
    lm_loss(model(x, start_pos=start), y).backward()
    grads = {}
    for name, p in model.named_parameters():
        g = (p.grad if p.grad is not None else torch.zeros_like(p)).float()
        dist.all_reduce(g)
        grads[name] = g
    return grads


def traced_all_to_alls(model, x, start: int) -> int:
    """All-to-alls inside the graphs dynamo captures for the model's forward (and the backward
    graphs of the autograd functions it traces)."""
    explained = torch._dynamo.explain(model.forward)(x, start_pos=start)
    return sum("all_to_all" in module.code for graph in explained.graphs
               for module in graph.modules() if hasattr(module, "code"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--attention", default="fpa", choices=["fpa", "sagebwd"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)

    import deepspeed

    from launcher.distributed import (init_process_group, sequence_parallel_group,
                                      shutdown_process_group)
    from model.config import ModelConfig
    from model.llama import Llama
    from model.sequence_parallel import enable_ulysses

    init_process_group()
    deepspeed.init_distributed(dist_backend=dist.get_backend())   # adopts the group
    group, sp_rank = sequence_parallel_group(2)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device("cpu")
    config = ModelConfig(preset="tiny", attention=args.attention,
                         smoothing="k" if args.attention == "sagebwd" else "none")
    torch.manual_seed(0)
    model = Llama(config).to(device=device, dtype=dtype)
    enable_ulysses(model, group)
    tokens = torch.randint(0, config.vocab_size, (2, config.seq_len + 1),
                           generator=torch.Generator().manual_seed(1)).to(device)
    shard = config.seq_len // 2
    start = sp_rank * shard
    x, y = tokens[:, start:start + shard], tokens[:, start + 1:start + shard + 1]

    eager = summed_grads(model, x, y, start)
    model.compile()   # as the trainer's train.compile does
    compiled = summed_grads(model, x, y, start)

    errors = {name: ((compiled[name] - g).norm() / g.norm().clamp_min(1e-30)).item()
              for name, g in eager.items()}
    worst = max(errors, key=errors.get)
    traced = traced_all_to_alls(model, x, start)
    ok = errors[worst] <= TOLERANCE[dtype] and traced == 0
    if dist.get_rank() == 0:
        print(f"sp2 {args.attention} {args.dtype} on {dist.get_backend()}: largest relative "
              f"gradient difference, compiled vs eager: {errors[worst]:.2e} ({worst}); "
              f"all-to-alls traced into compiled graphs: {traced}; "
              f"{'OK' if ok else 'MISMATCH'}", flush=True)
    shutdown_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
