"""Model FLOPs per token and MFU against the GPU's dense bf16 peak."""
from __future__ import annotations

import torch

from model import ModelConfig

# Dense (no sparsity) bf16 tensor-core peaks per GPU, TFLOP/s, from the vendors' datasheets;
# the same numbers as experiments/nodes/*.yaml. Matched against the device name in order.
BF16_DENSE_PEAK_TFLOPS: dict[str, float] = {
    "B200": 2250.0,    # HGX B200: 4.5 PF sparse / 2
    "H200": 989.0,     # same Hopper tensor cores as H100 SXM
    "H100": 989.0,     # H100 SXM: 1,979 sparse / 2
    "RTX 4090": 165.0,
}


def train_flops_per_token(m: ModelConfig) -> float:
    """Forward + backward FLOPs per token: 6 x matmul parameters (q, k, v, o, SwiGLU, LM
    head) plus the causal attention scores and values (12 * layers * seq * hidden, halved by
    the mask). Same formula as experiments.grid.cost, so planned and measured MFU agree."""
    matmul_params = (m.num_layers * (4 * m.hidden_size ** 2 + 3 * m.hidden_size * m.ffn_hidden_size)
                     + m.padded_vocab_size * m.hidden_size)
    return 6 * matmul_params + 6 * m.num_layers * m.seq_len * m.hidden_size


def device_peak_tflops(configured: float | None = None) -> float | None:
    """The configured peak, else the table's entry for this GPU; None on the CPU or an
    unknown GPU (then no MFU is logged)."""
    if configured:
        return configured
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name().upper()
    for key, tflops in BF16_DENSE_PEAK_TFLOPS.items():
        if key.upper() in name:
            return tflops
    return None


def mfu(tokens_per_s_per_device: float, flops_per_token: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation as a fraction of the peak (0.4 = 40%)."""
    return tokens_per_s_per_device * flops_per_token / (peak_tflops * 1e12)


def memory_gib() -> float:
    """Peak device memory on a GPU, else this process's resident set size."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
