"""Rough wall time of a run from the node's bf16 peak: for planning and the expand table,
never for anything that must be exact. FLOPs per token and the peaks are launcher.flops'."""
from __future__ import annotations

ASSUMED_MFU = 0.40   # model FLOPs utilisation a well-tuned 325M run reaches; an assumption


def estimated_hours(total_tokens: int, flops_per_token: float, gpus: int,
                    peak_tflops: float | None) -> float | None:
    if not peak_tflops or not gpus:
        return None
    return total_tokens * flops_per_token / (gpus * peak_tflops * 1e12 * ASSUMED_MFU) / 3600
