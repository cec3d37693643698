"""Forward kernel (the paper's Algorithm 1) on pre-quantised Q, K, V.

One program per (BLOCK_M q rows, batch*head), BLOCK_M a divisor of block_q; BLOCK_N = the forward's
kv tile (validate.key_tile: block_kv, at least 128 keys in the token contract), so each kv
tile is one quantisation block of V and of P~. S = int(Q^ K^T) * s_Q * s_K * sm_scale is
kept in log2 units (log2(e) folded into the scale, so exponentials are exp2). Per kv tile j:
t = rowmax(S_j); P^ = round(127 * exp(S_j - t)) is the paper's per-token quantisation (it does
not depend on the running max m), and the online softmax weights the tile by w = exp(t - m).
TOKEN (the "token" contract): s_Q and s_K are per token, so the scale of S is a row vector
times a column vector, and t is a float row max; at d=128 the running max m is raised lazily
(RESCALE_LOG2), so most tiles skip rescaling the accumulator, which is held in two head-dim halves
(SPLIT).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from ..validate import key_tile
from . import registry
from ._common import (INTERPRETING, LN2, LOG2E, empty_in_layout_of, int_to_float, program_tile, quantize_token_rows,
                      round_scaled_to_int8, to_k_order)
from .launch import Tuning, arch_for, launch, launch_settings, overrides
from .schedule import heads_per_section, tile_grid


@triton.jit
def smooth_q_bias(KF_bh, KMEAN_bh, MU_blk, offs_n, offs_d, stride_kn, stride_kd, SMOOTH_K: tl.constexpr):
    """mu_i . K_sm_n for the keys offs_n, in fp32 (Q-smoothing's full-precision bias, unscaled)."""
    k = tl.load(KF_bh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd).to(tl.float32)
    if SMOOTH_K:
        k -= tl.load(KMEAN_bh + offs_d)[None, :]
    return tl.sum(k * tl.load(MU_blk + offs_d)[None, :], axis=1)


# Below every INT8 score (|x| <= 127^2 * 256 < 2^22) and still exact through int_to_float.
MASKED_INT = tl.constexpr(-(2**22 - 1))
# The token forward's lazy rescaling threshold at d=128 (log2 units: acc and l may run up to 256x
# their values against the true running max).
RESCALE_LOG2 = tl.constexpr(8.0)


@triton.jit
def _forward_tiles(acc, acc2, l_i, m_i, q8, q_scale, offs_m, lo, hi,
                   K8_bh, V8T_bh, SK_bh, SV_bh, KF_bh, KMEAN_bh, MU_blk, stride_kn, stride_kd,
                   bias_scale, N,
                   BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr,
                   SMOOTH_Q: tl.constexpr, SMOOTH_K: tl.constexpr, TOKEN: tl.constexpr):
    """q_scale: the block's scale times sm_scale * log2(e), or with TOKEN the rows' (a vector)."""
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        j = start_n // BLOCK_N
        k8 = tl.load(K8_bh + offs_n[:, None] * HEAD_DIM + offs_d[None, :])
        x = tl.dot(q8, tl.trans(k8), out_dtype=tl.int32)
        if TOKEN and not SMOOTH_Q:
            # S = (x s_K) * q_scale with q_scale >= 0 per row: the row max of x s_K gives t, and
            # S - t is one fma per element.
            xs = int_to_float(x) * tl.load(SK_bh + offs_n)[None, :]
            if MASKED:
                t = tl.max(tl.where(offs_m[:, None] >= offs_n[None, :], xs, float("-inf")), axis=1)
            else:
                t = tl.max(xs, axis=1)
            t = tl.where(t == float("-inf"), float("-inf"), t * q_scale)   # -inf * 0 would be NaN
            t_safe = tl.where(t == float("-inf"), 0.0, t)
            p = tl.math.exp2(xs * q_scale[:, None] - t_safe[:, None])
            if MASKED:
                p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
        elif SMOOTH_Q:
            if TOKEN:
                s = int_to_float(x) * tl.load(SK_bh + offs_n)[None, :] * q_scale[:, None]
            else:
                s = int_to_float(x) * (q_scale * tl.load(SK_bh + j))
            bias = smooth_q_bias(KF_bh, KMEAN_bh, MU_blk, offs_n, offs_d, stride_kn, stride_kd, SMOOTH_K)
            s += (bias * bias_scale)[None, :]
            if MASKED:
                s = tl.where(offs_m[:, None] >= offs_n[None, :], s, float("-inf"))
            t = tl.max(s, axis=1)                          # tile row max; -inf if the row is fully masked
            t_safe = tl.where(t == float("-inf"), 0.0, t)
            p = tl.math.exp2(s - t_safe[:, None])          # P~ / exp(t - m): in [0, 1], 1 at the max
        else:
            # S = x * scale with scale > 0, so the row max of the integers gives t exactly, and
            # S - t is one fma per element (no separate product, no float max).
            scale = q_scale * tl.load(SK_bh + j)
            if MASKED:
                x = tl.where(offs_m[:, None] >= offs_n[None, :], x, MASKED_INT)
            t_int = tl.max(x, axis=1)
            t = int_to_float(t_int) * scale
            if MASKED:
                t = tl.where(t_int == MASKED_INT, float("-inf"), t)
            t_safe = tl.where(t == float("-inf"), 0.0, t)
            p = tl.math.exp2(int_to_float(x) * scale - t_safe[:, None])
            if MASKED:
                p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
        p8 = to_k_order(round_scaled_to_int8(p, 127.0))   # V^T's rows are in k order
        if TOKEN and HEAD_DIM > 64:
            # Lazy rescaling: m_i is the reference the rows' acc and l are kept against, raised only
            # when a row's tile max passes it by more than RESCALE_LOG2 (then for all rows, those
            # that did not grow with alpha = 1), so most tiles skip the multiply of acc (one per
            # element of acc). w = exp2(t - m_i) <= 2^RESCALE_LOG2 keeps acc and l in range; O and
            # LSE are the same numbers up to fp32 rounding (FlashAttention-4 does the same). The
            # test is a reduction over the program's rows (shuffles, two CTA barriers, ~30
            # instructions a tile): at d=128 it skips 64 multiplies a thread, at d=64 only 32,
            # which measured no gain (docs/kernel-notes.md, "The token forward over 128 keys").
            if tl.max((t > m_i + RESCALE_LOG2).to(tl.int32), axis=0) > 0:
                m_new = tl.maximum(m_i, t)
                alpha = tl.math.exp2(m_i - tl.where(m_new == float("-inf"), 0.0, m_new))
                acc = acc * alpha[:, None]
                acc2 = acc2 * alpha[:, None]
                l_i = l_i * alpha
                m_i = m_new
            w = tl.math.exp2(t - tl.where(m_i == float("-inf"), 0.0, m_i))
            wv = (w * (tl.load(SV_bh + j) * (1.0 / 127.0)))[:, None]
            offs_h = tl.arange(0, HEAD_DIM // 2)
            v8 = tl.trans(tl.load(V8T_bh + offs_h[:, None] * N + offs_n[None, :]))
            acc += int_to_float(tl.dot(p8, v8, out_dtype=tl.int32)) * wv
            v8 = tl.trans(tl.load(V8T_bh + (HEAD_DIM // 2 + offs_h)[:, None] * N + offs_n[None, :]))
            acc2 += int_to_float(tl.dot(p8, v8, out_dtype=tl.int32)) * wv
            l_i += w * tl.sum(p, axis=1)
        else:
            m_new = tl.maximum(m_i, t)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.math.exp2(m_i - m_safe)
            w = tl.math.exp2(t - m_safe)
            v8 = tl.trans(tl.load(V8T_bh + offs_d[:, None] * N + offs_n[None, :]))   # sequence-contiguous
            pv = int_to_float(tl.dot(p8, v8, out_dtype=tl.int32))
            acc = acc * alpha[:, None] + pv * (w * (tl.load(SV_bh + j) * (1.0 / 127.0)))[:, None]
            l_i = l_i * alpha + w * tl.sum(p, axis=1)
            m_i = m_new
    return acc, acc2, l_i, m_i


@triton.jit
def _forward_kernel(Q8, K8, V8T, SQ, SK, SV, O, LSE, MU, KF, KMEAN, Q,
                    stride_kfb, stride_kfh, stride_kfn, stride_kfd, stride_ob, stride_oh, stride_on,
                    stride_qb, stride_qh, stride_qn, stride_qd, sm_scale, H, N, SECTION,
                    BLOCK_M: tl.constexpr, Q_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                    CAUSAL: tl.constexpr, SMOOTH_Q: tl.constexpr, SMOOTH_K: tl.constexpr, TOKEN: tl.constexpr,
                    QUANTIZE_Q: tl.constexpr = False, PDL: tl.constexpr = False):
    """QUANTIZE_Q: Q (any strides) is quantised here into Q8 and SQ; otherwise Q and the q strides are not
    read. PDL (launched as a programmatic dependent of the quantise launch): everything
    before the grid-dependency wait reads only Q and writes only Q's buffers, which the quantise launch leaves."""
    # Causal: the last q blocks see the most keys; they run first (rank 0, schedule.py).
    rank, bh = program_tile(N // BLOCK_M, SECTION)
    pid_m = N // BLOCK_M - 1 - rank
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    seq_base = bh.to(tl.int64) * N * HEAD_DIM
    if QUANTIZE_Q:
        # The token contract without Q-smoothing: this program quantises its own q rows (one scale per
        # token needs nothing beyond the row) and writes Q^ and its scales, as the quantise pass would: that pass
        # then reads and writes K and V only (the forward has memory bandwidth to spare, the pass had none).
        x = tl.load(Q + (bh // H).to(tl.int64) * stride_qb + (bh % H).to(tl.int64) * stride_qh
                    + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd).to(tl.float32)
        x8, x_scale = quantize_token_rows(x)
        tl.store(SQ + bh * N + offs_m, x_scale)
        tl.store(Q8 + seq_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], x8)
        # Read back below, as without QUANTIZE_Q: taken from the quantisation's registers, Q^ cost the main loop
        # 12.2 instead of 11.9 SASS per score element at d=64 and spill traffic at d=128 (docs/kernel-notes.md,
        # "Twelfth session"); the barrier makes the program's stores visible to all its threads.
        tl.debug_barrier()
    if PDL and not INTERPRETING:
        gdc_wait()   # the quantise launch's K^, V^ (and Q^ without QUANTIZE_Q) are written and visible
    q8 = tl.load(Q8 + seq_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
    # A program may hold part of a q quantisation block (BLOCK_M <= Q_BLOCK): fewer registers, more programs per SM.
    q_blk = start_m // Q_BLOCK
    if TOKEN:
        q_scale = tl.load(SQ + bh * N + offs_m) * (sm_scale * LOG2E)
        SK_bh = SK + bh * N
    else:
        q_scale = tl.load(SQ + bh * (N // Q_BLOCK) + q_blk) * (sm_scale * LOG2E)
        SK_bh = SK + bh * (N // BLOCK_N)
    K8_bh = K8 + seq_base
    V8T_bh = V8T + seq_base
    SV_bh = SV + bh * (N // BLOCK_N)
    KF_bh = KF + (bh // H).to(tl.int64) * stride_kfb + (bh % H).to(tl.int64) * stride_kfh
    KMEAN_bh = KMEAN + bh * HEAD_DIM
    MU_blk = MU + (bh * (N // Q_BLOCK) + q_blk) * HEAD_DIM
    bias_scale = sm_scale * LOG2E

    # SPLIT (token, d=128): O's accumulator and the P V product in two head-dim halves, so that one
    # half's int32 product is live at a time: fewer registers (over 64-key tiles it let 3 programs
    # share an SM; over today's 128-key tiles the kernel takes 255 and 2 programs run per SM).
    SPLIT: tl.constexpr = TOKEN and HEAD_DIM > 64
    ACC_D: tl.constexpr = HEAD_DIM // 2 if SPLIT else HEAD_DIM
    acc = tl.zeros([BLOCK_M, ACC_D], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, ACC_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    if CAUSAL:
        # Tiles entirely at or below the diagonal need no mask; tiles past the block's last row are skipped.
        diag_lo = (start_m + 1) // BLOCK_N * BLOCK_N
        diag_hi = tl.minimum(tl.cdiv(start_m + BLOCK_M, BLOCK_N) * BLOCK_N, N)
        acc, acc2, l_i, m_i = _forward_tiles(acc, acc2, l_i, m_i, q8, q_scale, offs_m, 0, diag_lo,
                                       K8_bh, V8T_bh, SK_bh, SV_bh, KF_bh, KMEAN_bh, MU_blk,
                                       stride_kfn, stride_kfd, bias_scale, N,
                                       BLOCK_N, HEAD_DIM, False, SMOOTH_Q, SMOOTH_K, TOKEN)
        acc, acc2, l_i, m_i = _forward_tiles(acc, acc2, l_i, m_i, q8, q_scale, offs_m, diag_lo, diag_hi,
                                       K8_bh, V8T_bh, SK_bh, SV_bh, KF_bh, KMEAN_bh, MU_blk,
                                       stride_kfn, stride_kfd, bias_scale, N,
                                       BLOCK_N, HEAD_DIM, True, SMOOTH_Q, SMOOTH_K, TOKEN)
    else:
        acc, acc2, l_i, m_i = _forward_tiles(acc, acc2, l_i, m_i, q8, q_scale, offs_m, 0, N,
                                       K8_bh, V8T_bh, SK_bh, SV_bh, KF_bh, KMEAN_bh, MU_blk,
                                       stride_kfn, stride_kfd, bias_scale, N,
                                       BLOCK_N, HEAD_DIM, False, SMOOTH_Q, SMOOTH_K, TOKEN)
    if SPLIT:
        O_bh = O + (bh // H).to(tl.int64) * stride_ob + (bh % H).to(tl.int64) * stride_oh
        offs_h = tl.arange(0, HEAD_DIM // 2)
        tl.store(O_bh + offs_m[:, None] * stride_on + offs_h[None, :],
                 (acc * (1.0 / l_i)[:, None]).to(O.dtype.element_ty))
        tl.store(O_bh + offs_m[:, None] * stride_on + (HEAD_DIM // 2 + offs_h)[None, :],
                 (acc2 * (1.0 / l_i)[:, None]).to(O.dtype.element_ty))
    else:
        o = acc * (1.0 / l_i)[:, None]
        O_bh = O + (bh // H).to(tl.int64) * stride_ob + (bh % H).to(tl.int64) * stride_oh
        tl.store(O_bh + offs_m[:, None] * stride_on + offs_d[None, :], o.to(O.dtype.element_ty))
    tl.store(LSE + bh * N + offs_m, m_i * LN2 + tl.log(l_i))


def forward_rows(block_q: int, head_dim: int, tuning: Tuning | None = None) -> int:
    """q rows per forward program (a divisor of block_q; a tool may set "forward_rows").

    64 rows on one warpgroup (H200 sweep, docs/kernel-notes.md): half the registers of a
    128-row program, so 2 (d=128) or 4 (d=64) programs share an SM and hide each other's
    latency; the K/V tiles are read twice as often, from L2.
    """
    return min(overrides(tuning).get("forward_rows", 64), block_q)


def _launch_settings(rows: int, head_dim: int, keys: int, causal: bool, token: bool, tuning: Tuning | None) -> dict:
    """keys: kv rows per tile (BLOCK_N). H100 sweeps (docs/kernel-notes.md, "The token forward over 128 keys")."""
    warps = 8 if rows * head_dim >= 128 * 128 else 4
    default = dict(num_warps=warps, num_stages=3)
    if token and rows * head_dim <= 64 * 64 and keys == 128:
        # 168 registers, 3 programs per SM, causal; without the mask 128 (144 B spilled), 4 per SM, is faster
        default["maxnreg"] = 168 if causal else 128
    elif rows * head_dim <= 64 * 64:
        default["maxnreg"] = 128   # 130 by choice, 128 fits 4 programs per SM (8 bytes spilled)
    return launch_settings("forward", default, tuning)


def run(q8, k8, v8t, s_q, s_k, s_v, *, out_dtype, causal: bool, smooth_k: bool, mu_q, k, k_mean, block_q: int,
        block_kv: int, layout_of, quant: str = "block", q=None, pdl: bool = False,
        tuning: Tuning | None = None):
    """The Triton forward kernel (registry: forward "triton", both contracts): (O, LSE), as forward() says;
    with q (token, no Q-smoothing) it writes q8 and s_q from q first. pdl: launched as the
    quantise launch's programmatic dependent (its caller launched that with the trigger: launch.forward_pdl)."""
    b, h, n, d = q8.shape
    smooth_q = mu_q is not None
    assert q is None or (quant == "token" and not smooth_q), "the forward quantises Q in the token contract only"
    o = empty_in_layout_of(q8 if layout_of is None else layout_of, out_dtype)
    lse = torch.empty(b, h, n, device=q8.device, dtype=torch.float32)
    kf = k if smooth_q else q8
    rows = forward_rows(block_q, d, tuning)
    keys = key_tile(quant, block_kv)
    launch("forward", _forward_kernel, tile_grid(n // rows, b * h),
        q8, k8, v8t, s_q, s_k, s_v, o, lse,
        mu_q if smooth_q else s_q, kf, k_mean if (smooth_q and smooth_k) else s_q,
        q8 if q is None else q,   # read only with QUANTIZE_Q
        *kf.stride(), *o.stride()[:3], *(q.stride() if q is not None else (0, 0, 0, 0)),
        1.0 / math.sqrt(d), h, n, heads_per_section(causal, b * h, (k8, v8t)),
        BLOCK_M=rows, Q_BLOCK=block_q, BLOCK_N=keys, HEAD_DIM=d, CAUSAL=causal,
        SMOOTH_Q=smooth_q, SMOOTH_K=smooth_k, TOKEN=quant == "token", QUANTIZE_Q=q is not None,
        **_launch_settings(rows, d, keys, causal, quant == "token", tuning),
        **({"PDL": True, "launch_pdl": True} if pdl else {}), tuning=tuning)
    return o, lse


def forward(q8, k8, v8t, s_q, s_k, s_v, *, out_dtype, causal: bool, smooth_k: bool,
            mu_q=None, k=None, k_mean=None, block_q: int, block_kv: int, layout_of=None,
            kernels: str = "default", quant: str = "block", q=None, pdl: bool = False,
            tuning: Tuning | None = None):
    """O (B,H,N,D) in out_dtype, in layout_of's memory order (contiguous without it;
    _common.empty_in_layout_of), and LSE (B,H,N) fp32 from the quantised operands, by the
    registry's forward kernel for this device and `kernels`.

    mu_q (B,H,N/block_q,D), k (the unquantised K, any strides) and k_mean (B*H,D) are needed
    only with Q-smoothing (mu_q not None), for the bias mu_i . K_sm^T. quant: the contract; with
    "token", s_q and s_k are per token (B,H,N). q (token, no Q-smoothing): Q itself, which the kernel
    quantises into q8 and s_q (quantize_qkv's, left unwritten with quantize_q=False).
    pdl: launched as a programmatic dependent of the quantise launch just before it (launch.forward_pdl), which
    must write nothing the kernel reads before its wait (Q itself: q given).
    """
    arch = arch_for(q8.device, tuning)
    kernel = registry.resolve(arch, q8.shape[-1], "forward", quant, kernels, block_q=block_q, block_kv=block_kv,
                              smooth_q=mu_q is not None, seq=q8.shape[2], causal=causal)
    extra = {}
    if q is not None or pdl:
        assert kernel.name == "triton", (f"forward kernel {kernel.name!r} neither quantises Q nor waits as a "
                                         "programmatic dependent (the Triton one does)")
        extra = dict(q=q, pdl=pdl)
    return registry.load(kernel)(q8, k8, v8t, s_q, s_k, s_v, out_dtype=out_dtype, causal=causal, smooth_k=smooth_k,
                                 mu_q=mu_q, k=k, k_mean=k_mean, block_q=block_q, block_kv=block_kv,
                                 layout_of=layout_of, quant=quant, tuning=tuning, **extra)
