"""Learning-rate schedule: linear warmup, then cosine decay to a floor."""
from __future__ import annotations

import math

import torch

from launcher.config import ScheduleConfig


def lr_multiplier(step: int, total_steps: int, schedule: ScheduleConfig) -> float:
    """Multiplier on the peak lr for optimizer step `step` (0-based)."""
    warmup = schedule.warmup_steps
    if step < warmup:
        return (step + 1) / warmup
    decay_steps = max(1, total_steps - warmup - 1)
    progress = min(1.0, (step - warmup) / decay_steps)
    floor = schedule.min_lr_ratio
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_lr_scheduler(optimizer: torch.optim.Optimizer, total_steps: int,
                       schedule: ScheduleConfig) -> torch.optim.lr_scheduler.LambdaLR:
    # The DeepSpeed engine steps this once per optimizer step (not per micro-batch).
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(step, total_steps, schedule))
