"""Input checks for :func:`sagebwd.attention`, in one place, with messages that say how to fix."""
from __future__ import annotations

import torch

SUPPORTED_HEAD_DIMS = (64, 128)
BACKENDS = ("auto", "simulate", "triton")
# Quantisation contracts: "block" (the paper's per-block scales), "token" (per-token scales);
# docs/sagebwd.md states both.
QUANT_CONTRACTS = ("block", "token")
# The token contract's scales along the key axis cover tiles of max(block_kv, 128) keys (block_kv stays
# the backward's kv tile): the forward's P~ and V^, and the dQ's X = dS s_K (one scale per q row and key
# tile). One INT8 product (P^ V^, X^ K^) then spans 128 keys: half the kernels' per-tile accumulation work
# at the default block_kv = 64 (docs/sagebwd.md; docs/kernel-notes.md, "The token forward over 128 keys",
# "dQ's X per 128-key tile").
TOKEN_KEY_TILE = 128
SIMULATE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
TRITON_DTYPES = (torch.float16, torch.bfloat16)


class SageBwdInputError(ValueError):
    """Raised for inputs SageBwd cannot take; the message says what to change."""


def check_blocks(block_q: int, block_kv: int) -> None:
    for name, b in (("block_q", block_q), ("block_kv", block_kv)):
        if not isinstance(b, int) or b < 16 or b & (b - 1):
            raise SageBwdInputError(f"{name}={b!r} must be a power of two >= 16 (defaults: block_q=128, block_kv=64)")


def key_tile(quant: str, block_kv: int) -> int:
    """Keys per tile of the key-axis scales (the forward's P~ and V^; in "token" also the dQ's X):
    block_kv, or for "token" at least 128."""
    return max(block_kv, TOKEN_KEY_TILE) if quant == "token" else block_kv


def check_kernels(kernels: str) -> None:
    """The kernel choice must be one the registry reads (sagebwd.triton.registry.parse)."""
    from .triton.registry import KernelChoiceError, parse
    # Dynamo traces through lru_cache anyway, and warns that it does: hand it the function itself.
    parse_fn = parse.__wrapped__ if torch.compiler.is_compiling() else parse
    try:
        parse_fn(kernels)
    except KernelChoiceError as err:
        raise SageBwdInputError(str(err)) from None


def check_quant(quant: str) -> None:
    if quant not in QUANT_CONTRACTS:
        raise SageBwdInputError(f"quant={quant!r} is not a quantisation contract; use one of {QUANT_CONTRACTS} "
                                "('block': the paper's per-block scales, 'token': per-token scales)")


def check_seq_len(seq_len: int, block_q: int, block_kv: int, quant: str = "block") -> None:
    multiple = max(block_q, block_kv)
    if seq_len <= 0:
        raise SageBwdInputError(
            f"sequence length {seq_len}: q, k, v hold no tokens; attention needs at least one "
            f"tile of {multiple} positions (pad the sequence, or skip the call for empty inputs)")
    if seq_len % block_q or seq_len % block_kv:
        padded = -(-seq_len // multiple) * multiple
        raise SageBwdInputError(
            f"sequence length {seq_len} is not a multiple of block_q={block_q} and block_kv={block_kv}: "
            f"pad the sequence to a multiple of {multiple} (e.g. {padded}) or pass smaller blocks"
        )
    tile = key_tile(quant, block_kv)
    if seq_len % tile:
        multiple = max(multiple, tile)
        padded = -(-seq_len // multiple) * multiple
        raise SageBwdInputError(
            f"sequence length {seq_len} is not a multiple of {tile}: the {quant!r} contract's forward quantises "
            f"P and V per {tile}-key tile; pad the sequence to a multiple of {multiple} (e.g. {padded}) or use "
            "quant='block'")


def check_tensors(q, k, v) -> None:
    """The first check of all: anything else reads .device/.shape of the inputs."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise SageBwdInputError(f"{name} must be a torch.Tensor, got {type(t).__name__} "
                                    "(convert it with torch.as_tensor, shaped (batch, heads, seq, head_dim))")


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, backend: str, block_q: int,
                 block_kv: int, check_finite: bool, quant: str = "block") -> None:
    check_tensors(q, k, v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise SageBwdInputError(
                f"{name} has shape {tuple(t.shape)}; expected 4 dims (batch, heads, seq, head_dim)")
    if not (q.shape == k.shape == v.shape):
        raise SageBwdInputError(
            f"q, k, v must have the same shape (batch, heads, seq, head_dim); got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)} (cross-attention and grouped KV heads are not supported: "
            "repeat k/v heads first)")
    if not (q.dtype == k.dtype == v.dtype):
        raise SageBwdInputError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise SageBwdInputError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")
    allowed = TRITON_DTYPES if backend == "triton" else SIMULATE_DTYPES
    if q.dtype not in allowed:
        raise SageBwdInputError(f"dtype {q.dtype} is not supported by backend {backend!r}; use one of {allowed}")
    head_dim = q.shape[-1]
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise SageBwdInputError(
            f"head_dim {head_dim} is not supported; SageBwd supports head_dim in {SUPPORTED_HEAD_DIMS}")
    check_blocks(block_q, block_kv)
    check_seq_len(q.shape[-2], block_q, block_kv, quant)
    if q.numel() == 0:
        raise SageBwdInputError(f"q, k, v of shape {tuple(q.shape)} are empty (a zero batch or head "
                                "count); skip the call for empty inputs")
    if check_finite:
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not bool(torch.isfinite(t).all()):
                raise SageBwdInputError(
                    f"{name} contains NaN or Inf; INT8 scales would be undefined. Check the layer feeding "
                    "attention (or pass check_finite=False to skip this check)")
