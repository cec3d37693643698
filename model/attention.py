"""Causal self-attention with a swappable core attention call.

`CoreAttention` is the single function boundary between the model and the attention
kernel: it takes q, k, v as (batch, heads, seq, head_dim) and returns the same layout.
Keeping it one module lets DeepSpeed-Ulysses `DistributedAttention` wrap it unchanged
(scatter heads = dim 1, gather seq = dim 2).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from model.config import ModelConfig
from model.layers import RMSNorm, RotaryEmbedding
from model.qkv import attention_inputs


SDPA_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                 "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


class CoreAttention(nn.Module):
    """softmax(q k^T / sqrt(d)) v with a causal mask, by full-precision SDPA or SageBwd."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.backend = config.attention
        self.fpa_kernel = config.fpa_kernel
        self.smooth_k = config.smooth_k
        self.smooth_q = config.smooth_q
        self.block_q = config.block_q
        self.block_kv = config.block_kv
        self.quant = config.quant
        self.kernels = config.sagebwd_kernels

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.backend == "fpa":
            if self.fpa_kernel == "auto":
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            # Pinned so FPA baselines name the kernel they measured (cuDNN vs FA2 differ ~1.7x).
            with sdpa_kernel(SDPA_BACKENDS[self.fpa_kernel]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # Imported lazily so FPA models build even where the kernel package is unavailable.
        import sagebwd

        # No per-call finiteness check: it syncs the device three times per layer, and a
        # non-finite input makes the loss non-finite, which the trainer's guard stops on.
        return sagebwd.attention(q, k, v, causal=True, smooth_k=self.smooth_k,
                                 smooth_q=self.smooth_q, block_q=self.block_q,
                                 block_kv=self.block_kv, quant=self.quant, check_finite=False,
                                 **({} if self.kernels == "default" else {"kernels": self.kernels}))

    def extra_repr(self) -> str:
        if self.backend == "fpa":
            return f"backend=fpa, fpa_kernel={self.fpa_kernel}"
        return (f"backend=sagebwd, smooth_q={self.smooth_q}, smooth_k={self.smooth_k}, "
                f"block_q={self.block_q}, block_kv={self.block_kv}, quant={self.quant}, kernels={self.kernels}")


class CausalSelfAttention(nn.Module):
    """Projections, optional QK-norm, RoPE, core attention, output projection."""

    def __init__(self, config: ModelConfig, rope: RotaryEmbedding):
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.out = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        # QK-norm bounds the logit scale (and the INT8 range); one learned scale per head
        # channel, shared across heads. Applied before RoPE so rotation keeps the norm.
        self.q_norm = RMSNorm(self.head_dim, config.norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.norm_eps) if config.qk_norm else None
        self.rope = rope
        self.qkv_impl = config.qkv_impl   # how q, k, v are made from the projection (model/qkv.py)
        self.core = CoreAttention(config)

    def forward(self, x: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        """x: (batch, seq, hidden), tokens start_pos.. of their sequences (non-zero for a
        sequence-parallel shard, so RoPE sees the tokens' true positions)."""
        batch, seq, hidden = x.shape
        positions = None if start_pos == 0 else torch.arange(start_pos, start_pos + seq,
                                                             device=x.device)
        q, k, v = attention_inputs(self.qkv_impl, self.qkv(x), self.num_heads, self.q_norm, self.k_norm,
                                   self.rope, positions)
        y = self.core(q, k, v)
        # y is (batch, seq, heads, head_dim) in memory for sagebwd and SDPA's FLASH: a view here
        return self.out(y.transpose(1, 2).reshape(batch, seq, hidden))
