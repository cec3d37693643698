"""What a training step costs and what a GPU offers, in FLOPs: the model's FLOPs per token
and the dense bf16 peak per GPU. The trainer's MFU (launcher.throughput) and the manifest
planner's wall-time estimate (experiments.grid) both divide one by the other, so both read
them here. No torch import: planning a grid does not start it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from model import ModelConfig

# Dense (no sparsity) bf16 tensor-core peaks per GPU, TFLOP/s, from the vendors' datasheets.
# Node profiles (experiments/nodes/*.yaml) name their GPU and take its number from here;
# a device is matched against these names in order.
BF16_DENSE_PEAK_TFLOPS: dict[str, float] = {
    "B200": 2250.0,    # HGX B200: 4.5 PF sparse / 2
    "H200": 989.0,     # same Hopper tensor cores as H100 SXM (1,979 sparse / 2)
    "H100": 989.0,     # H100 SXM: 1,979 sparse / 2
    # Ada whitepaper: 165.2 dense FP16/BF16 with FP16 accumulate; GeForce runs FP32 accumulate
    # (what bf16 training uses) at half that, 82.6. We list the headline figure.
    "RTX 4090": 165.0,
}


def gpu_peak_tflops(name: str) -> float | None:
    """The table's peak for a GPU or device name ('NVIDIA H100 80GB HBM3' -> 989); None when
    no entry matches."""
    upper = name.upper()
    for key, tflops in BF16_DENSE_PEAK_TFLOPS.items():
        if key.upper() in upper:
            return tflops
    return None


def flops_per_token(*, hidden: int, layers: int, ffn: int, vocab: int, seq_len: int) -> float:
    """Forward + backward FLOPs per token: 6 x matmul parameters (q, k, v, o, SwiGLU, LM
    head) plus the causal attention scores and values (12 * layers * seq * hidden, halved by
    the mask)."""
    matmul_params = layers * (4 * hidden * hidden + 3 * hidden * ffn) + vocab * hidden
    return 6 * matmul_params + 6 * layers * seq_len * hidden


def train_flops_per_token(m: "ModelConfig") -> float:
    """flops_per_token of a model config."""
    return flops_per_token(hidden=m.hidden_size, layers=m.num_layers, ffn=m.ffn_hidden_size,
                           vocab=m.padded_vocab_size, seq_len=m.seq_len)
