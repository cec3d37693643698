"""Typed model configuration and named presets.

Every architectural switch the paper ablates lives here (attention backend, QK-norm,
Q/K smoothing), so one config fully determines the network that gets built.
"""
from __future__ import annotations

from typing import Literal

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from sagebwd.triton.registry import KernelChoiceError, parse as parse_kernels
from sagebwd.validate import QUANT_CONTRACTS, SUPPORTED_HEAD_DIMS, key_tile

from model.loss import LossImpl
from model.qkv import QkvImpl, supports_fused

# GPT-2 BPE has 50257 tokens; 50304 = next multiple of 64, which keeps the embedding and
# LM-head matmuls on tensor-core friendly shapes (as in nanoGPT). The extra rows are never
# targets, so they only cost 47 * hidden parameters.
GPT2_VOCAB_SIZE = 50257

AttentionBackend = Literal["fpa", "sagebwd"]
Smoothing = Literal["none", "k", "qk"]
# SageBwd's quantisation contract (sagebwd.validate.QUANT_CONTRACTS; docs/sagebwd.md): "block",
# the paper's per-block scales, or "token", per-token scales.
QuantContract = Literal[QUANT_CONTRACTS]
# Which torch SDPA kernel runs attention="fpa"; "auto" lets PyTorch choose: with torch 2.11 on
# an H200 it ran cuDNN for bf16 head-dim-64 training steps (profiled; docs/results.md).
FpaKernel = Literal["auto", "flash", "cudnn", "efficient", "math"]


class ModelConfig(BaseModel):
    """Llama-style decoder: RoPE, RMSNorm, SwiGLU, no biases."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Named shape (see PRESETS); explicitly given fields override the preset's values.
    preset: str | None = None
    vocab_size: int = GPT2_VOCAB_SIZE
    pad_vocab_to_multiple_of: int = 64
    seq_len: int = 4096
    hidden_size: int = 1024
    num_layers: int = 24
    num_heads: int = 16
    ffn_hidden_size: int = 3072
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_embeddings: bool = True
    init_std: float = 0.02

    attention: AttentionBackend = "fpa"
    fpa_kernel: FpaKernel = "auto"
    qk_norm: bool = False
    smoothing: Smoothing = "none"
    quant: QuantContract = "block"
    # Which SageBwd kernels run: "default", "triton" or PASS=NAME items (sagebwd.triton.registry,
    # read and checked there; `python -m sagebwd.triton.registry` prints the table). For
    # benchmarking: the contract, and so the numbers, are the same; only speed (and for the
    # experimental "fused" kernel dQ's last bits run to run) differs.
    sagebwd_kernels: str = "default"
    # SageBwd quantises per tile; the sequence must split evenly into these tiles.
    block_q: int = 128
    block_kv: int = 64
    # How the LM head and its cross-entropy run when the trainer passes targets (model/loss.py):
    # "plain" materialises the micro-batch's logits and their fp32 copy (the reference),
    # "chunked" computes the same loss and gradients (within bf16 rounding)
    # loss_chunk_tokens rows of logits at a time. Not an architectural switch.
    loss_impl: LossImpl = "plain"
    loss_chunk_tokens: int = 2048
    # How q, k, v are made from the qkv projection (split, QK-norm, RoPE; model/qkv.py): "plain", the torch
    # formula (the reference), or "fused", one Triton kernel each way on CUDA (the same formula to bf16
    # rounding; on CPU the plain formula runs). Not an architectural switch.
    qkv_impl: QkvImpl = "plain"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def padded_vocab_size(self) -> int:
        m = self.pad_vocab_to_multiple_of
        return -(-self.vocab_size // m) * m

    @property
    def smooth_k(self) -> bool:
        return self.smoothing in ("k", "qk")

    @property
    def smooth_q(self) -> bool:
        return self.smoothing == "qk"

    @model_validator(mode="before")
    @classmethod
    def _expand_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") is not None:
            name = data["preset"]
            if name not in PRESETS:
                raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
            data = {**PRESETS[name], **data}
        return data

    @model_validator(mode="after")
    def _check_consistency(self) -> "ModelConfig":
        positive = ("vocab_size", "pad_vocab_to_multiple_of", "seq_len", "hidden_size",
                    "num_layers", "num_heads", "ffn_hidden_size", "block_q", "block_kv",
                    "loss_chunk_tokens")
        problems = [f"model.{name} must be positive, got {getattr(self, name)}"
                    for name in positive if getattr(self, name) <= 0]
        if problems:   # the checks below divide by these
            raise ValueError("\n  ".join(problems))
        if self.hidden_size % self.num_heads:
            problems.append(
                f"model.hidden_size ({self.hidden_size}) must be divisible by model.num_heads "
                f"({self.num_heads}); pick num_heads so that hidden_size / num_heads is the head dim")
        elif self.head_dim % 2:
            problems.append(f"RoPE needs an even head dim, got {self.head_dim}")
        elif self.qkv_impl == "fused" and not supports_fused(self.head_dim):
            problems.append(f"model.qkv_impl='fused' needs a power-of-two head dim >= 4, got {self.head_dim}; "
                            "set model.qkv_impl=plain")
        if self.attention == "fpa" and self.smoothing != "none":
            problems.append(
                f"model.smoothing={self.smoothing!r} only applies to attention='sagebwd' "
                "(it preconditions INT8 quantisation); set model.smoothing=none for fpa")
        if self.attention == "fpa" and self.quant != "block":
            problems.append(
                f"model.quant={self.quant!r} only applies to attention='sagebwd' (SageBwd's "
                "quantisation contract); leave model.quant unset for fpa")
        if self.attention == "fpa" and self.sagebwd_kernels != "default":
            problems.append(f"model.sagebwd_kernels={self.sagebwd_kernels!r} only applies to attention='sagebwd'")
        if self.attention == "sagebwd":
            try:
                parse_kernels(self.sagebwd_kernels)
            except KernelChoiceError as err:
                problems.append(f"model.sagebwd_kernels: {err}")
            if self.head_dim not in SUPPORTED_HEAD_DIMS:
                problems.append(
                    f"attention='sagebwd' supports head dim {SUPPORTED_HEAD_DIMS}, got "
                    f"{self.head_dim} (hidden_size {self.hidden_size} / num_heads {self.num_heads})")
            for block in ("block_q", "block_kv"):
                if self.seq_len % getattr(self, block):
                    problems.append(
                        f"model.seq_len ({self.seq_len}) must be a multiple of model.{block} "
                        f"({getattr(self, block)}) for attention='sagebwd'; change seq_len or "
                        f"set a smaller {block}")
            tile = key_tile(self.quant, self.block_kv)
            if tile != self.block_kv and self.seq_len % tile:   # (else the block_kv check above says it)
                problems.append(
                    f"model.seq_len ({self.seq_len}) must be a multiple of {tile} for model.quant="
                    f"{self.quant!r} (its forward quantises P and V per {tile}-key tile); change seq_len or "
                    "use quant='block'")
        if problems:   # every problem at once
            raise ValueError("\n  ".join(problems))
        return self


PRESETS: dict[str, dict] = {
    # The paper's model: 24 x 1024, 16 heads of 64, SwiGLU 3072, GPT-2 vocab, context 4096.
    "llama-325m": dict(seq_len=4096, hidden_size=1024, num_layers=24, num_heads=16,
                       ffn_hidden_size=3072),
    # The paper's grid scaled down to one GPU (issue 25): 8 x 512, 8 heads of 64, SwiGLU 1536,
    # context 1024; 27.3M parameters outside the (tied) 25.8M-parameter embedding.
    "llama-small": dict(seq_len=1024, hidden_size=512, num_layers=8, num_heads=8,
                        ffn_hidden_size=1536),
    # CPU-sized models for tests and the demo; same code path, tiny shapes.
    "tiny": dict(seq_len=256, hidden_size=128, num_layers=2, num_heads=2, ffn_hidden_size=384),
    "micro": dict(seq_len=64, hidden_size=128, num_layers=1, num_heads=2, ffn_hidden_size=256,
                  block_q=32, block_kv=32),
}


def model_config_from_preset(name: str, **overrides: Any) -> ModelConfig:
    """Preset shapes plus explicit overrides (overrides win)."""
    return ModelConfig(preset=name, **overrides)
