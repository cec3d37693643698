"""Backward kernels (the paper's Algorithm 2): one for dK/dV, one for dQ.

Kernel tiles are the backward's quantisation tiles (block_q x block_kv), so each tile's P and
dS are quantised with one scale, exactly as the contract says. dQ gets its own kernel, which
recomputes S and dP, instead of float atomics: the gradients stay deterministic.

dK/dV program (one kv block j, looping over q blocks i), in the transposed orientation so
that the accumulators are rows of dK/dV:
  S^T = int(K^_j Q^_i^T) s_K s_Q sm_scale [+ bias];  P^T = exp(S^T - L_i)
  dV_j += int(P^T^ dO^_i) s_P s_dO              (dO^ read sequence-contiguous)
  dP^T = V_j dO_i^T (16-bit inputs, fp32 accumulate); dS^T = P^T (dP^T - delta_i)
  dK_j += int(dS^T^ Q^_i) s_dS s_Q               (Q^ read sequence-contiguous)
dQ program (one q block i, looping over kv blocks j):
  dQ_i += int(dS^ K^_j) s_dS s_K                 (K^ read sequence-contiguous)
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._common import LAUNCH_OVERRIDES, deterministic_default, LOG2E, int_to_float, interpreting, launch_settings, quantize_row_groups, quantize_tile, remember
from .forward import smooth_q_bias


@triton.jit
def _dot16(a, b, DOT_F32: tl.constexpr):
    # Triton's interpreter computes bf16 dots wrongly (triton issue 11584): upcast there only.
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _dkdv_tiles(dk, dv, k8, v, ksm, offs_n, lo, hi,
                Q8_bh, Q8T_bh, SQ_bh, DO_bh, DO8T_bh, SDO_bh, LSE_bh, DELTA_bh, MU_bh,
                stride_don, stride_dod, k_scale, bias_scale, N,
                DQ_bh, k8_cols, dq_scale,
                BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, KV_TILES: tl.constexpr, MASKED: tl.constexpr,
                SMOOTH_Q: tl.constexpr, DOT_F32: tl.constexpr, FUSED_DQ: tl.constexpr):
    # k_scale is per row (each row's kv block scale): a program may hold KV_TILES kv blocks.
    offs_d = tl.arange(0, HEAD_DIM)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        i = start_m // BLOCK_M
        q_scale = tl.load(SQ_bh + i)
        q8 = tl.load(Q8_bh + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
        s_t = int_to_float(tl.dot(k8, tl.trans(q8), out_dtype=tl.int32)) * (k_scale * q_scale)[:, None]
        if SMOOTH_Q:
            mu = tl.load(MU_bh + i * HEAD_DIM + offs_d)
            s_t += (tl.sum(ksm * mu[None, :], axis=1) * bias_scale)[:, None]
        lse = tl.load(LSE_bh + offs_m) * LOG2E
        p_t = tl.math.exp2(s_t - lse[None, :])
        if MASKED:
            p_t = tl.where(offs_m[None, :] >= offs_n[:, None], p_t, 0.0)
        p8_t, p_scale = quantize_row_groups(p_t, KV_TILES)
        do8 = tl.trans(tl.load(DO8T_bh + offs_d[:, None] * N + offs_m[None, :]))
        dv += int_to_float(tl.dot(p8_t, do8, out_dtype=tl.int32)) * (p_scale * tl.load(SDO_bh + i))[:, None]
        do = tl.load(DO_bh + offs_m[:, None] * stride_don + offs_d[None, :] * stride_dod)
        dp_t = _dot16(v, tl.trans(do), DOT_F32)
        ds_t = p_t * (dp_t - tl.load(DELTA_bh + offs_m)[None, :])
        q8_cols = tl.trans(tl.load(Q8T_bh + offs_d[:, None] * N + offs_m[None, :]))
        if FUSED_DQ:   # KV_TILES == 1: one scale per tile; dQ_i += int(dS^ K^_j) s_dS s_K sm_scale, atomically
            ds8_t, ds_s = quantize_tile(ds_t)
            dk += int_to_float(tl.dot(ds8_t, q8_cols, out_dtype=tl.int32)) * (ds_s * q_scale)
            dq_i = int_to_float(tl.dot(tl.trans(ds8_t), k8_cols, out_dtype=tl.int32)) * (ds_s * dq_scale)
            tl.atomic_add(DQ_bh + offs_m[:, None] * HEAD_DIM + offs_d[None, :], dq_i, sem="relaxed")
        else:
            ds8_t, ds_scale = quantize_row_groups(ds_t, KV_TILES)
            dk += int_to_float(tl.dot(ds8_t, q8_cols, out_dtype=tl.int32)) * (ds_scale * q_scale)[:, None]
        if SMOOTH_Q:   # the bias branch: colsum(dS_i)^T mu_i, from the unquantised dS
            dk += tl.sum(ds_t, axis=1)[:, None] * mu[None, :]
    return dk, dv


@triton.jit
def _dkdv_kernel(Q8, Q8T, SQ, K8, SK, V, DO, DO8T, SDO, LSE, DELTA, DK, DV, MU, KF, KMEAN, K8T, DQ,
                 stride_vb, stride_vh, stride_vn, stride_vd,
                 stride_dob, stride_doh, stride_don, stride_dod,
                 stride_kfb, stride_kfh, stride_kfn, stride_kfd,
                 sm_scale, H, N,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KV_BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr,
                 CAUSAL: tl.constexpr, SMOOTH_Q: tl.constexpr, SMOOTH_K: tl.constexpr,
                 DOT_F32: tl.constexpr, FUSED_DQ: tl.constexpr):
    """BLOCK_N kv rows per program: BLOCK_N // KV_BLOCK quantisation blocks, each with its own scales.

    FUSED_DQ (BLOCK_N == KV_BLOCK only): also add each tile's dQ contribution to the fp32 DQ
    buffer with atomics (FlashAttention-2's scheme): no dQ kernel, but the sum order varies.
    """
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    seq_base = bh.to(tl.int64) * N * HEAD_DIM
    k8 = tl.load(K8 + seq_base + offs_n[:, None] * HEAD_DIM + offs_d[None, :])
    v = tl.load(V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd)
    k_scale = tl.load(SK + bh * (N // KV_BLOCK) + offs_n // KV_BLOCK) * (sm_scale * LOG2E)
    if SMOOTH_Q:
        ksm = tl.load(KF + b * stride_kfb + h * stride_kfh
                      + offs_n[:, None] * stride_kfn + offs_d[None, :] * stride_kfd).to(tl.float32)
        if SMOOTH_K:
            ksm -= tl.load(KMEAN + bh * HEAD_DIM + offs_d)[None, :]
    else:
        ksm = 0.0
    Q8_bh = Q8 + seq_base
    Q8T_bh = Q8T + seq_base
    SQ_bh = SQ + bh * (N // BLOCK_M)
    DO_bh = DO + b * stride_dob + h * stride_doh
    DO8T_bh = DO8T + seq_base
    SDO_bh = SDO + bh * (N // BLOCK_M)
    LSE_bh = LSE + bh * N
    DELTA_bh = DELTA + bh * N
    MU_bh = MU + bh * (N // BLOCK_M) * HEAD_DIM
    bias_scale = sm_scale * LOG2E
    DQ_bh = DQ + seq_base
    if FUSED_DQ:
        k8_cols = tl.trans(tl.load(K8T + seq_base + offs_d[:, None] * N + offs_n[None, :]))
        dq_scale = tl.load(SK + bh * (N // KV_BLOCK) + pid_n) * sm_scale
    else:
        k8_cols = 0
        dq_scale = 0.0

    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    if CAUSAL:
        # q blocks wholly above the diagonal see none of these keys: skipped. Blocks that
        # straddle it are masked; those wholly below need no mask.
        lo = start_n // BLOCK_M * BLOCK_M
        mask_hi = tl.minimum(tl.cdiv(start_n + BLOCK_N - 1, BLOCK_M) * BLOCK_M, N)
        dk, dv = _dkdv_tiles(dk, dv, k8, v, ksm, offs_n, lo, mask_hi,
                             Q8_bh, Q8T_bh, SQ_bh, DO_bh, DO8T_bh, SDO_bh, LSE_bh, DELTA_bh, MU_bh,
                             stride_don, stride_dod, k_scale, bias_scale, N, DQ_bh, k8_cols, dq_scale,
                             BLOCK_M, HEAD_DIM, BLOCK_N // KV_BLOCK, True, SMOOTH_Q, DOT_F32, FUSED_DQ)
        dk, dv = _dkdv_tiles(dk, dv, k8, v, ksm, offs_n, mask_hi, N,
                             Q8_bh, Q8T_bh, SQ_bh, DO_bh, DO8T_bh, SDO_bh, LSE_bh, DELTA_bh, MU_bh,
                             stride_don, stride_dod, k_scale, bias_scale, N, DQ_bh, k8_cols, dq_scale,
                             BLOCK_M, HEAD_DIM, BLOCK_N // KV_BLOCK, False, SMOOTH_Q, DOT_F32, FUSED_DQ)
    else:
        dk, dv = _dkdv_tiles(dk, dv, k8, v, ksm, offs_n, 0, N,
                             Q8_bh, Q8T_bh, SQ_bh, DO_bh, DO8T_bh, SDO_bh, LSE_bh, DELTA_bh, MU_bh,
                             stride_don, stride_dod, k_scale, bias_scale, N, DQ_bh, k8_cols, dq_scale,
                             BLOCK_M, HEAD_DIM, BLOCK_N // KV_BLOCK, False, SMOOTH_Q, DOT_F32, FUSED_DQ)
    out = seq_base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, (dk * sm_scale).to(DK.dtype.element_ty))
    tl.store(DV + out, dv.to(DV.dtype.element_ty))


@triton.jit
def _dq_tiles(dq, q8, do, lse, delta, offs_m, lo, hi,
              K8_bh, K8T_bh, SK_bh, V_bh, KF_bh, KMEAN_bh, MU_blk,
              stride_vn, stride_vd, stride_kfn, stride_kfd, q_scale, bias_scale, N,
              BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr,
              SMOOTH_Q: tl.constexpr, SMOOTH_K: tl.constexpr, DOT_F32: tl.constexpr):
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        j = start_n // BLOCK_N
        k_scale = tl.load(SK_bh + j)
        k8 = tl.load(K8_bh + offs_n[:, None] * HEAD_DIM + offs_d[None, :])
        s = int_to_float(tl.dot(q8, tl.trans(k8), out_dtype=tl.int32)) * (q_scale * k_scale)
        if SMOOTH_Q:
            bias = smooth_q_bias(KF_bh, KMEAN_bh, MU_blk, offs_n, offs_d, stride_kfn, stride_kfd, SMOOTH_K)
            s += (bias * bias_scale)[None, :]
        p = tl.math.exp2(s - lse[:, None])
        if MASKED:
            p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
        v = tl.load(V_bh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd)
        dp = _dot16(do, tl.trans(v), DOT_F32)
        ds = p * (dp - delta[:, None])
        ds8, ds_scale = quantize_tile(ds)
        k8_cols = tl.trans(tl.load(K8T_bh + offs_d[:, None] * N + offs_n[None, :]))
        dq += int_to_float(tl.dot(ds8, k8_cols, out_dtype=tl.int32)) * (ds_scale * k_scale)
    return dq


@triton.jit
def _dq_kernel(Q8, SQ, K8, K8T, SK, V, DO, LSE, DELTA, DQ, MU, KF, KMEAN,
               stride_vb, stride_vh, stride_vn, stride_vd,
               stride_dob, stride_doh, stride_don, stride_dod,
               stride_kfb, stride_kfh, stride_kfn, stride_kfd,
               sm_scale, H, N,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
               CAUSAL: tl.constexpr, SMOOTH_Q: tl.constexpr, SMOOTH_K: tl.constexpr,
               DOT_F32: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    seq_base = bh.to(tl.int64) * N * HEAD_DIM
    q8 = tl.load(Q8 + seq_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
    q_scale = tl.load(SQ + bh * (N // BLOCK_M) + pid_m) * (sm_scale * LOG2E)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :] * stride_dod)
    lse = tl.load(LSE + bh * N + offs_m) * LOG2E
    delta = tl.load(DELTA + bh * N + offs_m)
    K8_bh = K8 + seq_base
    K8T_bh = K8T + seq_base
    SK_bh = SK + bh * (N // BLOCK_N)
    V_bh = V + b * stride_vb + h * stride_vh
    KF_bh = KF + b * stride_kfb + h * stride_kfh
    KMEAN_bh = KMEAN + bh * HEAD_DIM
    MU_blk = MU + (bh * (N // BLOCK_M) + pid_m) * HEAD_DIM
    bias_scale = sm_scale * LOG2E

    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if CAUSAL:
        diag_lo = (start_m + 1) // BLOCK_N * BLOCK_N
        diag_hi = tl.minimum(tl.cdiv(start_m + BLOCK_M, BLOCK_N) * BLOCK_N, N)
        dq = _dq_tiles(dq, q8, do, lse, delta, offs_m, 0, diag_lo,
                       K8_bh, K8T_bh, SK_bh, V_bh, KF_bh, KMEAN_bh, MU_blk,
                       stride_vn, stride_vd, stride_kfn, stride_kfd, q_scale, bias_scale, N,
                       BLOCK_N, HEAD_DIM, False, SMOOTH_Q, SMOOTH_K, DOT_F32)
        dq = _dq_tiles(dq, q8, do, lse, delta, offs_m, diag_lo, diag_hi,
                       K8_bh, K8T_bh, SK_bh, V_bh, KF_bh, KMEAN_bh, MU_blk,
                       stride_vn, stride_vd, stride_kfn, stride_kfd, q_scale, bias_scale, N,
                       BLOCK_N, HEAD_DIM, True, SMOOTH_Q, SMOOTH_K, DOT_F32)
    else:
        dq = _dq_tiles(dq, q8, do, lse, delta, offs_m, 0, N,
                       K8_bh, K8T_bh, SK_bh, V_bh, KF_bh, KMEAN_bh, MU_blk,
                       stride_vn, stride_vd, stride_kfn, stride_kfd, q_scale, bias_scale, N,
                       BLOCK_N, HEAD_DIM, False, SMOOTH_Q, SMOOTH_K, DOT_F32)
    tl.store(DQ + seq_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], (dq * sm_scale).to(DQ.dtype.element_ty))


def _launch_settings(name: str, rows: int, head_dim: int, stage_bytes: int) -> dict:
    # Best of the sweep on an H200 (docs/kernel-notes.md): 8 warps only for d=128 with 128 rows;
    # pipeline depth as the loop's per-stage tiles fit in ~160 KB of shared memory.
    warps = 8 if head_dim >= 128 or rows * head_dim >= 128 * 128 else 4
    stages = max(1, min(2 if name.startswith("dkdv") else 3, 160 * 1024 // stage_bytes))
    return launch_settings(name, dict(num_warps=warps, num_stages=stages))


def backward(do, delta, do8t, s_do, q8, q8t, s_q, k8, k8t, s_k, v, lse, *, causal: bool,
             smooth_k: bool, mu_q=None, k=None, k_mean=None, block_q: int, block_kv: int, out_dtype=None,
             deterministic: bool | None = None):
    """dQ, dK, dV (B,H,N,D) in out_dtype (default v's dtype). do and v may have any strides.

    deterministic (default: the SAGEBWD_DETERMINISTIC environment variable, "1" unless set to
    "0"): True runs the separate dQ kernel (bit-identical reruns); False adds dQ with fp32
    atomics from the dK/dV kernel (no recompute of S, exp and dP; the summation order, hence
    the last bits of dQ, vary from run to run).
    """
    b, h, n, d = q8.shape
    deterministic = deterministic_default() if deterministic is None else deterministic
    dk = torch.empty(b, h, n, d, device=q8.device, dtype=out_dtype or v.dtype)
    dv = torch.empty_like(dk)
    smooth_q = mu_q is not None
    kf = k if smooth_q else v
    mu = mu_q if smooth_q else s_q
    k_mean = k_mean if (smooth_q and smooth_k) else s_q
    sm_scale = 1.0 / math.sqrt(d)
    flags = dict(HEAD_DIM=d, CAUSAL=causal, SMOOTH_Q=smooth_q, SMOOTH_K=smooth_k, DOT_F32=interpreting())
    # kv blocks per dK/dV program (each keeps its own P/dS scales); 1 unless the sweep overrides.
    kv_tiles = LAUNCH_OVERRIDES.get("dkdv_kv_tiles", 1)
    kv_tiles = kv_tiles if n % (kv_tiles * block_kv) == 0 and kv_tiles * block_kv <= 256 else 1
    if not deterministic:
        kv_tiles = 1
        dq_acc = torch.zeros(b, h, n, d, device=q8.device, dtype=torch.float32)
    else:
        dq = torch.empty_like(dk)
        dq_acc = dq
    rows = kv_tiles * block_kv
    remember("dkdv" if deterministic else "dkdv_fused_dq", _dkdv_kernel[(n // rows, b * h)](
        q8, q8t, s_q, k8, s_k, v, do, do8t, s_do, lse, delta, dk, dv, mu, kf, k_mean, k8t, dq_acc,
        *v.stride(), *do.stride(), *kf.stride(), sm_scale, h, n,
        BLOCK_M=block_q, BLOCK_N=rows, KV_BLOCK=block_kv, FUSED_DQ=not deterministic, **flags,
        **_launch_settings("dkdv" if deterministic else "dkdv_fused_dq", rows, d, (5 if deterministic else 7) * block_q * d)))
    if not deterministic:
        return dq_acc.to(dk.dtype), dk, dv
    remember("dq", _dq_kernel[(n // block_q, b * h)](
        q8, s_q, k8, k8t, s_k, v, do, lse, delta, dq, mu, kf, k_mean,
        *v.stride(), *do.stride(), *kf.stride(), sm_scale, h, n,
        BLOCK_M=block_q, BLOCK_N=block_kv, **flags, **_launch_settings("dq", block_q, d, 4 * block_kv * d)))
    return dq, dk, dv
