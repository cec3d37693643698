"""Rough wall time of a run from the node's bf16 peak: for planning and the expand table,
never for anything that must be exact."""
from __future__ import annotations

ASSUMED_MFU = 0.40   # model FLOPs utilisation a well-tuned 325M run reaches; an assumption


def train_flops_per_token(*, hidden: int, layers: int, ffn: int, vocab: int, seq_len: int) -> float:
    """6 x matmul parameters (attention projections, SwiGLU, LM head) plus causal attention
    scores (QK^T and PV: 12 * L * seq * d, halved by the mask), forward + backward."""
    matmul_params = layers * (4 * hidden * hidden + 3 * hidden * ffn) + vocab * hidden
    return 6 * matmul_params + 6 * layers * seq_len * hidden


def estimated_hours(total_tokens: int, flops_per_token: float, gpus: int,
                    peak_tflops: float | None) -> float | None:
    if not peak_tflops or not gpus:
        return None
    return total_tokens * flops_per_token / (gpus * peak_tflops * 1e12 * ASSUMED_MFU) / 3600
