"""MFU against the GPU's dense bf16 peak (both numbers from launcher.flops), and memory."""
from __future__ import annotations

import torch

from launcher.flops import gpu_peak_tflops, train_flops_per_token  # noqa: F401 (re-exported)


def device_peak_tflops(configured: float | None = None) -> float | None:
    """The configured peak, else the table's entry for this GPU; None on the CPU or an
    unknown GPU (then no MFU is logged)."""
    if configured:
        return configured
    if not torch.cuda.is_available():
        return None
    return gpu_peak_tflops(torch.cuda.get_device_name())


def mfu(tokens_per_s_per_device: float, flops_per_token: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation as a fraction of the peak (0.4 = 40%)."""
    return tokens_per_s_per_device * flops_per_token / (peak_tflops * 1e12)


def memory_gib() -> float:
    """Peak device memory on a GPU, else this process's resident set size."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
