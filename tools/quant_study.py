"""Accuracy study for kernel-notes plan item 4: FP8 products, per-fragment Q/K scales and a quantised
softmax denominator in the "token" contract, by fake quantisation on the CPU.

    python -m tools.quant_study [--seq 1024] [--head-dim 64] [--causal] [--sigmas 1 3 5 8] [--seeds 1]
                                [--variants a b c d e f] [--json PATH]

Each variant is the token contract (``sagebwd.simulate``, ``quant="token"``) with ONE quantisation
point changed; everything else is the simulation's own code path, so variant (a) is exactly what
``python -m sagebwd.trace sigma --quant token`` measures (tests/test_quant_study.py checks it), and
the reference is the tracer's: ``sagebwd.fpa.fpa_attention`` on the same fp32 inputs
(``sagebwd.trace.gaussian_inputs``: Q, K with std sigma, V and dO std 1; batch 1, 2 heads).

  a  the token contract as today (baseline). Since 2026-11-27 its dV = P^T dO is FP8 e4m3, what b
     studied, with P's static scale 256 (a power of two) instead of 448 and the product summed in
     fp32 per q block (sagebwd.simulate); b, c, bP and bdO are kept as the study that led there.
  i8 dV = P^T dO in INT8 as the contract had it until then: P with one scale per (kv token, q
     block), its row maximum; dO per (block_q x D) block (amax / 127).
  b  dV = P^T dO in FP8 e4m3: P = exp(S - LSE) with the static scale 448 (P <= 1, no maximum),
     dO with an amax scale per (block_q x D) block, the token contract's dO granularity.
  c  as b, but dO with an amax scale per token (1 x D). The scale runs along dV's reduction
     axis, so a kernel could not apply it after the product; the fake quantisation applies it
     exactly (an upper bound on what a kernel gets).
  Diagnostics, not in the default list (``--variants bP bdO``): the two halves of b's dV error,
  bP  P in FP8 as in b, dO unquantised;  bdO  dO in FP8 as in b, P unquantised.
  d  the forward's P~ V in FP8 e4m3 (SageAttention2's forward): P~ = exp(S - m) with m the online
     softmax's running maximum when tile j is reached (kv tiles in ascending order), static scale
     448; V with an amax scale per channel over the whole sequence. Replaces INT8 P~ per token and
     V per (block_kv x D) block. The saved O (and so delta in the backward) is this O.
  e  Q and K scales per thread fragment as SageAttention2 quantises for its Hopper kernel
     (``per_thread_int8(..., BLKQ=64, WARPQ=16, BLKK=128, WARPK=128)``): Q, one scale per pair of
     tokens {r, r+8} of each 16-row warp slab (the rows a thread holds in the wgmma accumulator);
     K, one scale per 32 tokens of each 128-token block, token j in group (j mod 8) // 2 (the
     columns a thread holds). INT8 as in the contract; S's scale is one value per thread.
  f  Q and K per fragment of this project's tiles, the grouping that is one scale per thread in
     every kernel (Q on the M side in the forward and dQ, on the N side in dK/dV; K the other way):
     4 interleaved groups per tile, token i in group (i mod 8) // 2, Q within its block_q (128)
     tile (32 tokens a scale), K within its block_kv (64) tile (16 tokens a scale).

  g  the forward's softmax denominator l summed from the quantised P^ / 127 (what a kernel gets free
     from the tensor cores with a column of ones beside V^) instead of the float P~; O and the LSE
     (and so the backward's P) change with it. Not in the default list (``--variants a g``).

  p128  the forward's P~ per (q token, 128-key tile): t = the row max over 128 keys (masked keys
     excluded), P^ = round(127 exp(S - t)), V per (128 x D) block (amax / 127), w = exp(t - m) per
     128-key tile: one INT8 product P^ V^ spans 128 keys. l from the float P~ as in the contract. The
     contract's forward since 2026-11-27 (validate.key_tile), so a and p128 are now the same
     (tests check it); studied when a's tiles were block_kv keys (docs/kernel-notes.md). O and the LSE
     (which moves by float rounding only) feed the backward, which keeps block_kv.
  vc  P~ per block_kv tile (the contract's forward before 2026-11-27); V INT8 per channel over the
     whole sequence (amax of column d over all N tokens / 127), its scale applied to O's column d
     after the product (as SageAttention2 does), so V's scale no longer bounds the tile a product
     may span.
  p128vc  both: P~ per 128-key tile and V per channel.
  r8  as p128vc with P~ = exp(S - m_j) against the row's running maximum once 128-key tile j is reached
     (the largest tile max of tiles 0..j, as an online softmax keeps it) instead of tile j's own maximum:
     P^ = round(127 P~) needs no maximum beyond the online softmax's, and the INT8 products P^ V^ of the
     tiles between two rises of m add in int32 with no weighting (V's scale is per channel). l from the
     float P~. (A timing probe of that accumulation: docs/kernel-notes.md, "Twenty-third session".)
  r8i  as r8 with the reference raised in whole log2 steps: m_j = ceil(log2(e) x the running max at tile j) (log2
     units, as the kernels keep S), P^ = round(127 exp2(S log2(e) - m_j)) <= 127, and the sum of P^ V^ kept in
     integers across all tiles: when a row's reference rises by r steps, its sum is shifted right by r bits (an
     arithmetic shift, rounding down) before the tile's product is added, so a kernel needs no float weighting of O
     per tile and no flush, only a shift of its int32 accumulator by a per-row amount that is 0 on most tiles. l from
     the float P~ (scaled by 2^-r at a rise). Modelled exactly in int64.
  Not in the default list (``--variants a p128 vc p128vc r8 r8i``).

  x128  dQ = X^ K^ with X = dS s_K INT8 per (q token, 128-key tile, validate.key_tile): the token contract's dQ
     from 2026-11-27 (ninth session) until 2026-11-28 (sixteenth session), when dQ became a bf16 product of Y
     (simulate.token_dq, variant y16's measurement). Not in the default list (``--variants a x128``).
  x64  as x128 with X per (q token, block_kv tile): the token contract's dQ until 2026-11-27 (ninth session), when X
     took the forward's key tile so that the dQ kernels sum one INT8 product over 128 keys. Not in the default
     list (``--variants x128 x64``).

  Diagnostic (``--variants fK``): f's K grouping with Q per token, as the contract has it (Q sits
  on the M side in the forward and the dQ kernel, where its per-token scale costs no outer product).

  dpi8  the backward's dP = dO V^T (unquantised in the contract) in INT8: dO per q token and V per kv
     token (amax over the D channels / 127, sagebwd.quant's rounding). Both scales run along dP's free
     axes, so they leave the sum over D: dP = s_dO[i] s_V[j] (dO^ V^T)[i, j], the integer product exact,
     the scales applied in fp64. dS = P (dP - delta), delta = rowsum(dO * O) in float as the contract
     has it, then both of the contract's dS quantisations (X for dQ, Y for dK) from the same dP, as a
     dQ kernel and a dK kernel would each compute it. O and dV do not see dP.
  dpf8  as dpi8 with dO and V in FP8 e4m3 per token (amax / 448), the products summed in fp64.
  dpi8b  as dpi8 with dO INT8 per (block_q x D) block (amax / 127: the granularity of the contract's
     FP8 dO for dV and of the "block" contract's INT8 dO), V per kv token.
  Not in the default list (``--variants a dpi8 dpf8 dpi8b``).

  dqfix  the contract's dQ (bf16(dS) K16, simulate.token_dq) summed over 128-key partials (one per program of a
     fused d=64 backward, which adds its partial into dQ) in int32 fixed point, deterministic in any order: each
     partial rounded to the quantum u_i = 2^ceil(log2(bound_i / 2^30)) of its q row, bound_i = 2 sm_scale
     ||dO_i|| max_k ||V_k|| max|K16| >= the row's sum of |partials| (|dS_ik| <= P_ik (|dP_ik| + |delta_i|), both
     <= ||dO_i|| ||V_k||, P sums to 1; bf16's rounding of Y is far inside the factor 2), the rounded terms summed
     exactly. Everything else is variant a. ``fixed_point_dq`` reports how loose the bound is (bits of precision
     left) and that no sum leaves int32. Until 2026-11-28 the partials were x128's (INT8 X^ K^). Not in the
     default list.

  dos  the dK/dV kernel's Y^T = dS^T s_Q with s_Q moved into its dP^T product, so that the kernel reads no
     s_Q or delta s_Q per column (docs/kernel-notes.md, "Fourteenth session": those reads cost the d=64 dK/dV
     ~13%): dP^T s_Q - delta s_Q = V [dO s_Q | -delta s_Q]^T, dO s_Q rounded to bf16 (the preprocess would
     write it) and -delta s_Q as two bf16 terms (hi + lo) beside it, the product summed in fp32;
     then Y = P (that), and Y / s_Q in dS's place in the contract's dK. dQ's dS and everything else is
     variant a. Not in the default list.

  y16  dQ's product in bf16, as a fused d=64 backward would make it from the Y^T it already holds in fp32 for
     dK (no X^, so no maximum over the kv rows a program spreads across its warps): dQ = sm_scale
     bf16(dS) K, dS = P (dP - delta) with the contract's P (from the INT8 S), K the input rounded to bf16 (what
     the kernel would load; dS's rows sum to ~0, so K-smoothing's mean drops out up to that), summed in fp64.
     Rounding Y = 256 dS s_Q to bf16 is dS's rounding (a power of two and a per-row scale). y16s: K - mean in
     K's place. Everything else is variant a. Not in the default list (``--variants a y16 y16s``).

  dk16  dK's product in bf16: dK = sm_scale bf16(dS)^T Q16, Q the input rounded to bf16; dk16q: bf16(dS s_Q)^T Q^
     with the integer Q^. From 2026-11-28 (nineteenth session) the contract's dK was dk16's with Q~ = Q / s_Q in bf16
     in Q16's place and Y = dS s_Q in dS's; since the twentieth session it is dk16's (simulate.token_dk); y8: the
     INT8 Y^ per (kv token, q block) times Q^ that came before. Everything else is variant a. Not in the default
     list (``--variants a y8 dk16 dk16q``).
  ds16  y16's dQ and dk16's dK together: both products from dS itself, dP = dO V^T from dO as given (no dO s_Q c
     rounded to dO's dtype, no power of two c for fp16): the token contract since 2026-11-28 (twentieth session),
     so a and ds16 differ only in their sums' order (fp32 in a, fp64 here). Not in the default list.

Variants e and f keep the backward's token-contract formulas (X = dS s_K, Y = dS s_Q) with the
group scale of each token. Fake quantisation: FP8 values are rounded to e4m3 (round to nearest even,
subnormals kept, clamped to +-448) and the products of dequantised values are summed in fp64; the
FP8 wgmma's reduced-precision accumulator is not modelled. INT8 points are the simulation's, exact.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import torch

from sagebwd.fpa import fpa_attention
from sagebwd.quant import (E4M3_MAX, QMAX, dequantize_groups, quantize_groups, quantize_row_blocks,
                           quantize_row_blocks_e4m3, round_to_e4m3)
from sagebwd.simulate import (SageConfig, backward, compute_dtype, forward, forward_quantized,
                              scores, smooth, token_dk, with_dk_q, with_dq_k)
from sagebwd.trace import error_stats, gaussian_inputs
from sagebwd.validate import SUPPORTED_HEAD_DIMS, key_tile

VARIANTS = {
    "a": "token contract (baseline; dV in FP8 since 2026-11-27, dQ and dK bf16 products of Y since 2026-11-28)",
    "i8": "dV: P INT8 per (kv token, q block), dO INT8 per block (the contract until 2026-11-27)",
    "b": "dV: P FP8 static 448, dO FP8 per block",
    "c": "dV: P FP8 static 448, dO FP8 per token",
    "bP": "diagnostic: b's FP8 P only (dO exact)",
    "bdO": "diagnostic: b's FP8 dO only (P exact)",
    "d": "fwd P~V: P~ FP8 static 448, V FP8 per channel",
    "e": "Q/K per fragment, SageAttention2 sm90 (Q 2 tok, K 32 of 128)",
    "f": "Q/K per fragment of our tiles (Q 32 of 128, K 16 of 64)",
    "fK": "diagnostic: f's K (16 of 64), Q per token",
    "g": "fwd denominator l from the quantised P^ (a ones column beside V^)",
    "kc": "dQ: X = dS per (q token, kv tile) without s_K, K^ per channel over the sequence",
    "x128": "dQ: X = dS s_K INT8 per (q token, 128-key tile) times K^, the contract until 2026-11-28",
    "x64": "dQ: X = dS s_K per (q token, block_kv tile), the contract until 2026-11-27 (x128: per 128-key tile)",
    "p128": "fwd P~V: P~ per (q token, 128-key tile), V per (128 x D) block",
    "vc": "fwd P~V: P~ per (q token, kv tile), V INT8 per channel over the sequence",
    "p128vc": "fwd P~V: P~ per (q token, 128-key tile), V INT8 per channel over the sequence",
    "r8": "fwd P~V: P^ INT8 against the running max at each 128-key tile (no tile max), V INT8 per channel "
          "over the sequence (P^ V^ summable in int32 across tiles)",
    "r8i": "fwd P~V: as r8 with the reference in whole log2 steps: the int32 sum shifted right when it rises",
    "r8o": "fwd P~V: as r8i with P^ = round(254 P~), as P^ - 127 in INT8 and 127 times V^'s tile column sums",
    "dpi8": "bwd dP = dO V^T in INT8: dO per q token, V per kv token",
    "dpf8": "bwd dP = dO V^T in FP8 e4m3: dO per q token, V per kv token (amax / 448)",
    "dpi8b": "bwd dP = dO V^T in INT8: dO per (block_q x D) block, V per kv token",
    "dqfix": "bwd dQ summed over 128-key partials in int32 fixed point, a power-of-two quantum per q row from a bound",
    "dos": "bwd dK's Y^T from V [dO s_Q | -delta s_Q]^T: dO s_Q in bf16, delta s_Q as hi + lo (no column reads)",
    "y16": "bwd dQ = dS K in bf16 (a fused backward's product): dS unquantised, rounded to bf16, K as given in bf16",
    "y16s": "as y16 with K-smoothing's K - mean rounded to bf16 in K's place",
    "y8": "bwd dK = Y^T Q^ with Y = dS s_Q INT8 per (kv token, q block), the contract until 2026-11-28 (dk16 now)",
    "dk16": "bwd dK = dS^T Q in bf16: dS unquantised, rounded to bf16, Q as given in bf16 (no s_Q, no Q^)",
    "dk16q": "bwd dK = Y^T Q^ in bf16: Y = dS s_Q rounded to bf16, Q^ the integers (exact in bf16)",
    "ds16": "bwd dQ = dS K and dK = dS^T Q in bf16 from dS itself (dP from dO, no s_Q, no c): y16 and dk16 together",
}
DP_VARIANTS = ("dpi8", "dpf8", "dpi8b")
WIDE_TILE = 128   # keys one INT8 product P^ V^ spans in p128 / p128vc
LOG2E = math.log2(math.e)   # r8i keeps S in log2 units, as the kernels do
# (P~ tile, None for block_kv; V per channel over the sequence instead of per tile block; P~ against the running
# max instead of the tile's)
WIDE_VARIANTS = {"p128": (WIDE_TILE, False, False), "vc": (None, True, False), "p128vc": (WIDE_TILE, True, False),
                 "r8": (WIDE_TILE, True, True)}
DEFAULT_VARIANTS = ["a", "i8", "b", "c", "d", "e", "f"]
COLUMNS = ("o", "dq", "dk", "dv", "ds")
LABELS = {"o": "O", "dq": "dQ", "dk": "dK", "dv": "dV", "ds": "dS"}
def fp8_fake_quant(x: torch.Tensor, reduce_dims: tuple[int, ...]) -> torch.Tensor:
    """Dequantised FP8 of x with an amax scale (amax / 448) per group over reduce_dims."""
    amax = x.abs().amax(dim=reduce_dims, keepdim=True)
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    return round_to_e4m3(x * (E4M3_MAX / safe)) * (safe / E4M3_MAX)


def quantize_interleaved(x: torch.Tensor, block: int, period: int = 8, run: int = 2):
    """INT8 of x (B, H, N, D) with one scale per thread-fragment group: within each block of
    ``block`` tokens, token i belongs to group (i mod period) // run. Returns q (x's shape) and the
    scale of each token's group, (B, H, N): the form the token contract's formulas consume."""
    b, h, n, d = x.shape
    a, g = block // period, period // run
    xs = x.reshape(b, h, n // block, a, g, run, d).permute(0, 1, 2, 4, 3, 5, 6)   # groups contiguous
    q, s = quantize_groups(xs.reshape(b, h, -1, a * run * d), a * run * d, -1)
    q = q.reshape(b, h, n // block, g, a, run, d).permute(0, 1, 2, 4, 3, 5, 6).reshape(b, h, n, d)
    s = s.reshape(b, h, n // block, g, 1, 1).expand(-1, -1, -1, -1, a, run)
    return q, s.permute(0, 1, 2, 4, 3, 5).reshape(b, h, n)


def _backward_p(saved, cfg: SageConfig) -> torch.Tensor:
    """P = exp(S - LSE) exactly as the simulation's backward forms it."""
    sm_scale = 1.0 / math.sqrt(saved.v.shape[-1])
    s = scores(saved.q_hat, saved.s_q, saved.k_hat, saved.s_k, saved.mu_q, saved.k_sm, cfg, sm_scale)
    return torch.exp(s - saved.lse.unsqueeze(-1))


def _backward_ds(saved, inter, cfg: SageConfig) -> torch.Tensor:
    """dS = P (dP - delta), unquantised, from the simulation's backward P and intermediates."""
    return _backward_p(saved, cfg) * (inter.dp - inter.delta.unsqueeze(-1))


def _fp8_dv(saved, do: torch.Tensor, cfg: SageConfig, do_per_token: bool = False, fp8_p: bool = True,
            fp8_do: bool = True) -> torch.Tensor:
    b, h, n, d = saved.v.shape
    p8 = _backward_p(saved, cfg).double()
    if fp8_p:
        p8 = round_to_e4m3(p8 * E4M3_MAX) / E4M3_MAX                      # static scale: no maximum
    do8 = do.double()
    if fp8_do:
        do_blocks = do8.reshape(b, h, n // cfg.block_q, cfg.block_q, d)
        do8 = fp8_fake_quant(do_blocks, (-1,) if do_per_token else (-2, -1)).reshape(b, h, n, d)
    return (p8.transpose(-1, -2) @ do8).to(saved.v.dtype)


def _int8_dv(saved, do: torch.Tensor, cfg: SageConfig) -> torch.Tensor:
    """dV as the token contract computed it until 2026-11-27: INT8 P per (kv token, q block) and INT8
    dO per block, exact integer products scaled per q block."""
    b, h, n, d = saved.v.shape
    tm, bq = n // cfg.block_q, cfg.block_q
    ct = compute_dtype(saved.v.dtype)
    p_hat, s_p = quantize_groups(_backward_p(saved, cfg), bq, -2, cfg.quantize)   # s_p (B,H,Tm,N)
    do_hat, s_do = quantize_row_blocks(do.to(ct), bq, cfg.quantize)
    pt_do = torch.einsum("bhiqn,bhiqd->bhind", p_hat.reshape(b, h, tm, bq, n), do_hat.reshape(b, h, tm, bq, d))
    return (pt_do * s_p[..., None] * s_do[:, :, :, None, None]).sum(dim=2).to(saved.v.dtype)


def _fp8_pv_output(saved, cfg: SageConfig) -> torch.Tensor:
    """O with P~ V in FP8: P~ relative to the running max, static scale; V per channel."""
    b, h, n, d = saved.v.shape
    tn, bk = n // cfg.block_kv, cfg.block_kv
    sm_scale = 1.0 / math.sqrt(d)
    s = scores(saved.q_hat, saved.s_q, saved.k_hat, saved.s_k, saved.mu_q, saved.k_sm, cfg, sm_scale).double()
    s_tiles = s.reshape(b, h, n, tn, bk)
    m_run = s_tiles.amax(dim=-1).cummax(dim=-1).values      # finite: kv tile 0 is never fully masked
    p8 = round_to_e4m3(torch.exp(s_tiles - m_run.unsqueeze(-1)) * E4M3_MAX) / E4M3_MAX
    v8 = fp8_fake_quant(saved.v.double(), (-2,))             # per channel over the whole sequence
    w = torch.exp(m_run - saved.lse.double().unsqueeze(-1))  # exp(m_j - m) / l, l from unquantised P~
    o = torch.einsum("bhntk,bhtkd->bhnd", p8 * w.unsqueeze(-1), v8.reshape(b, h, tn, bk, d))
    return o.to(saved.v.dtype)


def _quantized_sum_output(saved, cfg: SageConfig):
    """(O, LSE) with the softmax denominator summed from the quantised P^ / 127 instead of the float
    P~ (what a kernel gets from the tensor cores with a column of ones beside V^, for free); the
    numerator as the contract's forward computes it (simulate.forward_quantized)."""
    b, h, n, d = saved.v.shape
    bk = key_tile(cfg.quant, cfg.block_kv)   # the contract's forward tile
    tn = n // bk
    ct = compute_dtype(saved.v.dtype)
    v_hat, s_v = quantize_row_blocks(saved.v.to(ct), bk, cfg.quantize)
    s = scores(saved.q_hat, saved.s_q, saved.k_hat, saved.s_k, saved.mu_q, saved.k_sm, cfg, 1.0 / math.sqrt(d))
    s_tiles = s.reshape(b, h, n, tn, bk)
    t = s_tiles.amax(dim=-1)
    t_safe = torch.where(torch.isfinite(t), t, torch.zeros_like(t))
    p_hat = torch.round(QMAX * torch.exp(s_tiles - t_safe.unsqueeze(-1)))
    row_max = t.amax(dim=-1, keepdim=True)
    w = torch.exp(t - row_max)
    l = (w * p_hat.sum(dim=-1) / QMAX).sum(dim=-1)
    pv = torch.einsum("bhntk,bhtkd->bhntd", p_hat, v_hat.reshape(b, h, tn, bk, d))
    o = (pv * (w / QMAX).unsqueeze(-1) * s_v[:, :, None, :, None]).sum(dim=-2) / l.unsqueeze(-1)
    return o.to(saved.v.dtype), row_max.squeeze(-1) + torch.log(l)


def _tiled_pv_output(saved, cfg: SageConfig, tile: int, v_per_channel: bool, running_max: bool = False):
    """(O, LSE) of the contract's forward (simulate.forward_quantized, op for op) with P~ quantised per
    (q token, ``tile``-key tile) and V either per (tile x D) block or INT8 per channel over the whole
    sequence, that channel's scale applied to O's column after the product (it is constant along the
    reduction, so it leaves the sum). tile = block_kv with V per block is variant a's forward.
    running_max: P~ = exp(S - m_j) with m_j the row's running max once tile j is reached (the maximum of
    tiles 0..j) instead of tile j's own maximum: with V per channel, the products P^ V^ of tiles whose m_j
    is the same add in int32 with no weighting between them (variant r8)."""
    b, h, n, d = saved.v.shape
    ct = compute_dtype(saved.v.dtype)
    sm_scale = 1.0 / math.sqrt(d)
    if v_per_channel:
        v_hat, c_v = quantize_groups(saved.v.to(ct), n, -2, cfg.quantize)        # c_v (B,H,1,D)
    else:
        v_hat, s_v = quantize_row_blocks(saved.v.to(ct), tile, cfg.quantize)
    s = scores(saved.q_hat, saved.s_q, saved.k_hat, saved.s_k, saved.mu_q, saved.k_sm, cfg, sm_scale)
    tn = n // tile
    s_tiles = s.reshape(b, h, n, tn, tile)
    t = s_tiles.amax(dim=-1)                        # max over the tile's unmasked keys, -inf if none
    if running_max:   # finite from tile 0 on: no row has every key of the first tile masked
        t = t.cummax(dim=-1).values
    t_safe = torch.where(torch.isfinite(t), t, torch.zeros_like(t))
    e = torch.exp(s_tiles - t_safe.unsqueeze(-1))
    if cfg.quantize:
        p_hat, p_scale = torch.round(QMAX * e), 1.0 / QMAX
    else:
        p_hat, p_scale = e, 1.0
    row_max = t.amax(dim=-1, keepdim=True)
    w = torch.exp(t - row_max)
    l = (w * e.sum(dim=-1)).sum(dim=-1)
    pv = torch.einsum("bhntk,bhtkd->bhntd", p_hat, v_hat.reshape(b, h, tn, tile, d))
    if v_per_channel:
        o = (pv * (w * p_scale).unsqueeze(-1)).sum(dim=-2) * c_v / l.unsqueeze(-1)
    else:
        o = (pv * (w * p_scale).unsqueeze(-1) * s_v[:, :, None, :, None]).sum(dim=-2) / l.unsqueeze(-1)
    return o.to(saved.v.dtype), row_max.squeeze(-1) + torch.log(l)


def _shifted_pv_output(saved, cfg: SageConfig, tile: int = WIDE_TILE, levels: int = QMAX):
    """(O, LSE) of variant r8i: P~ against the running max rounded up to a whole log2 step, the integer sum of the
    tiles' P^ V^ shifted right by each rise of that reference (int64 here, exactly what an int32 accumulator holds
    below 2^31), V INT8 per channel over the sequence, its scale applied to O's columns at the end.
    levels: P^ = round(levels P~); 254 is r8o's (P' = P^ - 127 in INT8, the offset added back as 127 times the
    tile's column sums of V^)."""
    b, h, n, d = saved.v.shape
    ct = compute_dtype(saved.v.dtype)
    v_hat, c_v = quantize_groups(saved.v.to(ct), n, -2, cfg.quantize)         # c_v (B,H,1,D)
    s2 = scores(saved.q_hat, saved.s_q, saved.k_hat, saved.s_k, saved.mu_q, saved.k_sm, cfg,
                1.0 / math.sqrt(d)) * LOG2E                                  # log2 units, as the kernels
    tn = n // tile
    s_tiles = s2.reshape(b, h, n, tn, tile)
    run_max = s_tiles.amax(dim=-1).cummax(dim=-1).values   # finite from tile 0: key 0 is never masked
    # tile 0's maximum itself, then whole log2 steps above it
    ref = run_max[..., :1] + torch.ceil(run_max - run_max[..., :1])
    e = torch.exp2(s_tiles - ref.unsqueeze(-1))                     # <= 1
    p_hat = torch.round(levels * e).to(torch.int64)
    v_int = v_hat.to(torch.int64).reshape(b, h, tn, tile, d)
    acc = torch.zeros(b, h, n, d, dtype=torch.int64)
    l = torch.zeros(b, h, n, dtype=e.dtype)
    for j in range(tn):
        if j:
            rise = torch.round(ref[..., j] - ref[..., j - 1]).to(torch.int64)    # whole steps, >= 0
            acc = torch.bitwise_right_shift(acc, rise.unsqueeze(-1))
            l = l * torch.exp2(-rise.to(l.dtype))
        acc = acc + torch.einsum("bhnk,bhkd->bhnd", p_hat[..., j, :], v_int[:, :, j])
        l = l + e[..., j, :].sum(dim=-1)
    assert acc.abs().max() < 2**31, "the integer sum would overflow an int32 accumulator"
    o = acc.to(ct) * c_v / levels / l.unsqueeze(-1)
    return o.to(saved.v.dtype), (ref[..., -1] + torch.log2(l)) / LOG2E


def _tiled_x_dq(saved, inter, cfg: SageConfig, keys: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(dQ, dS as it consumes it) with X = dS s_K (K's token scale moved into dS, since it runs along the sum) INT8
    per (q token, tile of `keys` keys) times K^: the token contract's dQ until 2026-11-28 (variants x128: the
    forward's key tile, validate.key_tile; x64: block_kv)."""
    b, h, n, d = saved.v.shape
    ds = _backward_ds(saved, inter, cfg)
    tx = n // keys
    s_k = saved.s_k.unsqueeze(-2)   # per kv column
    x_hat, s_x = quantize_groups(ds * s_k, keys, -1, cfg.quantize)   # s_x (B,H,N,Tx)
    xk = torch.einsum("bhqtk,bhtkd->bhqtd", x_hat.reshape(b, h, n, tx, keys), saved.k_hat.reshape(b, h, tx, keys, d))
    dq = (xk * s_x[..., None] * (1.0 / math.sqrt(d))).sum(dim=-2)
    x = dequantize_groups(x_hat, s_x, keys, -1)
    ds_seen = torch.where(s_k > 0, x / torch.where(s_k > 0, s_k, torch.ones_like(s_k)), torch.zeros_like(x))
    return dq.to(saved.v.dtype), ds_seen


def _bf16_ds_dq(saved, inter, q, k, cfg: SageConfig, smoothed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(dQ, dS as it consumes it) with dQ = sm_scale bf16(dS) K16 summed in fp64 (variants y16, y16s): K16 is K
    rounded to bf16, or K - mean (K-smoothing's) rounded so when smoothed."""
    ds16 = _backward_ds(saved, inter, cfg).to(torch.bfloat16)
    k_used = k
    if smoothed:
        ct = compute_dtype(q.dtype)
        _, k_used, _ = smooth(q.to(ct), k.to(ct), cfg)
    dq_k = k_used.to(torch.bfloat16)
    dq = torch.einsum("bhqk,bhkd->bhqd", ds16.double(), dq_k.double()) / math.sqrt(saved.v.shape[-1])
    return dq.to(saved.v.dtype), ds16.to(saved.v.dtype)


def _bf16_dk(saved, inter, q, cfg: SageConfig, integer_q: bool) -> torch.Tensor:
    """dK as a bf16 product summed in fp64 (variants dk16, dk16q): sm_scale bf16(dS)^T Q16 with Q as given in
    bf16 (dK = dS^T Q holds with Q-smoothing too: its bias is added in full precision), or (integer_q)
    sm_scale bf16(dS s_Q)^T Q^ with the contract's integer Q^ (exact in bf16)."""
    ds = _backward_ds(saved, inter, cfg)
    if integer_q:
        y16 = (ds * saved.s_q.unsqueeze(-1)).to(torch.bfloat16)
        dk = torch.einsum("bhqk,bhqd->bhkd", y16.double(), saved.q_hat.double())
    else:
        dk = torch.einsum("bhqk,bhqd->bhkd", ds.to(torch.bfloat16).double(), q.to(torch.bfloat16).double())
    return (dk / math.sqrt(saved.v.shape[-1])).to(saved.v.dtype)


def _int8_y_dk(saved, inter, cfg: SageConfig) -> torch.Tensor:
    """dK of variant y8, the token contract's until 2026-11-28: Y = dS s_Q (here from the unquantised dS; the
    contract then rounded dO s_Q first, ~1% of dK's error at sigma 1) quantised per (kv token, q block), each q
    block's exact integer product with Q^ scaled by its kv rows' scales, the blocks summed."""
    b, h, n, d = saved.v.shape
    tm, bq = n // cfg.block_q, cfg.block_q
    y = _backward_ds(saved, inter, cfg) * saved.s_q.unsqueeze(-1)
    y_hat, s_y = quantize_groups(y, bq, -2, cfg.quantize)
    yq = torch.einsum("bhiqn,bhiqd->bhind", y_hat.reshape(b, h, tm, bq, n), saved.q_hat.reshape(b, h, tm, bq, d))
    return ((yq * s_y[..., None]).sum(dim=2) / math.sqrt(d)).to(saved.v.dtype)


def _channel_k_dq(saved, inter, q, k, cfg: SageConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(dQ, dS as it consumes it) with K^ quantised per channel over the whole sequence (one scale c_d
    per head and channel, after K-smoothing) instead of per token: dS then needs no s_K folded in,
    X = dS is quantised per (q token, kv tile) as the contract's X is, and c_d scales dQ's columns
    once at the end."""
    b, h, n, d = saved.v.shape
    tn, bk = n // cfg.block_kv, cfg.block_kv
    ct = compute_dtype(q.dtype)
    _, k_sm, _ = smooth(q.to(ct), k.to(ct), cfg)
    ds = _backward_ds(saved, inter, cfg)
    x_hat, s_x = quantize_groups(ds, bk, -1, cfg.quantize)                 # s_x (B,H,N,Tn)
    kc_hat, c = quantize_groups(k_sm, n, -2, cfg.quantize)                  # c (B,H,1,D)
    xk = torch.einsum("bhqtk,bhtkd->bhqtd", x_hat.reshape(b, h, n, tn, bk), kc_hat.reshape(b, h, tn, bk, d))
    dq = (xk * s_x[..., None]).sum(dim=-2) * c / math.sqrt(d)
    return dq.to(saved.v.dtype), dequantize_groups(x_hat, s_x, bk, -1)


def quantized_dp(do: torch.Tensor, v: torch.Tensor, cfg: SageConfig, variant: str) -> torch.Tensor:
    """dP = dO V^T of a dP variant (DP_VARIANTS), in the simulation's compute dtype. dO^ and V^ with their
    scales along dP's free axes (per q token or q block, per kv token), so the product of the quantised
    values is summed unscaled (INT8: integers, exact; FP8: e4m3 values, in fp64) and scaled after."""
    ct = compute_dtype(v.dtype)
    do_c, v_c = do.to(ct), v.to(ct)
    if variant == "dpf8":   # per token: a row block of one row
        do_hat, s_do = quantize_row_blocks_e4m3(do_c, 1, cfg.quantize)
        v_hat, s_v = quantize_row_blocks_e4m3(v_c, 1, cfg.quantize)
    elif variant in ("dpi8", "dpi8b"):
        do_hat, s_do = quantize_row_blocks(do_c, cfg.block_q if variant == "dpi8b" else 1, cfg.quantize)
        v_hat, s_v = quantize_row_blocks(v_c, 1, cfg.quantize)
        if variant == "dpi8b":
            s_do = s_do.repeat_interleave(cfg.block_q, dim=-1)
    else:
        raise ValueError(f"{variant!r} is not a dP variant ({DP_VARIANTS})")
    dp = (do_hat.double() @ v_hat.double().transpose(-1, -2)) * s_do.double()[..., :, None] * s_v.double()[..., None, :]
    return dp.to(ct)


def prescaled_do_dk(saved, inter, do: torch.Tensor, cfg: SageConfig, rounded: bool = True) -> torch.Tensor:
    """dK of variant dos: Y = P (dP s_Q - delta s_Q) with both terms from one product, V [dO s_Q | -delta s_Q]^T:
    dO s_Q rounded to bf16 (what a preprocess would write; the study's inputs are fp32, the kernels' bf16),
    -delta s_Q split into two bf16 terms (hi, lo) whose partner columns of V are ones, the sum in fp32; Y / s_Q
    then takes dS's place in the contract's dK (simulate.token_dk). rounded False: the same without the bf16
    roundings (the contract's dK up to float rounding: the tests' check of the algebra)."""
    ct, dtype = compute_dtype(saved.v.dtype), saved.v.dtype
    sm_scale = 1.0 / math.sqrt(saved.v.shape[-1])
    s_q = saved.s_q.unsqueeze(-1)   # per q row

    def bf16(x):
        return x.to(torch.bfloat16).to(ct) if rounded else x
    do_s = bf16(do.to(ct) * s_q)
    delta_s = inter.delta.unsqueeze(-1) * s_q
    hi = bf16(delta_s)
    lo = bf16(delta_s - hi)
    dp_s = do_s @ saved.v.to(ct).transpose(-1, -2) - (hi + lo)
    ds = torch.where(s_q > 0, _backward_p(saved, cfg) * dp_s / torch.where(s_q > 0, s_q, torch.ones_like(s_q)),
                     torch.zeros_like(dp_s))
    return token_dk(ds, saved, cfg, sm_scale).to(dtype)


def backward_with_dp(saved, do: torch.Tensor, dp: torch.Tensor, cfg: SageConfig):
    """(dQ, dK, dV, dS as dQ consumes it) of the simulation's backward with ``dp`` in place of its dO V^T. With the
    simulation's own dP this is variant a, bit for bit (tests)."""
    (dq, dk, dv), inter = backward(saved, do, cfg, return_intermediates=True, dp=dp)
    return dq, dk, dv, inter.ds


FIXED_BITS = 30   # the bound maps to 2**30 quanta: 2x headroom under int32's 2**31
FUSED_KV_ROWS = 128   # kv rows of a fused d=64 backward's program: one dQ partial per q row each


def fixed_point_dq(saved, inter, do: torch.Tensor, cfg: SageConfig) -> tuple[torch.Tensor, dict]:
    """(dQ of variant dqfix, {"bits_min", "bits_median": precision left per q row, 2^FIXED_BITS over the bound's
    looseness; "peak": the largest row's sum of |rounded partials| over 2^31, which must stay < 1;
    "rel_l2_vs_exact_sum": the fixed-point sum against the partials' exact sum, before dQ's rounding to its dtype})."""
    b, h, n, d = saved.v.shape
    sm_scale = 1.0 / math.sqrt(d)
    # the contract's dQ terms (simulate.token_dq: bf16(dS), as inter.ds holds it, times K16), summed per
    # FUSED_KV_ROWS keys: a fused backward program's partial
    tx = n // FUSED_KV_ROWS
    partials = torch.einsum("bhqtk,bhtkd->bhqtd", inter.ds.double().reshape(b, h, n, tx, FUSED_KV_ROWS),
                            saved.dq_k.double().reshape(b, h, tx, FUSED_KV_ROWS, d)) * sm_scale   # (B,H,N,T,D)
    k = saved.dq_k.double()
    head_max = lambda t: t.flatten(2).amax(dim=-1)[..., None]   # noqa: E731  (B,H,1)
    bound = (2 * sm_scale * do.double().norm(dim=-1) * head_max(saved.v.double().norm(dim=-1))
             * head_max(k.abs()))   # (B,H,N)
    u = torch.exp2(torch.ceil(torch.log2(bound / 2 ** FIXED_BITS)))[..., None, None]
    terms = torch.round(partials.double() / u)
    dq = (terms.sum(dim=-2) * u[..., 0, :]).to(saved.v.dtype)
    row_max = (terms.sum(dim=-2).abs().amax(dim=-1) * u[..., 0, 0])
    live = row_max > 0
    bits = FIXED_BITS - torch.log2(bound[live] / row_max[live])
    exact = partials.double().sum(dim=-2)
    return dq, {"bits_min": bits.min().item(), "bits_median": bits.median().item(),
                "peak": (terms.abs().sum(dim=-2).amax() / 2 ** 31).item(),
                "rel_l2_vs_exact_sum": ((terms.sum(dim=-2) * u[..., 0, :] - exact).norm() / exact.norm()).item()}


def run_variants(q, k, v, do, cfg: SageConfig, variants) -> dict[str, dict[str, torch.Tensor]]:
    """O, dQ, dK, dV and dS (as dQ consumes it) of each variant for one input."""
    assert cfg.quant == "token", "the variants modify the token contract"
    out = {}
    o, saved = forward(q, k, v, cfg)
    (dq, dk, dv), inter = backward(saved, do, cfg, return_intermediates=True)
    base = {"o": o, "dq": dq, "dk": dk, "dv": dv, "ds": inter.ds}
    for name in variants:
        if name == "a":
            out[name] = base
        elif name == "i8":
            out[name] = {**base, "dv": _int8_dv(saved, do, cfg)}
        elif name in ("b", "c"):
            out[name] = {**base, "dv": _fp8_dv(saved, do, cfg, do_per_token=name == "c")}
        elif name in ("bP", "bdO"):
            out[name] = {**base, "dv": _fp8_dv(saved, do, cfg, fp8_p=name == "bP", fp8_do=name == "bdO")}
        elif name == "d":
            saved_d = saved._replace(o=_fp8_pv_output(saved, cfg))
            (dq_d, dk_d, dv_d), inter_d = backward(saved_d, do, cfg, return_intermediates=True)
            out[name] = {"o": saved_d.o, "dq": dq_d, "dk": dk_d, "dv": dv_d, "ds": inter_d.ds}
        elif name == "g":   # O and the LSE the backward normalises P with both from the quantised sum
            o_g, lse_g = _quantized_sum_output(saved, cfg)
            saved_g = saved._replace(o=o_g, lse=lse_g)
            (dq_g, dk_g, dv_g), inter_g = backward(saved_g, do, cfg, return_intermediates=True)
            out[name] = {"o": o_g, "dq": dq_g, "dk": dk_g, "dv": dv_g, "ds": inter_g.ds}
        elif name in WIDE_VARIANTS:   # the forward's O and LSE feed the contract's backward (block_kv kept)
            tile, per_channel, running_max = WIDE_VARIANTS[name]
            o_w, lse_w = _tiled_pv_output(saved, cfg, tile or cfg.block_kv, per_channel, running_max)
            saved_w = saved._replace(o=o_w, lse=lse_w)
            (dq_w, dk_w, dv_w), inter_w = backward(saved_w, do, cfg, return_intermediates=True)
            out[name] = {"o": o_w, "dq": dq_w, "dk": dk_w, "dv": dv_w, "ds": inter_w.ds}
        elif name in ("r8i", "r8o"):
            o_i, lse_i = _shifted_pv_output(saved, cfg, levels=QMAX if name == "r8i" else 2 * QMAX)
            saved_i = saved._replace(o=o_i, lse=lse_i)
            (dq_i, dk_i, dv_i), inter_i = backward(saved_i, do, cfg, return_intermediates=True)
            out[name] = {"o": o_i, "dq": dq_i, "dk": dk_i, "dv": dv_i, "ds": inter_i.ds}
        elif name == "kc":
            dq_kc, ds_kc = _channel_k_dq(saved, inter, q, k, cfg)
            out[name] = {**base, "dq": dq_kc, "ds": ds_kc}
        elif name in ("x128", "x64"):
            keys = key_tile(cfg.quant, cfg.block_kv) if name == "x128" else cfg.block_kv
            dq_x, ds_x = _tiled_x_dq(saved, inter, cfg, keys)
            out[name] = {**base, "dq": dq_x, "ds": ds_x}
        elif name in ("y16", "y16s"):
            dq_y, ds_y = _bf16_ds_dq(saved, inter, q, k, cfg, smoothed=name == "y16s")
            out[name] = {**base, "dq": dq_y, "ds": ds_y}
        elif name in ("dk16", "dk16q"):   # dK only
            out[name] = {**base, "dk": _bf16_dk(saved, inter, q, cfg, integer_q=name == "dk16q")}
        elif name == "ds16":   # dQ and dK from dS itself
            dq_y, ds_y = _bf16_ds_dq(saved, inter, q, k, cfg, smoothed=False)
            out[name] = {**base, "dq": dq_y, "ds": ds_y, "dk": _bf16_dk(saved, inter, q, cfg, integer_q=False)}
        elif name == "y8":   # dK only
            out[name] = {**base, "dk": _int8_y_dk(saved, inter, cfg)}
        elif name == "dqfix":   # the contract's dQ, summed in fixed point
            dq_f, stats = fixed_point_dq(saved, inter, do, cfg)
            out[name] = {**base, "dq": dq_f, "stats": stats}
        elif name == "dos":   # dK only: dQ, dV and dS as the contract's
            assert saved.mu_q is None, "variant dos is studied without Q-smoothing"
            out[name] = {**base, "dk": prescaled_do_dk(saved, inter, do, cfg)}
        elif name in DP_VARIANTS:   # O, delta and dV as the contract's; dP enters dS only
            dq_p, dk_p, dv_p, ds_p = backward_with_dp(saved, do, quantized_dp(do, v, cfg, name), cfg)
            out[name] = {**base, "dq": dq_p, "dk": dk_p, "dv": dv_p, "ds": ds_p}
        elif name in ("e", "f", "fK"):
            ct = compute_dtype(q.dtype)
            q_sm, k_sm, mu_q = smooth(q.to(ct), k.to(ct), cfg)
            if name == "e":   # SageAttention2's Hopper per-thread grouping
                q_hat, s_q = quantize_interleaved(q_sm, 16, 8, 1)
                k_hat, s_k = quantize_interleaved(k_sm, 128, 8, 2)
            else:
                q_hat, s_q = (quantize_interleaved(q_sm, cfg.block_q, 8, 2) if name == "f" else
                              quantize_interleaved(q_sm, 8, 8, 1))    # groups of one token: per token
                k_hat, s_k = quantize_interleaved(k_sm, cfg.block_kv, 8, 2)
            o_e, saved_e = forward_quantized(q_hat, s_q, k_hat, s_k, mu_q, k_sm, v, cfg, q.dtype)
            saved_e = with_dk_q(with_dq_k(saved_e, k, cfg), q, cfg)
            (dq_e, dk_e, dv_e), inter_e = backward(saved_e, do, cfg, return_intermediates=True)
            out[name] = {"o": o_e, "dq": dq_e, "dk": dk_e, "dv": dv_e, "ds": inter_e.ds}
        else:
            raise ValueError(f"unknown variant {name!r}; choose from {sorted(VARIANTS)}")
    return out


def with_k_outliers(k: torch.Tensor, fraction: float, scale: float, seed: int) -> torch.Tensor:
    """k with a random `fraction` of its tokens (rows) multiplied by `scale`: outlier keys, which
    Gaussian inputs lack and which per-channel scales handle worst."""
    gen = torch.Generator().manual_seed(seed + 1_000_003)
    rows = torch.rand(*k.shape[:-1], 1, generator=gen) < fraction
    return torch.where(rows, k * scale, k)


def study(sigmas, variants, *, seq: int, head_dim: int, causal: bool, seeds: int = 1, batch: int = 1,
          heads: int = 2, block_q: int = 128, block_kv: int = 64,
          k_outliers: tuple[float, float] | None = None,
          stats: dict | None = None) -> dict[str, dict[float, dict[str, float]]]:
    """rel-L2 against FPA, mean over seeds 0..seeds-1: {variant: {sigma: {column: value}}};
    k_outliers (fraction, scale): with_k_outliers applied to K first. stats, if given, gets the variants' own
    figures, the worst over seeds: {variant: {sigma: {name: value}}} (dqfix: fixed_point_dq's)."""
    cfg = SageConfig(causal=causal, block_q=block_q, block_kv=block_kv, quant="token")
    acc = {name: {s: {c: 0.0 for c in COLUMNS} for s in sigmas} for name in variants}
    for sigma in sigmas:
        for seed in range(seeds):
            q, k, v, do = gaussian_inputs(sigma, batch, heads, seq, head_dim, seed)
            if k_outliers:
                k = with_k_outliers(k, *k_outliers, seed)
            ref = fpa_attention(q, k, v, do, causal=causal)
            for name, tensors in run_variants(q, k, v, do, cfg, variants).items():
                for c in COLUMNS:
                    acc[name][sigma][c] += error_stats(tensors[c], getattr(ref, c)).rel_l2 / seeds
                if stats is not None and "stats" in tensors:
                    worst = stats.setdefault(name, {}).setdefault(sigma, {})
                    for key, value in tensors["stats"].items():   # bits: the fewest; the rest: the highest
                        worst[key] = (min if key.startswith("bits") else max)(worst.get(key, value), value)
    return acc


def format_table(results, columns=COLUMNS) -> str:
    lines = ["| variant | sigma | " + " | ".join(f"{LABELS[c]}" for c in columns) + " |",
             "|" + "---|" * (2 + len(columns))]
    for name, rows in results.items():
        for sigma, vals in rows.items():
            lines.append(f"| {name} | {sigma:g} | " + " | ".join(f"{vals[c]:.4f}" for c in columns) + " |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.quant_study", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--head-dim", type=int, default=64, choices=SUPPORTED_HEAD_DIMS)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--sigmas", type=float, nargs="+", default=[1, 3, 5, 8])
    p.add_argument("--seeds", type=int, default=1, help="mean over seeds 0..SEEDS-1 (seed 0 alone by default)")
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--block-q", type=int, default=128)
    p.add_argument("--block-kv", type=int, default=64)
    p.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=list(VARIANTS))
    p.add_argument("--k-outliers", type=float, nargs=2, metavar=("FRACTION", "SCALE"),
                   help="multiply a random FRACTION of K's tokens by SCALE (outlier keys)")
    p.add_argument("--json", help="also write the numbers to this JSON file")
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag, values in (("--sigmas", args.sigmas), ("--seeds", [args.seeds]), ("--heads", [args.heads]),
                         ("--seq", [args.seq])):
        if any(not v > 0 for v in values):
            parser.error(f"{flag} {' '.join(f'{v:g}' for v in values)}: every value must be positive")
    wide = {"e", "p128", "p128vc", "r8", "r8i", "r8o"} & set(args.variants)   # 128-token groups or tiles
    if args.seq % max(args.block_q, args.block_kv, 128 if wide else 1):
        print(f"error: --seq {args.seq} must be a multiple of the blocks (and of 128 for variants e, p128, "
              "p128vc, r8, r8i, r8o)", file=sys.stderr)
        return 2
    if args.k_outliers and not (0 < args.k_outliers[0] <= 1 and args.k_outliers[1] > 0):
        parser.error(f"--k-outliers {args.k_outliers[0]:g} {args.k_outliers[1]:g}: a fraction in (0, 1] and a "
                     "positive scale")
    stats = {}
    results = study(args.sigmas, args.variants, seq=args.seq, head_dim=args.head_dim, causal=args.causal,
                    seeds=args.seeds, heads=args.heads, block_q=args.block_q, block_kv=args.block_kv,
                    k_outliers=tuple(args.k_outliers) if args.k_outliers else None, stats=stats)
    print(f"rel-L2 vs FPA (fp32), token contract variants; B=1 H={args.heads} N={args.seq} D={args.head_dim} "
          f"causal={args.causal} blocks={args.block_q}x{args.block_kv} K-smoothing; "
          + (f"K outliers: {args.k_outliers[0]:g} of tokens x{args.k_outliers[1]:g}; " if args.k_outliers else "")
          + (f"mean over seeds 0-{args.seeds - 1}" if args.seeds > 1 else "seed 0"))
    print(format_table(results))
    print()
    for name in args.variants:
        print(f"{name}: {VARIANTS[name]}")
    for name, rows in stats.items():
        for sigma, row in rows.items():
            print(f"{name} sigma {sigma:g}: " + ", ".join(f"{k} {v:.3g}" for k, v in row.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seq": args.seq, "head_dim": args.head_dim, "causal": args.causal, "seeds": args.seeds,
                       "heads": args.heads, "k_outliers": args.k_outliers,
                       "variants": {n: VARIANTS[n] for n in args.variants},
                       "rel_l2": {n: {str(s): r for s, r in rows.items()} for n, rows in results.items()},
                       "stats": {n: {str(s): r for s, r in rows.items()} for n, rows in stats.items()}}, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
