"""Exact PyTorch simulation of SageBwd (the paper's Algorithms 1 and 2).

This is the CPU path and the reference the Triton kernels are tested against.
Every INT8 product is an integer matmul carried out exactly in floating point
(see :mod:`sagebwd.quant`), and every scale is applied per block exactly as a
kernel would, so the simulation and a kernel differ only by float rounding of
the scale/softmax arithmetic (exp vs exp2, summation order).

Quantisation granularity, by contract (``SageConfig.quant``; block_q = Bq rows of Q,
block_kv = Bkv rows of K/V; docs/sagebwd.md has the table):

"block", the paper's Algorithms 1-2:
  forward  Q per (Bq x D) block after optional Q-smoothing (Q_i - mean of block i); K per
           (Bkv x D) block after K-smoothing (K - mean over the sequence); V per (Bkv x D) block;
           P~ per token inside each kv tile: P^ = round(127 * exp(S - t)) with t the row max of
           the tile, i.e. the paper's s_P = rowmax(P~)/127, which does not depend on the running
           max of the online softmax.
  backward P, dS per (Bq x Bkv) tile; dO per (Bq x D) block; dP = dO V^T unquantised.
"token": every scale runs along the free (non-reduced) axis of the product that consumes it,
  so each one is a row maximum in the kernel that quantises it (no tile-wide reduction):
  forward  Q and K per token (after the same smoothing); V and P~ as in "block" but over tiles of
           max(Bkv, 128) keys (validate.key_tile): one INT8 product P^ V^ spans 128 keys.
  backward dV = P^T dO in FP8 e4m3: P with the static scale 1/256 (no maximum: P <= 1), dO per
           (Bq x D) block (amax / 448); the product summed in fp32 per q block (sagebwd.quant);
           dS = P (dO V^T - delta) from dO as given; dQ = dS K and dK = dS^T Q as 16-bit products: dS
           rounded to bf16 times K, and transposed times Q, both as given and rounded to bf16 (token_dq,
           token_dk). No scale to find (no maximum), and nothing after S's recomputation reads s_Q.

With Q-smoothing the bias sm_scale * mu_i K_sm^T is added to S in full
precision; in "block" dK gains the bias branch sm_scale * colsum(dS_i)^T mu_i computed
from the unquantised dS ("token" needs none: its dK takes Q itself, mu_i included).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .quant import (P_E4M3_SCALE, QMAX, dequantize_tiles, quantize_groups, quantize_row_blocks,
                    quantize_row_blocks_e4m3, quantize_tiles, round_to_e4m3)
from .validate import QUANT_CONTRACTS, key_tile


@dataclass(frozen=True)
class SageConfig:
    causal: bool = False
    smooth_k: bool = True
    smooth_q: bool = False
    block_q: int = 128
    block_kv: int = 64
    # "block": the paper's per-block scales; "token": per-token scales (module docstring).
    quant: str = "block"
    # False runs the same dataflow without rounding: the tests use it to check the formulas.
    quantize: bool = True

    def __post_init__(self):
        if self.quant not in QUANT_CONTRACTS:
            raise ValueError(f"quant={self.quant!r} is not one of {QUANT_CONTRACTS}")


class Saved(NamedTuple):
    """What the forward keeps for the backward (as a kernel would: quantised Q/K, V, O, LSE)."""
    q_hat: torch.Tensor   # (B, H, N, D) integers
    s_q: torch.Tensor     # (B, H, N / Bq) for "block", (B, H, N) for "token"
    k_hat: torch.Tensor   # (B, H, N, D) integers, from smoothed K
    s_k: torch.Tensor     # (B, H, N / Bkv) for "block", (B, H, N) for "token"
    mu_q: torch.Tensor | None   # (B, H, N / Bq, D) block means of Q when Q-smoothing
    k_sm: torch.Tensor | None   # (B, H, N, D) smoothed K, for the Q-smoothing bias
    v: torch.Tensor       # (B, H, N, D) input dtype: dP = dO V^T stays 16-bit
    o: torch.Tensor       # (B, H, N, D) input dtype
    lse: torch.Tensor     # (B, H, N) natural-log log-sum-exp
    dq_k: torch.Tensor | None = None   # "token": K as dQ's 16-bit product takes it, in bf16 (token_dq)
    dk_q: torch.Tensor | None = None   # "token": Q as dK's 16-bit product takes it, in bf16 (token_dk)


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


def quantize_qk(q_sm: torch.Tensor, k_sm: torch.Tensor, cfg: SageConfig):
    """(q_hat, s_q, k_hat, s_k) of the smoothed Q and K, at the contract's granularity."""
    if cfg.quant == "token":
        (q_hat, s_q), (k_hat, s_k) = (quantize_groups(t, t.shape[-1], -1, cfg.quantize) for t in (q_sm, k_sm))
        return q_hat, s_q.squeeze(-1), k_hat, s_k.squeeze(-1)
    return (*quantize_row_blocks(q_sm, cfg.block_q, cfg.quantize),
            *quantize_row_blocks(k_sm, cfg.block_kv, cfg.quantize))


def token_scales(s: torch.Tensor, block: int, cfg: SageConfig) -> torch.Tensor:
    """A Q or K scale as one value per token (B, H, N), whatever the contract."""
    return s if cfg.quant == "token" else s.repeat_interleave(block, dim=-1)


def scores(q_hat, s_q, k_hat, s_k, mu_q, k_sm, cfg: SageConfig, sm_scale: float) -> torch.Tensor:
    """S = (Q^ K^T) s_Q s_K / sqrt(d) [+ bias], masked with -inf when causal. Shape (B, H, N, N)."""
    s_int = q_hat @ k_hat.transpose(-1, -2)
    s = s_int * token_scales(s_q, cfg.block_q, cfg).unsqueeze(-1)
    s = s * token_scales(s_k, cfg.block_kv, cfg).unsqueeze(-2) * sm_scale
    if mu_q is not None:
        bias = mu_q @ k_sm.transpose(-1, -2)            # (B, H, N/Bq, N), one row per q block
        s = s + sm_scale * bias.repeat_interleave(cfg.block_q, dim=-2)
    if cfg.causal:
        s = s.masked_fill(~_causal_mask(s.shape[-1], s.device), float("-inf"))
    return s


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: SageConfig):
    """Algorithm 1. Returns (o in the input dtype, Saved)."""
    ct = compute_dtype(q.dtype)
    q_sm, k_sm, mu_q = smooth(q.to(ct), k.to(ct), cfg)
    o, saved = forward_quantized(*quantize_qk(q_sm, k_sm, cfg), mu_q, k_sm, v, cfg, q.dtype)
    return o, with_dk_q(with_dq_k(saved, k, cfg), q, cfg)


def with_dq_k(saved: Saved, k: torch.Tensor, cfg: SageConfig) -> Saved:
    """saved with the token contract's dQ operand, K rounded to bf16 (token_dq; K as given in the compute dtype
    when cfg.quantize is off); the block contract keeps none."""
    if cfg.quant != "token":
        return saved
    return saved._replace(dq_k=k.detach().to(torch.bfloat16 if cfg.quantize else compute_dtype(k.dtype)))


def with_dk_q(saved: Saved, q: torch.Tensor, cfg: SageConfig) -> Saved:
    """saved with the token contract's dK operand, Q as given rounded to bf16 (token_dk; Q as given in the compute
    dtype when cfg.quantize is off): not the smoothed Q, so that dS^T Q holds Q-smoothing's bias branch; the block
    contract keeps none."""
    if cfg.quant != "token":
        return saved
    return saved._replace(dk_q=q.detach().to(torch.bfloat16 if cfg.quantize else compute_dtype(q.dtype)))


def forward_quantized(q_hat, s_q, k_hat, s_k, mu_q, k_sm, v: torch.Tensor, cfg: SageConfig, out_dtype: torch.dtype):
    """Algorithm 1 from the quantised Q and K on (scales as ``quantize_qk`` returns them):
    ``forward`` after its smoothing and Q/K quantisation. ``tools/quant_study.py`` enters here with
    other Q/K granularities (expanded to one scale per token, ``cfg.quant == "token"``)."""
    b, h, n, d = v.shape
    ct = compute_dtype(out_dtype)
    sm_scale = 1.0 / math.sqrt(d)
    bk = key_tile(cfg.quant, cfg.block_kv)   # keys per tile of P~ and V^
    v_hat, s_v = quantize_row_blocks(v.to(ct), bk, cfg.quantize)
    s = scores(q_hat, s_q, k_hat, s_k, mu_q, k_sm, cfg, sm_scale)

    tn = n // bk
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
    o = o.to(out_dtype)
    return o, Saved(q_hat, s_q, k_hat, s_k, mu_q, k_sm if mu_q is not None else None, v, o, lse)


class Intermediates(NamedTuple):
    """Backward-pass tensors as the matmuls consume them (dequantised where quantised)."""
    delta: torch.Tensor   # rowsum(dO * O)
    p: torch.Tensor       # P entering dV = P^T dO (dequantised per tile)
    dp: torch.Tensor      # dO V^T (unquantised)
    ds: torch.Tensor      # dS entering dQ and dK (dequantised per tile)


def backward(saved: Saved, do: torch.Tensor, cfg: SageConfig, return_intermediates: bool = False,
             dp: torch.Tensor | None = None):
    """Algorithm 2. Returns (dq, dk, dv) in the input dtype [, Intermediates]. dp: dO V^T as given (tools.quant_study's
    quantised dP variants) instead of computed."""
    b, h, n, d = saved.v.shape
    ct = compute_dtype(saved.v.dtype)
    sm_scale = 1.0 / math.sqrt(d)
    tm, bq = n // cfg.block_q, cfg.block_q
    do_c = do.to(ct)
    delta = (do_c * saved.o.to(ct)).sum(dim=-1)
    s = scores(saved.q_hat, saved.s_q, saved.k_hat, saved.s_k, saved.mu_q, saved.k_sm, cfg, sm_scale)
    p = torch.exp(s - saved.lse.unsqueeze(-1))

    if dp is None:
        dp = do_c @ saved.v.to(ct).transpose(-1, -2)           # kept in 16-bit inputs, fp32 accumulate
    ds = p * (dp - delta.unsqueeze(-1))
    if cfg.quant == "token":
        do_hat, s_do = quantize_row_blocks_e4m3(do_c, bq, cfg.quantize)
        dv, dq, dk, p_seen, ds_seen = _token_products(p, ds, do_hat, s_do, saved, cfg, sm_scale)
    else:
        do_hat, s_do = quantize_row_blocks(do_c, bq, cfg.quantize)
        dv, dq, dk, p_seen, ds_seen = _block_products(p, ds, do_hat, s_do, saved, cfg, sm_scale)
        if saved.mu_q is not None:   # the token contract's dK takes Q itself, mu_q included
            col_sums = ds.reshape(b, h, tm, bq, n).sum(dim=3)       # (B,H,Tm,N): dS_i^T 1 per q block
            dk = dk + sm_scale * torch.einsum("bhin,bhid->bhnd", col_sums, saved.mu_q)

    dtype = saved.v.dtype
    grads = dq.to(dtype), dk.to(dtype), dv.to(dtype)
    if not return_intermediates:
        return grads
    return grads, Intermediates(delta, p_seen(), dp, ds_seen())


def _block_products(p, ds, do_hat, s_do, saved: Saved, cfg: SageConfig, sm_scale: float):
    """dV, dQ, dK with P and dS per (Bq x Bkv) tile; and the dequantised P and
    dS (as callables: only the tracer wants them)."""
    b, h, n, d = saved.v.shape
    tm, tn, bq, bk = n // cfg.block_q, n // cfg.block_kv, cfg.block_q, cfg.block_kv
    p_hat, s_p = quantize_tiles(p, bq, bk, cfg.quantize)       # (B,H,Tm,Bq,Tn,Bkv), (B,H,Tm,Tn)
    pt_do = torch.einsum("bhiqjk,bhiqd->bhijkd", p_hat, do_hat.reshape(b, h, tm, bq, d))
    dv = (pt_do * s_p[..., None, None] * s_do[:, :, :, None, None, None]).sum(dim=2).reshape(b, h, n, d)
    ds_hat, s_ds = quantize_tiles(ds, bq, bk, cfg.quantize)
    ds_k = torch.einsum("bhiqjk,bhjkd->bhijqd", ds_hat, saved.k_hat.reshape(b, h, tn, bk, d))
    dq = (ds_k * s_ds[..., None, None] * saved.s_k[:, :, None, :, None, None] * sm_scale).sum(dim=3)
    dq = dq.reshape(b, h, n, d)
    dst_q = torch.einsum("bhiqjk,bhiqd->bhijkd", ds_hat, saved.q_hat.reshape(b, h, tm, bq, d))
    dk = (dst_q * s_ds[..., None, None] * saved.s_q[:, :, :, None, None, None] * sm_scale).sum(dim=2)
    dk = dk.reshape(b, h, n, d)
    return dv, dq, dk, lambda: dequantize_tiles(p_hat, s_p), lambda: dequantize_tiles(ds_hat, s_ds)


def _bf16(x: torch.Tensor, quantize: bool) -> torch.Tensor:
    """x rounded to bf16 and back (its compute dtype kept); x itself when quantize is off (the formulas alone)."""
    return x.to(torch.bfloat16).to(x.dtype) if quantize else x


def token_dq(ds, saved: Saved, sm_scale: float, quantize: bool = True):
    """The token contract's dQ = sm_scale bf16(dS) K16 with K16 K as given rounded to bf16 (saved.dq_k): a 16-bit
    product, so no scale or maximum (tools.quant_study variant y16: dQ's error at sigma 1 -44% against an INT8 dS
    s_K per 128-key tile; K-smoothing's mean drops out, as dS's rows sum to zero). Summed in the compute dtype (the
    kernels: fp32). Returns dQ and, as a callable, dS as dQ sees it (bf16(dS))."""
    if saved.dq_k is None:
        raise ValueError("the token contract's dQ needs K in bf16: Saved.dq_k (simulate.with_dq_k) is None")
    ds16 = _bf16(ds, quantize)
    return (ds16 @ saved.dq_k.to(ds.dtype)) * sm_scale, lambda: ds16


def _token_products(p, ds, do_hat, s_do, saved: Saved, cfg: SageConfig, sm_scale: float):
    """dV, dQ, dK with every scale along the free axis of its product:
    dV in FP8 (P e4m3 with the static scale 1/256, dO^ e4m3 per block); dQ and dK from dS in bf16 with K and Q in
    bf16 (token_dq, token_dk). Returns the dequantised P and dS (as dQ and dK see it) as callables."""
    b, h, n, d = saved.v.shape
    tm, bq = n // cfg.block_q, cfg.block_q

    def by_q_block(t):   # (B,H,N,M) -> (B,H,Tm,Bq,M)
        return t.reshape(b, h, tm, bq, -1)

    p_hat = round_to_e4m3(p * P_E4M3_SCALE) if cfg.quantize else p * P_E4M3_SCALE   # 256 P, in e4m3
    pt_do = torch.einsum("bhiqn,bhiqd->bhind", by_q_block(p_hat), by_q_block(do_hat))
    dv = (pt_do * (s_do * (1.0 / P_E4M3_SCALE))[:, :, :, None, None]).sum(dim=2)
    dq, ds_seen = token_dq(ds, saved, sm_scale, cfg.quantize)
    dk = token_dk(ds, saved, cfg, sm_scale)
    return dv, dq, dk, lambda: p_hat * (1.0 / P_E4M3_SCALE), ds_seen


def token_dk(ds, saved: Saved, cfg: SageConfig, sm_scale: float):
    """The token contract's dK = sm_scale bf16(dS)^T Q16 with dS (B,H,N,N) in q rows and Q16 Q as given rounded to
    bf16 (saved.dk_q, with_dk_q): a 16-bit product needs no scale or maximum (the INT8 dS s_Q per (kv token, q block)
    times Q^ it replaced: dK's error at sigma 1 about halves, tools.quant_study variants dk16, ds16), and with Q
    itself, Q-smoothing's mean included, no bias branch. Summed in the compute dtype (the kernels: fp32, per q
    block)."""
    if saved.dk_q is None:
        raise ValueError("the token contract's dK needs Q in bf16: Saved.dk_q (simulate.with_dk_q) is None")
    return (_bf16(ds, cfg.quantize).transpose(-1, -2) @ saved.dk_q.to(ds.dtype)) * sm_scale


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
        if ctx.cfg.quant != "token":
            tensors[9] = tensors[10] = None   # dq_k, dk_q
        dq, dk, dv = backward(Saved(*tensors), do.contiguous(), ctx.cfg)
        return dq, dk, dv, None


def dequantized_inputs(saved: Saved, cfg: SageConfig):
    """Q and K as the quantised matmuls see them (for debugging and the tracer)."""
    return (saved.q_hat * token_scales(saved.s_q, cfg.block_q, cfg).unsqueeze(-1),
            saved.k_hat * token_scales(saved.s_k, cfg.block_kv, cfg).unsqueeze(-1))
