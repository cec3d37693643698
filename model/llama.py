"""The Llama decoder: embeddings, pre-norm blocks, final norm, LM head."""
from __future__ import annotations

import math

import torch
from torch import nn

from model.attention import CausalSelfAttention
from model.config import ModelConfig
from model.layers import RMSNorm, RotaryEmbedding, SwiGLU
from model.loss import lm_head_loss


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig, rope: RotaryEmbedding):
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.attn = CausalSelfAttention(config, rope)
        self.mlp_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.ffn_hidden_size)

    def forward(self, x: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), start_pos)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """Token ids (batch, seq) -> next-token logits (batch, seq, padded_vocab_size)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.padded_vocab_size, config.hidden_size)
        # One rotary table shared by all layers (a non-persistent buffer, not a parameter).
        rope = RotaryEmbedding(config.head_dim, config.seq_len, config.rope_theta)
        self.blocks = nn.ModuleList(Block(config, rope) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.padded_vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, std) weights; residual-output projections scaled by 1/sqrt(2 * layers)
        (GPT-2) so the residual stream's variance does not grow with depth."""
        std = self.config.init_std
        residual_std = std / math.sqrt(2 * self.config.num_layers)
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue  # norm scales stay at 1
            is_residual_out = name.endswith(("attn.out.weight", "mlp.down.weight"))
            nn.init.normal_(p, mean=0.0, std=residual_std if is_residual_out else std)

    def forward(self, input_ids: torch.Tensor, start_pos: int = 0,
                targets: torch.Tensor | None = None) -> torch.Tensor:
        """start_pos: position of input_ids[:, 0] in its sequence (a sequence-parallel shard
        of rank r holds tokens r * seq_len/sp ...). With targets (batch, seq): the mean
        cross-entropy of the LM head instead of the logits, by config.loss_impl
        (model/loss.py; "chunked" never holds the whole batch's logits)."""
        if start_pos + input_ids.shape[1] > self.config.seq_len:
            raise ValueError(f"input has tokens up to position {start_pos + input_ids.shape[1]} "
                             f"but the model was built for seq_len {self.config.seq_len}")
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, start_pos)
        if targets is None:
            return self.lm_head(self.norm(x))
        return lm_head_loss(self.norm(x), self.lm_head.weight, targets, self.config.loss_impl,
                            self.config.loss_chunk_tokens)


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Unique parameters (tied weights counted once), split into embedding vs the rest."""
    unique = {id(p): p for p in model.parameters()}.values()
    total = sum(p.numel() for p in unique)
    embedding = model.embed.weight.numel()
    if not model.config.tie_embeddings:
        embedding += model.lm_head.weight.numel()
    return {"total": total, "embedding": embedding, "non_embedding": total - embedding}
