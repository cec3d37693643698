"""Building blocks of the Llama decoder: RMSNorm, rotary embeddings, SwiGLU."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned per-channel scale (no bias, no centring)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 so bf16 activations do not lose the small-variance channels, and
        # return the input dtype: under autocast an fp32 scale must not promote q/k to fp32
        # while v stays bf16 (the attention kernels need one dtype).
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).type_as(x)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoFormer/Llama), applied to (batch, heads, seq, head_dim).

    Channels are paired as (i, i + head_dim/2), the Llama/HF "rotate half" convention:
    (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin). Computed on the channels viewed as (2, head_dim/2),
    as x cos + flip(x) sin with sin signed (-sin, sin) by half: the rotate-half formula's products and
    sums, so the same bits in eager mode, and under torch.compile an index remap. With torch.cat of the
    two halves Inductor loads every operand of both halves under masks for each element: its fused
    QK-norm + RoPE kernel took 120 us a layer at (4, 12, 4096, 64) on an H200, 72 us this way
    (docs/benchmarks.md, "RoPE without torch.cat").
    """

    def __init__(self, head_dim: int, max_seq_len: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
        sin = angles.sin().float()
        # Buffers are not persistent: they are a pure function of the config, so checkpoints
        # stay valid if the cache length changes. cos: (seq, 1, head_dim/2); sin: (seq, 2, head_dim/2).
        self.register_buffer("cos", angles.cos().float().unsqueeze(-2), persistent=False)
        self.register_buffer("sin", torch.stack((-sin, sin), dim=-2), persistent=False)

    def tables(self, seq: int, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin at the tokens' positions (0.. seq - 1 by default) as contiguous (seq, head_dim/2) tables in the
        buffers' dtype, sin unsigned: the fused kernel's operands (model/qkv.py)."""
        cos, sin = self._at(seq, positions)
        return cos[:, 0].contiguous(), sin[:, 1].contiguous()

    def _at(self, seq: int, positions: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if positions is None:
            return self.cos[:seq], self.sin[:seq]
        return self.cos[positions], self.sin[positions]

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        cos, sin = self._at(x.shape[-2], positions)
        halves = x.float().unflatten(-1, (2, -1))   # (..., seq, 2, head_dim/2): x1 and x2
        rotated = halves * cos + halves.flip(-2) * sin
        return rotated.flatten(-2).type_as(x)


class SwiGLU(nn.Module):
    """Gated feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int):
        super().__init__()
        self.gate = nn.Linear(hidden_size, ffn_hidden_size, bias=False)
        self.up = nn.Linear(hidden_size, ffn_hidden_size, bias=False)
        self.down = nn.Linear(ffn_hidden_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))
