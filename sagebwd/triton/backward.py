"""Backward kernels (the paper's Algorithm 2): dQ first, then dK/dV.

The backward quantises P and dS per (block_q x block_kv) tile. A tile-wide amax needs the
whole tile in one program, which forces the dK/dV program onto 128 x 64 score tiles: with the
dK/dV accumulators beside them that left no registers (255 with spills) and, at 8 warps over
64 kv rows, made Triton run the dK/dV dots on both warpgroups. So the work is split by what
each program sees whole:

dQ program (one q block i = one quantisation row of tiles, looping over kv tiles j):
  S = int(Q^_i K^_j^T) s_Q s_K sm_scale [+ bias];  P = exp(S - L_i);  dP = dO_i V_j^T (16-bit)
  dS = P (dP - delta_i);  amax(P), amax(dS) of the tile -> the tile's scales (written out)
  dQ_i += int(dS^ K^_j) s_dS s_K                 (K^ read sequence-contiguous)
dK/dV program (BLOCK_N kv rows, possibly several kv tiles, looping over q in BLOCK_M slices
of a q block), in the transposed orientation so that the accumulators are rows of dK/dV:
  S^T, P^T, dP^T, dS^T as above, quantised with the scales the dQ kernel wrote (no reduction)
  dV_j += int(P^T^ dO^_i) s_P s_dO               (dO^ read sequence-contiguous)
  dK_j += int(dS^T^ Q^_i) s_dS s_Q               (Q^ read sequence-contiguous)

Both kernels compute P with the same fp32 operations, so the dK/dV kernel's P stays within
ulps of the tile amax; its dS saturates at +-127 (_common.saturated_ds_to_int8), so that a
last-bit difference (tensor-core summation order of dP in the two orientations) cannot wrap
an INT8 value. No atomics: every
output element is written by one program in a fixed order, so reruns are bit-identical.
Extra memory: 4 fp32 per (q block, kv tile), N^2 / (block_q * block_kv) * 16 bytes per head.

TOKEN (the "token" contract) needs no tile scales, so the two kernels do not depend on each
other: both make dS = P (dP - delta) from dO as given and take it in bf16 into a 16-bit product,
dQ = bf16(dS) K16 (simulate.token_dq) and dK = bf16(dS^T) Q16 (simulate.token_dk), K16 and Q16 K and
Q as given in bf16, and dV takes P^T in FP8 e4m3 with a static scale (P <= 1: no maximum): no scale
is a maximum, and only S's recomputation reads s_Q and s_K (a row vector times a column vector).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..quant import P_E4M3_LOG2   # a host number here (the kernels' constexprs come from _common)
from ..validate import key_tile
from . import registry
from ._common import (DS_SPAN, LOG2E, P_E4M3_SCALE, empty_in_layout_of, int_to_float, interpreting,
                      program_tile, round_scaled_to_int8, saturated_ds_to_int8, tile_scales, to_16bit, to_e4m3,
                      to_k_order)
from .forward import smooth_q_bias
from .launch import Tuning, arch_for, launch, launch_settings, overrides
from .schedule import heads_per_section, tile_grid

# What one dK/dV launch computes (the PASS constexpr).
BOTH = tl.constexpr(0)
DV_ONLY = tl.constexpr(1)
DK_ONLY = tl.constexpr(2)


@triton.jit
def _dot16(a, b, DOT_F32: tl.constexpr, acc=None):
    """a b (+ acc, added by the tensor cores' chain, in the Gluon kernels' order) of 16-bit operands."""
    # Triton's interpreter computes bf16 dots wrongly (triton issue 11584): upcast there only.
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _max_pair(a0, b0, a1, b1):
    return tl.maximum(a0, a1), tl.maximum(b0, b1)


@triton.jit
def _dq_tiles(dq, q8, do, lse, delta, offs_m, lo, hi, q_scale,
              K8_bh, K8T_bh, SK_bh, V_bh, KF_bh, KMEAN_bh, MU_blk, TS_q, TS_step,
              stride_vn, stride_vd, stride_kfn, stride_kfd, qk_const, N,
              BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr,
              SMOOTH_Q: tl.constexpr, SMOOTH_K: tl.constexpr, DOT_F32: tl.constexpr, TOKEN: tl.constexpr):
    """q_scale: the q block's scale, or with TOKEN its rows' (a vector)."""
    offs_d = tl.arange(0, HEAD_DIM)
    slot = tl.arange(0, 4)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        j = start_n // BLOCK_N
        k8 = tl.load(K8_bh + offs_n[:, None] * HEAD_DIM + offs_d[None, :])
        if TOKEN:
            k_scale = tl.load(SK_bh + offs_n)
            s = (int_to_float(tl.dot(q8, tl.trans(k8), out_dtype=tl.int32)) * k_scale[None, :]
                 * (q_scale * qk_const)[:, None])
        else:
            k_scale = tl.load(SK_bh + j)
            s = int_to_float(tl.dot(q8, tl.trans(k8), out_dtype=tl.int32)) * ((q_scale * k_scale) * qk_const)
        if SMOOTH_Q:
            bias = smooth_q_bias(KF_bh, KMEAN_bh, MU_blk, offs_n, offs_d, stride_kfn, stride_kfd, SMOOTH_K)
            s += (bias * qk_const)[None, :]
        p = tl.math.exp2(s - lse[:, None])
        if MASKED:
            p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
        v = tl.load(V_bh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd)
        dp = _dot16(do, tl.trans(v), DOT_F32)
        ds = p * (dp - delta[:, None])
        if TOKEN:   # dQ = bf16(dS) K16, a 16-bit product (simulate.token_dq)
            kf = tl.load(KF_bh + offs_n[:, None] * stride_kfn + offs_d[None, :] * stride_kfd).to(tl.float32)
            dq += _dot16(to_16bit(ds, tl.bfloat16), to_16bit(kf, tl.bfloat16), DOT_F32)
        else:
            # Both tile maxima in one cross-warp reduction. P >= 0 orders like its bits as integers,
            # whose max takes two elements per instruction (VIMNMX3; FMNMX takes one).
            p_bits, ds_amax = tl.reduce((tl.max(p.to(tl.int32, bitcast=True), axis=1),
                                         tl.max(tl.abs(ds), axis=1)), 0, _max_pair)
            p_amax = p_bits.to(tl.float32, bitcast=True)
            p_scale, p_inv = tile_scales(p_amax, HEAD_DIM > 64)   # as dq_hopper's (bit-identical)
            ds_scale, ds_inv = tile_scales(ds_amax, HEAD_DIM > 64)
            tl.store(TS_q + j * TS_step + slot,
                     tl.where(slot == 0, p_scale, tl.where(slot == 1, p_inv, tl.where(slot == 2, ds_scale, ds_inv))))
            ds8 = to_k_order(round_scaled_to_int8(ds, ds_inv))   # own amax: in range; K^T in k order
            k8_cols = tl.trans(tl.load(K8T_bh + offs_d[:, None] * N + offs_n[None, :]))
            dq += int_to_float(tl.dot(ds8, k8_cols, out_dtype=tl.int32)) * (ds_scale * k_scale)
    return dq


@triton.jit
def _dq_kernel(Q8, SQ, K8, K8T, SK, V, DO, LSE2, DELTA, DQ, TILE_SCALES, MU, KF, KMEAN,
               stride_vb, stride_vh, stride_vn, stride_vd,
               stride_dob, stride_doh, stride_don, stride_dod,
               stride_kfb, stride_kfh, stride_kfn, stride_kfd,
               stride_gb, stride_gh, stride_gn,
               sm_scale, H, N, SECTION,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
               CAUSAL: tl.constexpr, SMOOTH_Q: tl.constexpr, SMOOTH_K: tl.constexpr,
               DOT_F32: tl.constexpr, TOKEN: tl.constexpr):
    """BLOCK_M = block_q, BLOCK_N = block_kv: each iteration is exactly one quantisation tile. TOKEN (BLOCK_N the
    forward's key tile, validate.key_tile): KF is the K of dQ = sm_scale bf16(dS) K16 (simulate.token_dq)."""
    # Causal: the last q blocks see the most keys; they run first (rank 0, schedule.py).
    rank, bh = program_tile(N // BLOCK_M, SECTION)
    pid_m = N // BLOCK_M - 1 - rank
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    seq_base = bh.to(tl.int64) * N * HEAD_DIM
    q8 = tl.load(Q8 + seq_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
    if TOKEN:
        q_scale = tl.load(SQ + bh * N + offs_m)
        SK_bh = SK + bh * N
    else:
        q_scale = tl.load(SQ + bh * (N // BLOCK_M) + pid_m)
        SK_bh = SK + bh * (N // BLOCK_N)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :] * stride_dod)
    lse = tl.load(LSE2 + bh * N + offs_m)
    delta = tl.load(DELTA + bh * N + offs_m)
    K8_bh = K8 + seq_base
    K8T_bh = K8T + seq_base
    V_bh = V + b * stride_vb + h * stride_vh
    KF_bh = KF + b * stride_kfb + h * stride_kfh
    KMEAN_bh = KMEAN + bh * HEAD_DIM
    MU_blk = MU + (bh * (N // BLOCK_M) + pid_m) * HEAD_DIM
    # kv-major (bh, kv tile, q block, 4): a dK/dV program reads its kv tile's scales contiguously
    TS_q = TILE_SCALES + bh.to(tl.int64) * (N // BLOCK_M) * (N // BLOCK_N) * 4 + pid_m * 4
    TS_step = (N // BLOCK_M) * 4   # from one kv tile's record to the next
    qk_const = sm_scale * LOG2E

    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if CAUSAL:
        diag_lo = (start_m + 1) // BLOCK_N * BLOCK_N
        diag_hi = tl.minimum(tl.cdiv(start_m + BLOCK_M, BLOCK_N) * BLOCK_N, N)
        dq = _dq_tiles(dq, q8, do, lse, delta, offs_m, 0, diag_lo, q_scale,
                       K8_bh, K8T_bh, SK_bh, V_bh, KF_bh, KMEAN_bh, MU_blk, TS_q, TS_step,
                       stride_vn, stride_vd, stride_kfn, stride_kfd, qk_const, N,
                       BLOCK_N, HEAD_DIM, False, SMOOTH_Q, SMOOTH_K, DOT_F32, TOKEN)
        dq = _dq_tiles(dq, q8, do, lse, delta, offs_m, diag_lo, diag_hi, q_scale,
                       K8_bh, K8T_bh, SK_bh, V_bh, KF_bh, KMEAN_bh, MU_blk, TS_q, TS_step,
                       stride_vn, stride_vd, stride_kfn, stride_kfd, qk_const, N,
                       BLOCK_N, HEAD_DIM, True, SMOOTH_Q, SMOOTH_K, DOT_F32, TOKEN)
    else:
        dq = _dq_tiles(dq, q8, do, lse, delta, offs_m, 0, N, q_scale,
                       K8_bh, K8T_bh, SK_bh, V_bh, KF_bh, KMEAN_bh, MU_blk, TS_q, TS_step,
                       stride_vn, stride_vd, stride_kfn, stride_kfd, qk_const, N,
                       BLOCK_N, HEAD_DIM, False, SMOOTH_Q, SMOOTH_K, DOT_F32, TOKEN)
    dq = dq * sm_scale
    tl.store(DQ + b * stride_gb + h * stride_gh + offs_m[:, None] * stride_gn + offs_d[None, :],
             to_16bit(dq, DQ.dtype.element_ty))   # rounded to nearest also under the interpreter


@triton.jit
def _dkdv_tiles(dk_a, dk_b, dv_a, dv_b, k8, v, ksm, k_scale, offs_n, lo, hi,
                Q8_bh, Q8T_bh, SQ_bh, DO_bh, DO8T_bh, SDO_bh, LSE2_bh, DELTA_bh, MU_bh, TS_cols,
                stride_don, stride_dod, stride_qfn, stride_qfd, qk_const, N,
                BLOCK_M: tl.constexpr, Q_BLOCK: tl.constexpr, KV_BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr,
                SPLIT_D: tl.constexpr, CHAIN: tl.constexpr, MASKED: tl.constexpr, SMOOTH_Q: tl.constexpr,
                DOT_F32: tl.constexpr, PASS: tl.constexpr, TOKEN: tl.constexpr):
    """Loop over the q blocks in [lo, hi), each in Q_BLOCK / BLOCK_M slices.

    PASS: BOTH computes dK and dV; DV_ONLY / DK_ONLY one of them (two launches that each
    recompute S and P, in exchange for half the accumulators: no spills at d=128).

    k_scale, TS_cols: per kv row (a program may hold several kv tiles, each with its own scales).
    An INT8 dot cannot accumulate into the fp32 dK/dV (each tile has its own scale): its int32
    result is converted and scaled, 3 ALU ops per accumulator element, which per score element
    is 2 * HEAD_DIM / BLOCK_M of them. Within one q block the scales are the same, so CHAIN
    accumulates the slices of a block in int32 on the tensor cores and converts once per block.
    SPLIT_D = 2 keeps dK, dV as column halves (_a, _b), so that the int32 temporary of a dot is
    half as large beside two 128 x 128 fp32 accumulators.

    TOKEN: k_scale and the q scales are per token; dV = P^T dO in FP8 e4m3 (256 P, no maximum;
    dO^ e4m3 per q block, one scale per block, so a slice is a whole q block: no CHAIN), accumulated in
    fp32 by the tensor cores; dK = bf16(dS^T) Q16, Q16 = Q as given (Q8T_bh, strides stride_qf*) in bf16.
    LSE2_bh is then LSE2 - log2(256): p_t is 256 P, dV's operand as it stands, and so 256 times every
    term of dK, which the caller's last scale takes back (exact: a power of two, bf16's rounding commutes with it).
    """
    tl.static_assert(not (TOKEN and (CHAIN or BLOCK_M != Q_BLOCK)), "TOKEN takes whole q blocks per slice")
    DH: tl.constexpr = HEAD_DIM // SPLIT_D
    # CHAIN: one iteration per q block, its slices unrolled; else one iteration per slice
    # (unrolling then only deepens the software pipeline's shared-memory stages).
    STEP: tl.constexpr = Q_BLOCK if CHAIN else BLOCK_M
    offs_d = tl.arange(0, HEAD_DIM)
    offs_h = tl.arange(0, DH)
    for start_i in range(lo, hi, STEP):
        i = start_i // Q_BLOCK            # the q quantisation block
        if TOKEN:
            s_do = tl.load(SDO_bh + i)
            dv_scale = s_do * (1.0 / P_E4M3_SCALE)   # exact: a power of two
            qk_scale = (k_scale * qk_const)[:, None]
        else:
            q_scale = tl.load(SQ_bh + i)
            ts = TS_cols + i * 4
            dv_scale = (tl.load(ts) * tl.load(SDO_bh + i))[:, None]
            p_inv = tl.load(ts + 1)[:, None]
            dk_scale = (tl.load(ts + 2) * q_scale)[:, None]
            ds_kq = (tl.load(ts + 3) * (1.0 / DS_SPAN))[:, None]   # see saturated_ds_to_int8
            qk_scale = ((q_scale * k_scale) * qk_const)[:, None]
        if SMOOTH_Q:   # S's bias (and the block contract's dK bias branch below)
            mu = tl.load(MU_bh + i * HEAD_DIM + offs_d)
            bias = (tl.sum(ksm * mu[None, :], axis=1) * qk_const)[:, None]
        if CHAIN:
            if PASS != DK_ONLY:
                dv_int = tl.zeros([dv_a.shape[0], HEAD_DIM], dtype=tl.int32)
            if PASS != DV_ONLY:
                dk_int = tl.zeros([dv_a.shape[0], HEAD_DIM], dtype=tl.int32)
        for sub in tl.static_range(STEP // BLOCK_M):
            offs_m = start_i + sub * BLOCK_M + tl.arange(0, BLOCK_M)
            q8 = tl.load(Q8_bh + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
            s_t = int_to_float(tl.dot(k8, tl.trans(q8), out_dtype=tl.int32)) * qk_scale
            if TOKEN:
                q_scale = tl.load(SQ_bh + offs_m)[None, :]
                s_t = s_t * q_scale
            if SMOOTH_Q:
                s_t += bias
            p_t = tl.math.exp2(s_t - tl.load(LSE2_bh + offs_m)[None, :])
            if MASKED:
                p_t = tl.where(offs_m[None, :] >= offs_n[:, None], p_t, 0.0)
            # No clamp: P here and in the dQ kernel is the same formula on the same operands (exact
            # integer dots), so it differs by a few ulps at most, far below the 0.4% above the
            # amax that would round past 127. dS saturates instead: dP's two orientations sum in
            # different orders, and where dP - delta cancels, that difference is all of dS.
            if PASS != DK_ONLY:
                if TOKEN:   # dV in FP8 e4m3: 256 P (P <= 1: no maximum) times dO^ (e4m3 per block)
                    p8_t = to_k_order(to_e4m3(p_t))   # p_t is 256 P (LSE2_bh: minus log2(256))
                    do8 = tl.trans(tl.load(DO8T_bh + offs_h[:, None] * N + offs_m[None, :]))
                    dv_a += tl.dot(p8_t, do8, out_dtype=tl.float32) * dv_scale
                    if SPLIT_D == 2:
                        do8 = tl.trans(tl.load(DO8T_bh + (DH + offs_h)[:, None] * N + offs_m[None, :]))
                        dv_b += tl.dot(p8_t, do8, out_dtype=tl.float32) * dv_scale
                elif CHAIN:
                    p8_t = to_k_order(round_scaled_to_int8(p_t, p_inv))
                    do8 = tl.trans(tl.load(DO8T_bh + offs_d[:, None] * N + offs_m[None, :]))
                    dv_int = tl.dot(p8_t, do8, dv_int, out_dtype=tl.int32)
                else:
                    p8_t = to_k_order(round_scaled_to_int8(p_t, p_inv))
                    do8 = tl.trans(tl.load(DO8T_bh + offs_h[:, None] * N + offs_m[None, :]))
                    dv_a += int_to_float(tl.dot(p8_t, do8, out_dtype=tl.int32)) * dv_scale
                    if SPLIT_D == 2:
                        do8 = tl.trans(tl.load(DO8T_bh + (DH + offs_h)[:, None] * N + offs_m[None, :]))
                        dv_b += int_to_float(tl.dot(p8_t, do8, out_dtype=tl.int32)) * dv_scale
            if PASS != DV_ONLY:
                do = tl.load(DO_bh + offs_m[:, None] * stride_don + offs_d[None, :] * stride_dod)
                dp_t = _dot16(v, tl.trans(do), DOT_F32)
                delta = tl.load(DELTA_bh + offs_m)[None, :]
                if TOKEN:   # dK = bf16(dS^T) Q16 (simulate.token_dk): a 16-bit product, no scale to find
                    ds16_t = to_16bit(p_t * (dp_t - delta), tl.bfloat16)   # 256 dS^T (p_t is 256 P^T)
                    q_rows = Q8T_bh + offs_m[:, None] * stride_qfn
                    q16 = to_16bit(tl.load(q_rows + offs_h[None, :] * stride_qfd).to(tl.float32), tl.bfloat16)
                    dk_a = _dot16(ds16_t, q16, DOT_F32, dk_a)   # chained: the Gluon dK/dV's order
                    if SPLIT_D == 2:
                        q16 = to_16bit(tl.load(q_rows + (DH + offs_h)[None, :] * stride_qfd).to(tl.float32),
                                       tl.bfloat16)
                        dk_b = _dot16(ds16_t, q16, DOT_F32, dk_b)
                else:
                    ds8_t = to_k_order(saturated_ds_to_int8(p_t, dp_t, delta * ds_kq, ds_kq))
                    if CHAIN:
                        q8_cols = tl.trans(tl.load(Q8T_bh + offs_d[:, None] * N + offs_m[None, :]))
                        dk_int = tl.dot(ds8_t, q8_cols, dk_int, out_dtype=tl.int32)
                    else:
                        q8_cols = tl.trans(tl.load(Q8T_bh + offs_h[:, None] * N + offs_m[None, :]))
                        dk_a += int_to_float(tl.dot(ds8_t, q8_cols, out_dtype=tl.int32)) * dk_scale
                        if SPLIT_D == 2:
                            q8_cols = tl.trans(tl.load(Q8T_bh + (DH + offs_h)[:, None] * N + offs_m[None, :]))
                            dk_b += int_to_float(tl.dot(ds8_t, q8_cols, out_dtype=tl.int32)) * dk_scale
                if SMOOTH_Q and not TOKEN:   # the bias branch colsum(dS_i)^T mu_i (TOKEN: Q16 holds mu_i)
                    ds_colsum = tl.sum(p_t * (dp_t - delta), axis=1)[:, None]
                    dk_a += ds_colsum * tl.load(MU_bh + i * HEAD_DIM + offs_h)[None, :]
                    if SPLIT_D == 2:
                        dk_b += ds_colsum * tl.load(MU_bh + i * HEAD_DIM + DH + offs_h)[None, :]
        if CHAIN:   # (SPLIT_D == 1) |sum| < 127^2 * Q_BLOCK < 2^24: exact in fp32
            if PASS != DK_ONLY:
                dv_a += int_to_float(dv_int) * dv_scale
            if PASS != DV_ONLY:
                dk_a += int_to_float(dk_int) * dk_scale
    return dk_a, dk_b, dv_a, dv_b


@triton.jit
def _dkdv_kernel(Q8, Q8T, SQ, K8, SK, V, DO, DO8T, SDO, LSE2, DELTA, TILE_SCALES, DK, DV, MU, KF, KMEAN,
                 stride_vb, stride_vh, stride_vn, stride_vd,
                 stride_dob, stride_doh, stride_don, stride_dod,
                 stride_kfb, stride_kfh, stride_kfn, stride_kfd,
                 stride_qfb, stride_qfh, stride_qfn, stride_qfd,
                 stride_gb, stride_gh, stride_gn,
                 sm_scale, H, N,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, Q_BLOCK: tl.constexpr, KV_BLOCK: tl.constexpr,
                 HEAD_DIM: tl.constexpr, SPLIT_D: tl.constexpr, CHAIN: tl.constexpr, CAUSAL: tl.constexpr,
                 SMOOTH_Q: tl.constexpr, SMOOTH_K: tl.constexpr, DOT_F32: tl.constexpr, PASS: tl.constexpr,
                 TOKEN: tl.constexpr):
    """BLOCK_N kv rows (BLOCK_N / KV_BLOCK kv tiles) per program; q in BLOCK_M slices (BLOCK_M | Q_BLOCK).
    PASS: which of dK, dV this launch computes (BOTH, DV_ONLY, DK_ONLY). Q8T: dK's Q operand, Q^T INT8 in k order
    (block), or Q as given on its strides stride_qf* (TOKEN)."""
    pid_n = tl.program_id(0)   # causal: kv block 0 sees the most queries and runs first
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    seq_base = bh.to(tl.int64) * N * HEAD_DIM
    k8 = tl.load(K8 + seq_base + offs_n[:, None] * HEAD_DIM + offs_d[None, :])
    v = tl.load(V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd)
    if TOKEN:
        k_scale = tl.load(SK + bh * N + offs_n)
        SQ_bh = SQ + bh * N
    else:
        k_scale = tl.load(SK + bh * (N // KV_BLOCK) + offs_n // KV_BLOCK)
        SQ_bh = SQ + bh * (N // Q_BLOCK)
    if SMOOTH_Q:
        ksm = tl.load(KF + b * stride_kfb + h * stride_kfh
                      + offs_n[:, None] * stride_kfn + offs_d[None, :] * stride_kfd).to(tl.float32)
        if SMOOTH_K:
            ksm -= tl.load(KMEAN + bh * HEAD_DIM + offs_d)[None, :]
    else:
        ksm = 0.0
    Q8_bh = Q8 + seq_base
    if TOKEN:
        Q8T_bh = Q8T + b * stride_qfb + h * stride_qfh
    else:
        Q8T_bh = Q8T + seq_base
    DO_bh = DO + b * stride_dob + h * stride_doh
    DO8T_bh = DO8T + seq_base
    SDO_bh = SDO + bh * (N // Q_BLOCK)
    LSE2_bh = LSE2 + bh * N
    DELTA_bh = DELTA + bh * N
    MU_bh = MU + bh * (N // Q_BLOCK) * HEAD_DIM
    # Tile scales of q block 0 for each kv row (kv-major: (bh, kv tile, q block, 4)); the loop adds the
    # q block's offset.
    TS_cols = (TILE_SCALES + bh.to(tl.int64) * (N // Q_BLOCK) * (N // KV_BLOCK) * 4
               + (offs_n // KV_BLOCK) * (N // Q_BLOCK) * 4)
    qk_const = sm_scale * LOG2E

    DH: tl.constexpr = HEAD_DIM // SPLIT_D
    dk_a = tl.zeros([BLOCK_N, DH], dtype=tl.float32)
    dv_a = tl.zeros([BLOCK_N, DH], dtype=tl.float32)
    dk_b = tl.zeros([BLOCK_N, DH], dtype=tl.float32)
    dv_b = tl.zeros([BLOCK_N, DH], dtype=tl.float32)
    if CAUSAL:
        # q blocks wholly above the diagonal see none of these keys: skipped. Blocks that
        # straddle it are masked; those wholly below need no mask.
        lo = start_n // Q_BLOCK * Q_BLOCK
        mask_hi = tl.minimum(tl.cdiv(start_n + BLOCK_N - 1, Q_BLOCK) * Q_BLOCK, N)
        dk_a, dk_b, dv_a, dv_b = _dkdv_tiles(
            dk_a, dk_b, dv_a, dv_b, k8, v, ksm, k_scale, offs_n, lo, mask_hi,
            Q8_bh, Q8T_bh, SQ_bh, DO_bh, DO8T_bh, SDO_bh, LSE2_bh, DELTA_bh, MU_bh, TS_cols,
            stride_don, stride_dod, stride_qfn, stride_qfd, qk_const, N,
            BLOCK_M, Q_BLOCK, KV_BLOCK, HEAD_DIM, SPLIT_D, CHAIN, True, SMOOTH_Q, DOT_F32, PASS, TOKEN)
        dk_a, dk_b, dv_a, dv_b = _dkdv_tiles(
            dk_a, dk_b, dv_a, dv_b, k8, v, ksm, k_scale, offs_n, mask_hi, N,
            Q8_bh, Q8T_bh, SQ_bh, DO_bh, DO8T_bh, SDO_bh, LSE2_bh, DELTA_bh, MU_bh, TS_cols,
            stride_don, stride_dod, stride_qfn, stride_qfd, qk_const, N,
            BLOCK_M, Q_BLOCK, KV_BLOCK, HEAD_DIM, SPLIT_D, CHAIN, False, SMOOTH_Q, DOT_F32, PASS, TOKEN)
    else:
        dk_a, dk_b, dv_a, dv_b = _dkdv_tiles(
            dk_a, dk_b, dv_a, dv_b, k8, v, ksm, k_scale, offs_n, 0, N,
            Q8_bh, Q8T_bh, SQ_bh, DO_bh, DO8T_bh, SDO_bh, LSE2_bh, DELTA_bh, MU_bh, TS_cols,
            stride_don, stride_dod, stride_qfn, stride_qfd, qk_const, N,
            BLOCK_M, Q_BLOCK, KV_BLOCK, HEAD_DIM, SPLIT_D, CHAIN, False, SMOOTH_Q, DOT_F32, PASS, TOKEN)
    offs_h = tl.arange(0, DH)
    out = b * stride_gb + h * stride_gh + offs_n[:, None] * stride_gn + offs_h[None, :]
    if TOKEN:   # dK's terms came from 256 P (see _dkdv_tiles): exact in a power of two
        dk_const = sm_scale * (1.0 / P_E4M3_SCALE)
    else:
        dk_const = sm_scale
    if PASS != DV_ONLY:
        tl.store(DK + out, (dk_a * dk_const).to(DK.dtype.element_ty))
        if SPLIT_D == 2:
            tl.store(DK + out + DH, (dk_b * dk_const).to(DK.dtype.element_ty))
    if PASS != DK_ONLY:
        tl.store(DV + out, dv_a.to(DV.dtype.element_ty))
        if SPLIT_D == 2:
            tl.store(DV + out + DH, dv_b.to(DV.dtype.element_ty))


def dkdv_blocks(n: int, block_q: int, block_kv: int, head_dim: int,
                token: bool = False, override: dict | None = None) -> tuple[int, int, int, bool, bool]:
    """(BLOCK_N kv rows per program, BLOCK_M q rows per slice, SPLIT_D, CHAIN, SEPARATE) of the
    dK/dV kernel; SEPARATE runs dV and dK as two launches (PASS = DV_ONLY, then DK_ONLY).
    `override`: a tool's choice of any of rows, cols, split_d, chain, separate (Tuning.overrides).

    Rows come in warpgroups of 64 (wgmma M = 64), so no dot runs twice. Best of the H200 sweeps
    (docs/kernel-notes.md): a whole q block (up to 128 rows) per loop step, so each INT8 dot
    result is converted once per block; d=64 on one warpgroup of 64 kv rows, two programs per
    SM; d=128 on two warpgroups of 128 kv rows, dV and dK as two launches. token: a slice is a
    whole q block (its row maxima run over the block).
    """
    override = override or {}
    # d=64: 64 kv rows on one warpgroup, two programs per SM (-2.4% bwd against 128 rows)
    rows = override.get("rows", 64 if head_dim <= 64 else 128)
    rows = rows if rows % block_kv == 0 and n % rows == 0 else block_kv
    # whole q blocks (at d=64: -3.5% bwd against 64-row slices chained in int32)
    cols = block_q if token else min(override.get("cols", 128), block_q)
    split = override.get("split_d", 2 if head_dim >= 128 and rows >= 128 else 1)
    # Slices of a larger q block share its scales: chain them in int32 on the tensor cores
    # (int32 accumulators beside the fp32 ones fit in registers only for head_dim 64).
    chain = bool(override.get("chain", head_dim <= 64 and cols < block_q)) and split == 1 and not token
    # d=128: dV and dK as two launches, each with half the accumulators: no spills (-11% bwd,
    # though S and P are computed twice); at d=64 the second S/P costs more (+7-16%)
    separate = bool(override.get("separate", head_dim >= 128 and rows >= 128 and not chain))
    split = 1 if separate and "split_d" not in override else split
    return rows, cols, split, chain, separate


def _stages(stage_bytes: int, most: int = 3) -> int:
    """Pipeline depth whose per-stage loads fit in ~160 KB of shared memory (H100/H200 have 227)."""
    return max(1, min(most, 160 * 1024 // stage_bytes))


def _dq_launch(block_q: int, block_kv: int, d: int) -> dict:
    # 8 warps for 128-row blocks; at d=64 capped to 128 registers (no spills) so that two
    # programs share an SM and overlap each other's barrier waits for the tile maxima.
    # A pipeline stage holds K^ in both layouts and V: 4 * block_kv * d bytes.
    launch = dict(num_warps=8 if block_q >= 128 else 4, num_stages=_stages(4 * block_kv * d))
    if block_q >= 128 and d <= 64 and block_kv <= 64:
        launch["maxnreg"] = 128
    return launch


@dataclass(frozen=True)
class BackwardCall:
    """One backward's operands and outputs, as every dQ and dK/dV kernel's host function takes them
    (registry.KERNELS: run(call, tuning)). tile_scales: (p_scale, p_inv, ds_scale, ds_inv) per tile,
    kv-major (a dK/dV program's are contiguous), which the dQ kernel writes and the dK/dV kernel reads.
    q8t: the block contract's Q^T (the token contract's dK takes q)."""
    do: torch.Tensor
    delta: torch.Tensor
    do8t: torch.Tensor
    s_do: torch.Tensor
    q8: torch.Tensor
    q8t: torch.Tensor
    s_q: torch.Tensor
    k8: torch.Tensor
    k8t: torch.Tensor
    s_k: torch.Tensor
    v: torch.Tensor
    lse2: torch.Tensor
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    tile_scales: torch.Tensor | None
    causal: bool
    smooth_k: bool
    mu_q: torch.Tensor | None
    k: torch.Tensor | None
    k_mean: torch.Tensor | None
    block_q: int
    block_kv: int
    token: bool      # the "token" contract: s_q, s_k per token, no tile scales
    q: torch.Tensor | None = None          # token: Q as given (any strides), dK's operand in bf16
    lse2_p: torch.Tensor | None = None     # token: lse2 - log2(256), which the dK/dV kernels read instead


def _triton_args(c: BackwardCall, q_strides: bool = False) -> tuple:
    """(arguments after the tensors every Triton backward kernel takes, flags): the Q-smoothing operands
    (placeholders without it), the strides (q_strides: also those of dK's Q operand, the dK/dV kernel's),
    sm_scale, H, N."""
    b, h, n, d = c.q8.shape
    smooth_q = c.mu_q is not None
    kf = c.k if (smooth_q or c.token) else c.v   # K: the Q-smoothing bias's, and the token contract's dQ operand
    mu = c.mu_q if smooth_q else c.s_q
    k_mean = c.k_mean if (smooth_q and c.smooth_k) else c.s_q
    q_op = (c.q.stride() if c.token else (0, 0, 0, 0)) if q_strides else ()   # block: Q^T, contiguous
    strides = (*c.v.stride(), *c.do.stride(), *kf.stride(), *q_op, *c.dq.stride()[:3])   # dk, dv: dq's
    flags = dict(HEAD_DIM=d, CAUSAL=c.causal, SMOOTH_Q=smooth_q, SMOOTH_K=c.smooth_k, DOT_F32=interpreting(),
                 TOKEN=c.token)
    return (mu, kf, k_mean, *strides, 1.0 / math.sqrt(d), h, n), flags


def run_dq(c: BackwardCall, tuning: Tuning | None = None) -> None:
    """The Triton dQ kernel (registry: dq "triton")."""
    b, h, n, d = c.q8.shape
    tail, flags = _triton_args(c)
    keys = key_tile("token" if c.token else "block", c.block_kv)   # one iteration: one key tile
    launch("dq", _dq_kernel, tile_grid(n // c.block_q, b * h),
        c.q8, c.s_q, c.k8, c.k8t, c.s_k, c.v, c.do, c.lse2, c.delta, c.dq,
        c.tile_scales, *tail,
        heads_per_section(c.causal, b * h, (c.k8, c.k8t, c.v)),
        BLOCK_M=c.block_q, BLOCK_N=keys, **flags,
        **launch_settings("dq", _dq_launch(c.block_q, keys, d), tuning), tuning=tuning)


def run_dkdv(c: BackwardCall, tuning: Tuning | None = None) -> None:
    """The Triton dK/dV kernel (registry: dkdv "triton"), at d=128 as two launches (dV, then dK). Token: Q itself
    in Q^T's place (dK = bf16(dS^T) Q16)."""
    b, h, n, d = c.q8.shape
    tail, flags = _triton_args(c, q_strides=True)
    rows, cols, split_d, chain, separate = dkdv_blocks(n, c.block_q, c.block_kv, d,
                                                       c.token, overrides(tuning).get("dkdv_blocks"))
    step = c.block_q if chain else cols
    # Per pass: (launch name, shared-memory bytes a pipeline stage loads for one loop step).
    # BOTH: Q^ in both layouts, dO^ and dO; DV_ONLY: Q^ and dO^; DK_ONLY: both Q^ and dO.
    passes = ((DV_ONLY, "dv", 2 * step * d), (DK_ONLY, "dk", 4 * step * d)) if separate else \
        ((BOTH, "dkdv", 5 * step * d),)
    for pass_, name, stage_bytes in passes:
        # 4-warp programs get 2 stages so that two fit in an SM's shared memory
        default = dict(num_warps=8 if rows >= 128 else 4,
                       num_stages=_stages(stage_bytes, 2 if (split_d == 2 or rows < 128) and not separate else 3))
        launch(name, _dkdv_kernel, (n // rows, b * h),
            c.q8, c.q if c.token else c.q8t, c.s_q, c.k8, c.s_k, c.v, c.do, c.do8t, c.s_do,
            c.lse2_p if c.token else c.lse2, c.delta, c.tile_scales, c.dk, c.dv,
            *tail, BLOCK_M=cols, BLOCK_N=rows, Q_BLOCK=c.block_q, KV_BLOCK=c.block_kv, SPLIT_D=split_d, CHAIN=chain,
            PASS=pass_.value, **flags,
            **launch_settings(name if name in overrides(tuning) else "dkdv", default, tuning), tuning=tuning)


def backward(do, delta, do8t, s_do, q8, q8t, s_q, k8, k8t, s_k, v, lse2, *, lse2_p=None, q=None, causal: bool,
             smooth_k: bool, mu_q=None, k=None, k_mean=None, block_q: int, block_kv: int, out_dtype=None,
             layout_of=None, kernels: str = "default", quant: str = "block", tuning: Tuning | None = None):
    """dQ, dK, dV (B,H,N,D) in out_dtype (default v's dtype), all three in layout_of's memory
    order (contiguous without it; _common.empty_in_layout_of). do, v (and the token contract's q, k) may have any
    strides; lse2 is the forward's LSE times log2(e) (backward_preprocess writes it, and with the token contract
    lse2_p = lse2 - log2(256); computed here if not given). quant: the contract ("token": s_q, s_k per token;
    q and k, the attention's Q and K, are dK's and dQ's 16-bit operands; q8t and k8t unused). The dQ and the dK/dV
    kernels are the registry's for this device, contract and `kernels` (one of them may compute all three)."""
    b, h, n, d = q8.shape
    if quant == "token":
        for name, t, product in (("k", k, "dQ = bf16(dS) K16"), ("q", q, "dK = bf16(dS^T) Q16")):
            if t is None or tuple(t.shape) != (b, h, n, d) or t.dtype not in (torch.float16, torch.bfloat16):
                got = "None" if t is None else f"{t.dtype} {tuple(t.shape)}"
                raise ValueError(f"the token contract's {product} is a bf16 product with the attention's own "
                                 f"{name.upper()}: pass {name}= (fp16 or bf16, {(b, h, n, d)}); got {got}")
    dq = empty_in_layout_of(q8 if layout_of is None else layout_of, out_dtype or v.dtype)
    dk = torch.empty_like(dq)
    dv = torch.empty_like(dq)
    arch = arch_for(q8.device, tuning)
    shape = dict(block_q=block_q, block_kv=block_kv, smooth_q=mu_q is not None, seq=n)
    dq_kernel, dkdv_kernel = (registry.resolve(arch, d, p, quant, kernels, causal=causal, **shape)
                              for p in ("dq", "dkdv"))
    one_kernel = (dq_kernel.run, dq_kernel.params) == (dkdv_kernel.run, dkdv_kernel.params)
    # Zeros: causal dK/dV slices may touch tiles wholly above the diagonal, which the dQ kernel
    # skips; zero scales make them contribute 0. The "token" contract has none (a placeholder).
    token = quant == "token"
    if token and lse2_p is None:
        lse2_p = lse2 - P_E4M3_LOG2
    tile_scales = None if one_kernel else s_q if token else torch.zeros(
        b * h, n // block_kv, n // block_q, 4, device=q8.device, dtype=torch.float32)
    call = BackwardCall(do, delta, do8t, s_do, q8, q8t, s_q, k8, k8t, s_k, v, lse2, dq, dk, dv, tile_scales, causal,
                        smooth_k, mu_q, k, k_mean, block_q, block_kv, token, q, lse2_p)
    if token and not one_kernel and SIDE_STREAM and q8.is_cuda:
        # nothing passes between the two kernels (no tile scales): the dQ kernel runs beside the dK/dV kernel, on a
        # side stream, launched second (docs/kernel-notes.md, "The two token backward kernels on two streams")
        main = torch.cuda.current_stream(q8.device)
        side = _side_stream(q8.device)
        side.wait_stream(main)
        registry.load(dkdv_kernel)(call, tuning)
        with torch.cuda.stream(side):
            registry.load(dq_kernel)(call, tuning)
        main.wait_stream(side)
        return dq, dk, dv
    registry.load(dq_kernel)(call, tuning)   # first: it writes the tile scales
    if not one_kernel:
        registry.load(dkdv_kernel)(call, tuning)
    return dq, dk, dv


# The token contract's two backward kernels on two streams (backward); False runs them one after the other.
SIDE_STREAM = True
_SIDE_STREAMS: dict = {}


def _side_stream(device) -> "torch.cuda.Stream":
    """One side stream per device, made once (a stream costs a driver call; CUDA-graph capture forks it from the
    capturing stream through the waits above)."""
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return _SIDE_STREAMS[index]
