"""Exact PyTorch simulation of SageBwd (the paper's Algorithms 1 and 2).

This is the CPU path and the reference the Triton kernels are tested against.
Every INT8 product is an integer matmul carried out exactly in floating point
(see :mod:`sagebwd.quant`), and every scale is applied per block exactly as a
kernel would, so the simulation and a kernel differ only by float rounding of
the scale/softmax arithmetic (exp vs exp2, summation order).

Quantisation granularity (block_q = Bq rows of Q, block_kv = Bkv rows of K/V):

forward (Alg. 1)
  Q: per (Bq x D) block, after optional Q-smoothing (Q_i - mean of block i)
  K: per (Bkv x D) block, after K-smoothing (K - mean over the sequence)
  V: per (Bkv x D) block
  P~: per token inside each kv tile: P^ = round(127 * exp(S - t)) with t the
      row max of the tile, i.e. the paper's s_P = rowmax(P~)/127, which does not
      depend on the running max of the online softmax.
backward (Alg. 2)
  P, dS: per (Bq x Bkv) tile; dO: per (Bq x D) block; dP = dO V^T unquantised.

With Q-smoothing the bias sm_scale * mu_i K_sm^T is added to S in full
precision, and dK gains the bias branch sm_scale * colsum(dS_i)^T mu_i computed
from the unquantised dS.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .quant import QMAX, dequantize_row_blocks, dequantize_tiles, quantize_row_blocks, quantize_tiles


@dataclass(frozen=True)
class SageConfig:
    causal: bool = False
    smooth_k: bool = True
    smooth_q: bool = False
    block_q: int = 128
    block_kv: int = 64
    # False runs the same dataflow without rounding: the tests use it to check the formulas.
    quantize: bool = True


class Saved(NamedTuple):
    """What the forward keeps for the backward (as a kernel would: quantised Q/K, V, O, LSE)."""
    q_hat: torch.Tensor   # (B, H, N, D) integers
    s_q: torch.Tensor     # (B, H, N / Bq)
    k_hat: torch.Tensor   # (B, H, N, D) integers, from smoothed K
    s_k: torch.Tensor     # (B, H, N / Bkv)
    mu_q: torch.Tensor | None   # (B, H, N / Bq, D) block means of Q when Q-smoothing
    k_sm: torch.Tensor | None   # (B, H, N, D) smoothed K, for the Q-smoothing bias
    v: torch.Tensor       # (B, H, N, D) input dtype: dP = dO V^T stays 16-bit
    o: torch.Tensor       # (B, H, N, D) input dtype
    lse: torch.Tensor     # (B, H, N) natural-log log-sum-exp


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _causal_mask(n: int, device) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def smooth(q: torch.Tensor, k: torch.Tensor, cfg: SageConfig):
    """Returns (q_sm, k_sm, mu_q): K minus its sequence mean, Q minus its per-block mean."""
    k_sm = k - k.mean(dim=-2, keepdim=True) if cfg.smooth_k else k
    if not cfg.smooth_q:
        return q, k_sm, None
    b, h, n, d = q.shape
    qb = q.reshape(b, h, n // cfg.block_q, cfg.block_q, d)
    mu_q = qb.mean(dim=-2)
    return (qb - mu_q.unsqueeze(-2)).reshape(b, h, n, d), k_sm, mu_q


def scores(q_hat, s_q, k_hat, s_k, mu_q, k_sm, cfg: SageConfig, sm_scale: float) -> torch.Tensor:
    """S = (Q^ K^T) s_Q s_K / sqrt(d) [+ bias], masked with -inf when causal. Shape (B, H, N, N)."""
    s_int = q_hat @ k_hat.transpose(-1, -2)
    s = s_int * s_q.repeat_interleave(cfg.block_q, dim=-1).unsqueeze(-1)
    s = s * s_k.repeat_interleave(cfg.block_kv, dim=-1).unsqueeze(-2) * sm_scale
    if mu_q is not None:
        bias = mu_q @ k_sm.transpose(-1, -2)            # (B, H, N/Bq, N), one row per q block
        s = s + sm_scale * bias.repeat_interleave(cfg.block_q, dim=-2)
    if cfg.causal:
        s = s.masked_fill(~_causal_mask(s.shape[-1], s.device), float("-inf"))
    return s


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: SageConfig):
    """Algorithm 1. Returns (o in the input dtype, Saved)."""
    b, h, n, d = q.shape
    ct = compute_dtype(q.dtype)
    sm_scale = 1.0 / math.sqrt(d)
    q_sm, k_sm, mu_q = smooth(q.to(ct), k.to(ct), cfg)
    q_hat, s_q = quantize_row_blocks(q_sm, cfg.block_q, cfg.quantize)
    k_hat, s_k = quantize_row_blocks(k_sm, cfg.block_kv, cfg.quantize)
    v_hat, s_v = quantize_row_blocks(v.to(ct), cfg.block_kv, cfg.quantize)
    s = scores(q_hat, s_q, k_hat, s_k, mu_q, k_sm, cfg, sm_scale)

    tn, bk = n // cfg.block_kv, cfg.block_kv
    s_tiles = s.reshape(b, h, n, tn, bk)
    t = s_tiles.amax(dim=-1)                                   # tile row max, -inf if fully masked
    t_safe = torch.where(torch.isfinite(t), t, torch.zeros_like(t))
    e = torch.exp(s_tiles - t_safe.unsqueeze(-1))              # P~ up to the factor exp(t - m)
    if cfg.quantize:
        p_hat, p_scale = torch.round(QMAX * e), 1.0 / QMAX     # per-token: s_P = rowmax(P~)/127
    else:
        p_hat, p_scale = e, 1.0
    row_max = t.amax(dim=-1, keepdim=True)                     # finite: every row sees a key
    w = torch.exp(t - row_max)                                 # exp(t_j - m), 0 for masked tiles
    l = (w * e.sum(dim=-1)).sum(dim=-1)                        # softmax denominator from unquantised P~
    pv = torch.einsum("bhntk,bhtkd->bhntd", p_hat, v_hat.reshape(b, h, tn, bk, d))
    o = (pv * (w * p_scale).unsqueeze(-1) * s_v[:, :, None, :, None]).sum(dim=-2) / l.unsqueeze(-1)
    lse = row_max.squeeze(-1) + torch.log(l)
    o = o.to(q.dtype)
    return o, Saved(q_hat, s_q, k_hat, s_k, mu_q, k_sm if mu_q is not None else None, v, o, lse)


class Intermediates(NamedTuple):
    """Backward-pass tensors as the matmuls consume them (dequantised where quantised)."""
    delta: torch.Tensor   # rowsum(dO * O)
    p: torch.Tensor       # P entering dV = P^T dO (dequantised per tile)
    dp: torch.Tensor      # dO V^T (unquantised)
    ds: torch.Tensor      # dS entering dQ and dK (dequantised per tile)


def backward(saved: Saved, do: torch.Tensor, cfg: SageConfig, return_intermediates: bool = False):
    """Algorithm 2. Returns (dq, dk, dv) in the input dtype [, Intermediates]."""
    b, h, n, d = saved.v.shape
    ct = compute_dtype(saved.v.dtype)
    sm_scale = 1.0 / math.sqrt(d)
    tm, tn, bq, bk = n // cfg.block_q, n // cfg.block_kv, cfg.block_q, cfg.block_kv
    do_c = do.to(ct)
    delta = (do_c * saved.o.to(ct)).sum(dim=-1)
    s = scores(saved.q_hat, saved.s_q, saved.k_hat, saved.s_k, saved.mu_q, saved.k_sm, cfg, sm_scale)
    p = torch.exp(s - saved.lse.unsqueeze(-1))

    p_hat, s_p = quantize_tiles(p, bq, bk, cfg.quantize)       # (B,H,Tm,Bq,Tn,Bkv), (B,H,Tm,Tn)
    do_hat, s_do = quantize_row_blocks(do_c, bq, cfg.quantize)
    pt_do = torch.einsum("bhiqjk,bhiqd->bhijkd", p_hat, do_hat.reshape(b, h, tm, bq, d))
    dv = (pt_do * s_p[..., None, None] * s_do[:, :, :, None, None, None]).sum(dim=2).reshape(b, h, n, d)

    dp = do_c @ saved.v.to(ct).transpose(-1, -2)               # kept in 16-bit inputs, fp32 accumulate
    ds = p * (dp - delta.unsqueeze(-1))
    ds_hat, s_ds = quantize_tiles(ds, bq, bk, cfg.quantize)
    ds_k = torch.einsum("bhiqjk,bhjkd->bhijqd", ds_hat, saved.k_hat.reshape(b, h, tn, bk, d))
    dq = (ds_k * s_ds[..., None, None] * saved.s_k[:, :, None, :, None, None] * sm_scale).sum(dim=3)
    dq = dq.reshape(b, h, n, d)
    dst_q = torch.einsum("bhiqjk,bhiqd->bhijkd", ds_hat, saved.q_hat.reshape(b, h, tm, bq, d))
    dk = (dst_q * s_ds[..., None, None] * saved.s_q[:, :, :, None, None, None] * sm_scale).sum(dim=2)
    dk = dk.reshape(b, h, n, d)
    if saved.mu_q is not None:
        col_sums = ds.reshape(b, h, tm, bq, n).sum(dim=3)       # (B,H,Tm,N): dS_i^T 1 per q block
        dk = dk + sm_scale * torch.einsum("bhin,bhid->bhnd", col_sums, saved.mu_q)

    dtype = saved.v.dtype
    grads = dq.to(dtype), dk.to(dtype), dv.to(dtype)
    if not return_intermediates:
        return grads
    inter = Intermediates(delta, dequantize_tiles(p_hat, s_p), dp, dequantize_tiles(ds_hat, s_ds))
    return grads, inter


class SimulatedSageBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cfg: SageConfig):
        o, saved = forward(q, k, v, cfg)
        ctx.cfg = cfg
        ctx.save_for_backward(*[t if t is not None else torch.empty(0) for t in saved])
        ctx.has_mu = saved.mu_q is not None
        return o

    @staticmethod
    def backward(ctx, do):
        tensors = list(ctx.saved_tensors)
        if not ctx.has_mu:
            tensors[4] = tensors[5] = None
        dq, dk, dv = backward(Saved(*tensors), do.contiguous(), ctx.cfg)
        return dq, dk, dv, None


def dequantized_inputs(saved: Saved, cfg: SageConfig):
    """Q and K as the quantised matmuls see them (for debugging and the tracer)."""
    return (dequantize_row_blocks(saved.q_hat, saved.s_q, cfg.block_q),
            dequantize_row_blocks(saved.k_hat, saved.s_k, cfg.block_kv))
