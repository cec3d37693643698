"""Wraps the model in a DeepSpeed engine with a client AdamW and the warmup-cosine schedule."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from launcher.config import RunConfig
from launcher.schedule import build_lr_scheduler


def deepspeed_config(config: RunConfig) -> dict[str, Any]:
    """The DeepSpeed JSON config derived from the run config (the run config is the source
    of truth; nothing DeepSpeed-specific is written by hand)."""
    return {
        "train_micro_batch_size_per_gpu": config.train.micro_batch_size,
        "gradient_accumulation_steps": config.train.grad_accum_steps,
        "gradient_clipping": config.optimizer.grad_clip,
        "zero_optimization": {"stage": 0},
        # We print our own progress lines; DeepSpeed's would interleave with them.
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


def adamw_param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay matrices (projections, embeddings); never decay norm scales."""
    params = {id(p): p for p in model.parameters() if p.requires_grad}.values()
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def build_engine(model: nn.Module, config: RunConfig):
    """deepspeed.initialize with a client torch.optim.AdamW.

    A client optimizer avoids DeepSpeed's FusedAdam, whose C++ build costs ~2 min on a
    2-core CPU; on GPU torch's fused AdamW is as fast.
    """
    import deepspeed

    opt = config.optimizer
    optimizer = torch.optim.AdamW(adamw_param_groups(model, opt.weight_decay), lr=opt.lr,
                                  betas=opt.betas, eps=opt.eps,
                                  fused=torch.cuda.is_available() or None)
    scheduler = build_lr_scheduler(optimizer, config.train.steps, config.schedule)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                           lr_scheduler=scheduler,
                                           config=deepspeed_config(config))
    return engine
