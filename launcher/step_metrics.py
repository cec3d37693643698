"""What a training step leaves on the device, and the one place the loop reads it back.

Reading a device value on the host (`.item()`, `float(t)`, `.tolist()`, `if t:`) waits for
every kernel queued before it. Read once a step, the host cannot queue step n+1 while the GPU
still runs step n, so the GPU idles at the head of every step for as long as the host takes to
launch the first kernels. So each step keeps its loss and grad norm on the device
(`PendingStep`), and `read_metrics` fetches all the steps since the last read at once, at the
loop's read points (`is_read_point`): progress lines, evals, checkpoints, MLflow flushes, the
last step. Every step is still logged with its own values; what the host knows without
waiting (lr, tokens seen, peak memory, the time) is kept from the step itself.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from launcher.config import RunConfig
from launcher.distributed import world_size


@dataclass
class PendingStep:
    step: int
    loss: torch.Tensor        # this rank's mean loss, float64 scalar on the device
    grad_norm: torch.Tensor   # the pre-clip global norm, float64 scalar on the device
    lr: float
    tokens_seen: int
    memory_gib: float
    time_ms: int              # wall clock when the host had queued the step


def as_float64(value: torch.Tensor | float | None, device) -> torch.Tensor:
    """A float64 scalar on the device, not aliasing `value` (DeepSpeed may reuse its tensor):
    fp32 -> float64 is exact, so the host later reads the same number `float(value)` gives."""
    if value is None:
        value = float("nan")
    if torch.is_tensor(value):
        return value.detach().to(torch.float64, copy=True)
    return torch.tensor(value, dtype=torch.float64, device=device)


def world_mean(values: torch.Tensor) -> torch.Tensor:
    """Each element's mean over all ranks (one all-reduce; no host read)."""
    if world_size() > 1:
        dist.all_reduce(values)
        values /= world_size()
    return values


def read_metrics(steps: list[PendingStep]) -> list[tuple[float, float]]:
    """(the world's mean loss, grad norm) of each step, in order: one all-reduce and one
    device-to-host copy for all of them, the only host read of the step loop."""
    losses = world_mean(torch.stack([s.loss for s in steps]))
    norms = torch.stack([s.grad_norm for s in steps])
    return [(loss, norm) for loss, norm in torch.stack([losses, norms], dim=1).tolist()]


def is_read_point(config: RunConfig, step: int, first_step: int) -> bool:
    """Whether the host needs this step's numbers now (every rank decides alike, so the
    all-reduce in read_metrics meets on all of them): a progress line (also the process's
    first step, which is timed apart because it includes the warm-up), an eval, a checkpoint
    (never saved before its steps are known to be finite), an MLflow flush, the last step.
    A stop signal is a read point too; the loop asks for it itself."""
    every = [config.train.log_every, config.eval.every, config.tracking.flush_every,
             config.checkpoint.every if config.checkpoint.dir else 0]
    return (step == first_step or step == config.train.steps
            or any(n and step % n == 0 for n in every))
