"""DeepSpeed-Ulysses sequence parallelism around the model's one attention call.

Outside attention each rank of an SP group holds seq_len/sp tokens of every sample. Before
attention, DeepSpeed's `DistributedAttention` all-to-alls q, k, v so that each rank holds the
whole sequence for num_heads/sp heads; the local kernel (SDPA or SageBwd, unchanged, causal
over the full sequence) runs; a second all-to-all gives the sequence shard back.
"""
from __future__ import annotations

import torch
from torch import nn


class HeadsFirst(nn.Module):
    """Adapts CoreAttention's (batch, heads, seq, dim) to DeepSpeed's (batch, seq, heads, dim)."""

    def __init__(self, core: nn.Module):
        super().__init__()
        self.core = core

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # Views, no copies: the kernels read (batch, seq, heads, dim) memory as they do without SP,
        # and return O in it (sagebwd and SDPA's FLASH), which the second all-to-all takes as is.
        out = self.core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return out.transpose(1, 2)


class UlyssesAttention(nn.Module):
    """Drop-in replacement for CoreAttention on one rank of an SP group."""

    def __init__(self, core: nn.Module, group):
        super().__init__()
        from deepspeed.sequence.layer import DistributedAttention

        # (batch, seq, heads, dim): scatter the heads (dim 2), gather the sequence (dim 1).
        self.dist_attn = DistributedAttention(HeadsFirst(core), group, scatter_idx=2,
                                              gather_idx=1)

    # Runs eagerly inside a compiled model (a graph break on each side). DeepSpeed's _SeqAllToAll
    # fills an empty buffer with an in-place all_to_all_single; traced by torch.compile on NCCL,
    # its gradient was lost: grad norm halved and training diverged from the eager run (2 x
    # H200, docs/results.md; tests/sp_compile_worker.py checks the gradients).
    @torch.compiler.disable
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # contiguous (the all-to-all reshapes its input with views): a no-op for q and k, which RoPE
        # writes in (batch, seq, heads, dim) memory; v, a view of the qkv projection, is copied
        out = self.dist_attn(q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(),
                             v.transpose(1, 2).contiguous(), batch_dim_idx=0)
        return out.transpose(1, 2)


def enable_ulysses(model: nn.Module, group) -> None:
    """Wrap every layer's CoreAttention; call before the model goes to DeepSpeed."""
    from model.attention import CausalSelfAttention

    for module in model.modules():
        if isinstance(module, CausalSelfAttention):
            module.core = UlyssesAttention(module.core, group)
