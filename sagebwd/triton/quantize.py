"""Fused quantise step (smoothing + per-block INT8 + scales) and the backward preprocess.

Layouts written (all contiguous, int8 unless said):
  rows  (B, H, N, D): the operand of matmuls that reduce over D (S = Q K^T).
  cols  (B, H, D, N): a sequence-contiguous copy for matmuls that reduce over the sequence
        (P V, P^T dO, dS K, dS^T Q). Hopper's INT8 wgmma takes both operands K-major
        (contiguous along the reduction); any other layout costs a transpose per tile.
        Its sequence positions are in k order within each 16 (_common.to_k_order), so that the
        kernels hand P^ and dS^ from the accumulator to the dot without lane shuffles.
  scale (B, H, N / block) fp32, one per block of rows; with TOKEN (the "token" contract's Q and
        K) (B, H, N), one per row.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from triton.language.extra.cuda import gdc_launch_dependents

from ._common import (E4M3_MAX, INTERPRETING, LOG2E, MIN_AMAX, P_E4M3_LOG2, block_scales, interpreting,
                      mul_rn, quantize_tile, quantize_token_rows, round_to_int8, to_e4m3, to_k_order)
from ..validate import key_tile
from .launch import Tuning, launch, launch_settings


@triton.jit
def _quantize_tile(X, MEAN, ROWS, COLS, SCALE, BLOCK_MEAN, stride_b, stride_h, stride_n, stride_d, H, N, tile, bh,
                   TILE: tl.constexpr, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, SUBTRACT_MEAN: tl.constexpr,
                   SMOOTH_BLOCK: tl.constexpr, WRITE_ROWS: tl.constexpr, WRITE_COLS: tl.constexpr,
                   TOKEN: tl.constexpr = False, MEAN_FROM_L2: tl.constexpr = False):
    """Quantise rows tile*TILE .. of X[b, h] (after optional smoothing): TILE / BLOCK blocks, each
    with its own scale (one launch can then quantise tensors of different blocks in tiles of one
    size: quantize_qkv), or with TOKEN one scale per row. MEAN_FROM_L2: MEAN was written by another
    program of this launch, so it is read past the SM's L1 (which is not coherent)."""
    S: tl.constexpr = TILE // BLOCK
    offs_n = tile * TILE + tl.arange(0, TILE)
    offs_d = tl.arange(0, HEAD_DIM)
    base = X + (bh // H).to(tl.int64) * stride_b + (bh % H).to(tl.int64) * stride_h
    x = tl.load(base + offs_n[:, None] * stride_n + offs_d[None, :] * stride_d).to(tl.float32)
    if SUBTRACT_MEAN:   # K-smoothing: K - mean over the whole sequence
        if MEAN_FROM_L2:
            x -= tl.load(MEAN + bh * HEAD_DIM + offs_d, cache_modifier=".cg")[None, :]
        else:
            x -= tl.load(MEAN + bh * HEAD_DIM + offs_d)[None, :]
    if SMOOTH_BLOCK:    # Q-smoothing: Q_i - mean of block i; the mean is kept for the bias terms
        tl.static_assert(S == 1, "Q-smoothing takes one block per tile")
        mu = tl.sum(x, axis=0) * (1.0 / BLOCK)   # BLOCK is a power of two: exact division
        tl.store(BLOCK_MEAN + (bh * (N // BLOCK) + tile) * HEAD_DIM + offs_d, mu)
        x -= mu[None, :]
    if TOKEN:
        x8, scale = quantize_token_rows(x)
        tl.store(SCALE + bh * N + offs_n, scale)
    else:
        x3 = tl.reshape(x, [S, BLOCK, HEAD_DIM])
        amax = tl.max(tl.max(tl.abs(x3), axis=2), axis=1)
        scale, inv = block_scales(amax)
        x8 = tl.reshape(round_to_int8(mul_rn(x3, inv[:, None, None])), [TILE, HEAD_DIM])
        tl.store(SCALE + bh * (N // BLOCK) + tile * S + tl.arange(0, S), scale)
    out = bh.to(tl.int64) * N * HEAD_DIM
    if WRITE_ROWS:
        tl.store(ROWS + out + offs_n[:, None] * HEAD_DIM + offs_d[None, :], x8)
    if WRITE_COLS:   # the block contract's dK operand (the token contract's is Q itself in bf16)
        tl.static_assert(not TOKEN, "the token contract writes no INT8 copy in k order")
        tl.store(COLS + out + offs_d[:, None] * N + offs_n[None, :], to_k_order(tl.trans(x8)))


@triton.jit
def _quantize_blocks_kernel(X, MEAN, ROWS, COLS, SCALE, BLOCK_MEAN,
                            stride_b, stride_h, stride_n, stride_d, H, N,
                            BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr,
                            SUBTRACT_MEAN: tl.constexpr, SMOOTH_BLOCK: tl.constexpr,
                            WRITE_ROWS: tl.constexpr, WRITE_COLS: tl.constexpr, TOKEN: tl.constexpr):
    _quantize_tile(X, MEAN, ROWS, COLS, SCALE, BLOCK_MEAN, stride_b, stride_h, stride_n, stride_d, H, N,
                   tl.program_id(0), tl.program_id(1), BLOCK, BLOCK, HEAD_DIM, SUBTRACT_MEAN, SMOOTH_BLOCK,
                   WRITE_ROWS, WRITE_COLS, TOKEN)


@triton.jit
def _mean_chunk(X, PARTIAL, ARRIVED, MEAN, stride_b, stride_h, stride_n, stride_d, H, N, bh, c, chunks,
                ROWS: tl.constexpr, STEP: tl.constexpr, CHUNKS_P2: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Chunk c of head bh's sequence mean: sums rows c*ROWS.. of X[b, h] into PARTIAL[bh, c] (fp32, STEP rows
    at a time); the head's last chunk to arrive (ARRIVED[bh], zeroed by the caller) adds the partial sums in
    chunk order, whichever chunk it is, and writes their mean: the same bits whatever the order. Returns
    whether this chunk was the last."""
    offs_d = tl.arange(0, HEAD_DIM)
    base = X + (bh // H).to(tl.int64) * stride_b + (bh % H).to(tl.int64) * stride_h
    total = tl.zeros([HEAD_DIM], tl.float32)
    for step in tl.static_range(ROWS // STEP):
        offs_n = c * ROWS + step * STEP + tl.arange(0, STEP)
        x = tl.load(base + offs_n[:, None] * stride_n + offs_d[None, :] * stride_d, mask=(offs_n < N)[:, None],
                    other=0.0)
        total += tl.sum(x.to(tl.float32), axis=0)
    tl.store(PARTIAL + (bh * chunks + c) * HEAD_DIM + offs_d, total)
    tl.debug_barrier()   # every thread's partial is stored before the (releasing) arrive
    last = tl.atomic_add(ARRIVED + bh, 1, sem="acq_rel") == chunks - 1
    if last:
        tl.debug_barrier()
        offs_c = tl.arange(0, CHUNKS_P2)
        partial = tl.load(PARTIAL + (bh * chunks + offs_c[:, None]) * HEAD_DIM + offs_d[None, :],
                          mask=(offs_c < chunks)[:, None], other=0.0, cache_modifier=".cg")
        tl.store(MEAN + bh * HEAD_DIM + offs_d, tl.sum(partial, axis=0) / N)
    return last


@triton.jit
def _sequence_mean_kernel(X, PARTIAL, ARRIVED, MEAN, stride_b, stride_h, stride_n, stride_d, H, N,
                          ROWS: tl.constexpr, STEP: tl.constexpr, CHUNKS_P2: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Program (bh, c) is chunk c of head bh's mean (_mean_chunk): deterministic, in one launch."""
    _mean_chunk(X, PARTIAL, ARRIVED, MEAN, stride_b, stride_h, stride_n, stride_d, H, N,
                tl.program_id(0),   # heads on the grid's first axis, which has no 65535 limit
                tl.program_id(1), tl.num_programs(1), ROWS, STEP, CHUNKS_P2, HEAD_DIM)


@triton.jit
def _q_tile(Q, Q_ROWS, Q_COLS, SQ, MU_Q, stride_qb, stride_qh, stride_qn, stride_qd, H, N, tile, bh,
            TILE: tl.constexpr, BLOCK_Q: tl.constexpr, HEAD_DIM: tl.constexpr, SMOOTH_Q: tl.constexpr,
            COLS: tl.constexpr, TOKEN: tl.constexpr):
    """Q^ of one tile in rows (and cols for the backward); Q-smoothing's block mean needs TILE == BLOCK_Q."""
    _quantize_tile(Q, SQ, Q_ROWS, Q_COLS, SQ, MU_Q, stride_qb, stride_qh, stride_qn, stride_qd, H, N,
                   tile, bh, TILE, BLOCK_Q, HEAD_DIM, False, SMOOTH_Q, True, COLS, TOKEN)


@triton.jit
def _k_tile(K, K_MEAN, K_ROWS, K_COLS, SK, stride_kb, stride_kh, stride_kn, stride_kd, H, N, tile, bh,
            TILE: tl.constexpr, BLOCK_KV: tl.constexpr, HEAD_DIM: tl.constexpr, SMOOTH_K: tl.constexpr,
            COLS: tl.constexpr, TOKEN: tl.constexpr, MEAN_FROM_L2: tl.constexpr = False):
    """K^ of one tile in rows (and cols), after K-smoothing."""
    _quantize_tile(K, K_MEAN, K_ROWS, K_COLS, SK, SK, stride_kb, stride_kh, stride_kn, stride_kd, H, N,
                   tile, bh, TILE, BLOCK_KV, HEAD_DIM, SMOOTH_K, False, True, COLS, TOKEN, MEAN_FROM_L2)


@triton.jit
def _v_tile(V, V_COLS, SV, stride_vb, stride_vh, stride_vn, stride_vd, H, N, tile, bh,
            TILE: tl.constexpr, BLOCK_V: tl.constexpr, HEAD_DIM: tl.constexpr):
    """V^ of one tile in cols only, per BLOCK_V rows (the forward's kv tile)."""
    _quantize_tile(V, SV, SV, V_COLS, SV, SV, stride_vb, stride_vh, stride_vn, stride_vd, H, N,
                   tile, bh, TILE, BLOCK_V, HEAD_DIM, False, False, False, True)


@triton.jit
def _quantize_qkv_kernel(Q, K, V, K_MEAN, Q_ROWS, Q_COLS, SQ, MU_Q, K_ROWS, K_COLS, SK, V_COLS, SV,
                         stride_qb, stride_qh, stride_qn, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
                         stride_vb, stride_vh, stride_vn, stride_vd, H, N,
                         TILE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr, BLOCK_V: tl.constexpr,
                         HEAD_DIM: tl.constexpr, SMOOTH_K: tl.constexpr, SMOOTH_Q: tl.constexpr, COLS: tl.constexpr,
                         TOKEN: tl.constexpr, SKIP_Q: tl.constexpr = False, PDL: tl.constexpr = False):
    """The forward's three quantisations in one launch (program_id(2): Q, K, V), every program a
    tile of TILE rows: Q^ in rows (and cols for the backward), K^ likewise after K-smoothing, V^
    in cols only, per BLOCK_V rows (the forward's kv tile). COLS: Q^T and K^T too (writes_cols: never with
    TOKEN). TOKEN: Q and K with one scale per token.
    SKIP_Q: K and V only (program_id(2): K, V), where the token forward quantises Q itself. PDL: the forward,
    launched as a programmatic dependent, may start once every program has started."""
    if PDL and not INTERPRETING:
        gdc_launch_dependents()
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    which = tl.program_id(2)
    if SKIP_Q:
        k_program = which == 0
    else:
        k_program = which == 1
    if not SKIP_Q and which == 0:
        _q_tile(Q, Q_ROWS, Q_COLS, SQ, MU_Q, stride_qb, stride_qh, stride_qn, stride_qd, H, N, tile, bh,
                TILE, BLOCK_Q, HEAD_DIM, SMOOTH_Q, COLS, TOKEN)
    elif k_program:
        _k_tile(K, K_MEAN, K_ROWS, K_COLS, SK, stride_kb, stride_kh, stride_kn, stride_kd, H, N, tile, bh,
                TILE, BLOCK_KV, HEAD_DIM, SMOOTH_K, COLS, TOKEN)
    else:
        _v_tile(V, V_COLS, SV, stride_vb, stride_vh, stride_vn, stride_vd, H, N, tile, bh, TILE, BLOCK_V, HEAD_DIM)


@triton.jit
def _quantize_qkv_mean_kernel(Q, K, V, K_MEAN, Q_ROWS, Q_COLS, SQ, MU_Q, K_ROWS, K_COLS, SK, V_COLS, SV, PARTIAL,
                              COUNTERS, stride_qb, stride_qh, stride_qn, stride_qd, stride_kb, stride_kh, stride_kn,
                              stride_kd, stride_vb, stride_vh, stride_vn, stride_vd, H, N, BH, CHUNKS, LAG,
                              TILE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr,
                              BLOCK_V: tl.constexpr, HEAD_DIM: tl.constexpr, SMOOTH_Q: tl.constexpr,
                              COLS: tl.constexpr, TOKEN: tl.constexpr, SKIP_Q: tl.constexpr,
                              MEAN_ROWS: tl.constexpr, MEAN_STEP: tl.constexpr, CHUNKS_P2: tl.constexpr,
                              PDL: tl.constexpr = False):
    """_quantize_qkv_kernel with K-smoothing's mean (_mean_chunk) in the same launch (PDL as there).

    Every program takes a ticket (an atomic counter, COUNTERS[0]): tickets are handed out in the order programs
    start, so a program that waits only for lower tickets waits for programs that are running or done. Work
    goes in rounds of one head r: its mean's CHUNKS chunks, its Q and V tiles, then the K tiles of head r - LAG,
    which wait until that head's mean is written (the flag COUNTERS[1 + BH + bh], set by its last chunk;
    COUNTERS[1 + bh] counts its arrived chunks). The chunks wait for nothing, so no wait can deadlock, however
    many programs the GPU holds at once. LAG rounds of other work spare most K tiles the wait (and may find K
    still in L2 from its chunks' reads). The last LAG rounds hold K tiles only (their other programs exit)."""
    if PDL and not INTERPRETING:
        gdc_launch_dependents()
    ticket = tl.atomic_add(COUNTERS, 1, sem="relaxed")
    tiles = N // TILE
    if SKIP_Q:
        qv = tiles
    else:
        qv = 2 * tiles
    per_round = CHUNKS + qv + tiles
    r = ticket // per_round
    slot = ticket - r * per_round
    if slot < CHUNKS:
        if r < BH:
            if _mean_chunk(K, PARTIAL, COUNTERS + 1, K_MEAN, stride_kb, stride_kh, stride_kn, stride_kd, H, N, r,
                           slot, CHUNKS, MEAN_ROWS, MEAN_STEP, CHUNKS_P2, HEAD_DIM):
                tl.debug_barrier()   # the mean is stored by every thread before the flag's release
                tl.atomic_xchg(COUNTERS + 1 + BH + r, 1, sem="release")
    elif slot < CHUNKS + qv:
        if r < BH:
            j = slot - CHUNKS
            if not SKIP_Q and j < tiles:
                _q_tile(Q, Q_ROWS, Q_COLS, SQ, MU_Q, stride_qb, stride_qh, stride_qn, stride_qd, H, N, j, r,
                        TILE, BLOCK_Q, HEAD_DIM, SMOOTH_Q, COLS, TOKEN)
            else:
                _v_tile(V, V_COLS, SV, stride_vb, stride_vh, stride_vn, stride_vd, H, N, j % tiles, r, TILE,
                        BLOCK_V, HEAD_DIM)
    else:
        bh = r - LAG
        if bh >= 0:
            ready = tl.atomic_add(COUNTERS + 1 + BH + bh, 0, sem="acquire")
            while ready == 0:
                ready = tl.atomic_add(COUNTERS + 1 + BH + bh, 0, sem="acquire")
            _k_tile(K, K_MEAN, K_ROWS, K_COLS, SK, stride_kb, stride_kh, stride_kn, stride_kd, H, N,
                    slot - CHUNKS - qv, bh, TILE, BLOCK_KV, HEAD_DIM, True, COLS, TOKEN, True)


@triton.jit
def _backward_preprocess_kernel(DO, O, LSE, DELTA, LSE2, LSE2_P, DO_COLS, DO_SCALE,
                                stride_dob, stride_doh, stride_don, stride_dod,
                                stride_ob, stride_oh, stride_on, stride_od, H, N,
                                BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, TOKEN: tl.constexpr):
    """delta = rowsum(dO * O) (fp32), the LSE in base 2 (the backward's exp2 takes it as is,
    instead of one multiply per score-tile column) and the per-block INT8 dO, sequence-contiguous
    in k order. TOKEN: dO^ in FP8 e4m3 instead (the token contract's dV operand), and LSE2 - log2(256)
    (LSE2_P), which the token dK/dV reads instead of LSE2: its exp2 then yields 256 P, dV's e4m3 operand,
    with no multiply."""
    blk = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_n = blk * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    do = tl.load(DO + b * stride_dob + h * stride_doh
                 + offs_n[:, None] * stride_don + offs_d[None, :] * stride_dod).to(tl.float32)
    o = tl.load(O + b * stride_ob + h * stride_oh
                + offs_n[:, None] * stride_on + offs_d[None, :] * stride_od).to(tl.float32)
    delta = tl.sum(do * o, axis=1)
    tl.store(DELTA + bh * N + offs_n, delta)
    lse2 = tl.load(LSE + bh * N + offs_n) * LOG2E
    tl.store(LSE2 + bh * N + offs_n, lse2)
    if TOKEN:
        tl.store(LSE2_P + bh * N + offs_n, lse2 - P_E4M3_LOG2)
        # FP8 e4m3 for dV = P^T dO: scale amax / 448 (sagebwd.quant.quantize_row_blocks_e4m3)
        amax = tl.max(tl.max(tl.abs(do), axis=1), axis=0)
        scale = tl.math.div_rn(amax, E4M3_MAX)
        inv = tl.where(amax >= MIN_AMAX, tl.math.div_rn(E4M3_MAX, tl.maximum(amax, MIN_AMAX)), 0.0)
        do8 = to_e4m3(tl.minimum(tl.maximum(mul_rn(do, inv), -E4M3_MAX), E4M3_MAX))
    else:
        do8, scale = quantize_tile(do)
    tl.store(DO_SCALE + bh * (N // BLOCK) + blk, scale)
    tl.store(DO_COLS + bh.to(tl.int64) * N * HEAD_DIM + offs_d[:, None] * N + offs_n[None, :],
             to_k_order(tl.trans(do8)))


def _warps(block: int, head_dim: int) -> int:
    return 1 if interpreting() else (8 if block * head_dim >= 128 * 128 else 4)


def _preprocess_warps(block: int, head_dim: int, token: bool) -> int:
    """The token preprocess's 128 x 128 tile with 16 warps: 91 us at (8,8,4096,128) on an H100 against 114 with 8
    and 101 with 4 (docs/kernel-notes.md, "Fifteenth session", when it also wrote dO s_Q); at d=64 4 warps, the
    fastest of 2-16 there."""
    return 16 if token and block * head_dim >= 128 * 128 and not interpreting() else _warps(block, head_dim)


MEAN_STEP_ELEMENTS = 8192   # what a program of the K mean loads at a time: 128 rows at d=64, 64 at d=128
MAX_MEAN_CHUNKS = 64        # programs per head at most (longer sequences: more rows per program)


def _mean_chunks(n: int, d: int) -> tuple[int, int, int]:
    """(rows a chunk loads at a time, rows a chunk sums, chunks a head) of K's mean (_mean_chunk): at most
    MAX_MEAN_CHUNKS chunks, each a multiple of MEAN_STEP_ELEMENTS / d rows."""
    step = MEAN_STEP_ELEMENTS // d
    rows = step * triton.cdiv(n, step * MAX_MEAN_CHUNKS)
    return step, rows, triton.cdiv(n, rows)


def sequence_mean(x: torch.Tensor, tuning: Tuning | None = None) -> torch.Tensor:
    """fp32 mean over the sequence, shape (B*H, D): the K-smoothing offset.

    On a GPU one launch of _sequence_mean_kernel, up to 64 programs per head (PyTorch's strided reduction,
    which it replaces, took 25 us at (4, 12, 4096, 64) on an H100, this 16; a one-program-per-head Triton
    loop left most SMs idle). On the CPU PyTorch's mean, the simulation's, so that the interpreter's
    kernels and the simulation quantise the same K.
    """
    if not x.is_cuda:
        b, h, n, d = x.shape
        return x.mean(dim=2, dtype=torch.float32).reshape(b * h, d)
    return _sequence_mean(x, tuning)


def _sequence_mean(x: torch.Tensor, tuning: Tuning | None = None) -> torch.Tensor:
    """sequence_mean by the kernel, on any device (the interpreter's test calls it on the CPU)."""
    b, h, n, d = x.shape
    step, rows, chunks = _mean_chunks(n, d)
    partial = torch.empty(b * h, chunks, d, device=x.device, dtype=torch.float32)
    arrived = torch.zeros(b * h, device=x.device, dtype=torch.int32)
    mean = torch.empty(b * h, d, device=x.device, dtype=torch.float32)
    launch("sequence_mean", _sequence_mean_kernel, (b * h, chunks), x, partial, arrived, mean, *x.stride(), h, n,
           ROWS=rows, STEP=step, CHUNKS_P2=triton.next_power_of_2(chunks), HEAD_DIM=d, num_warps=4, tuning=tuning)
    return mean


def quantize_blocks(x: torch.Tensor, block: int, *, mean: torch.Tensor | None = None,
                    smooth_block: bool = False, rows: bool = True, cols: bool = False, token: bool = False,
                    tuning: Tuning | None = None):
    """Per-block INT8 of x (B, H, N, D), any strides, after optional smoothing.

    mean: (B*H, D) fp32 subtracted from every row first (K-smoothing).
    smooth_block: subtract each block's own row mean (Q-smoothing); returned as (B, H, N/block, D).
    token: one scale per row instead of per block (the "token" contract's Q and K).
    Returns (rows int8 (B,H,N,D) or None, cols (empty_cols: int8 (B,H,D,N) in k order; not with token) or None,
    scale (B,H,N/block) or (B,H,N) with token, block_mean or None).
    """
    b, h, n, d = x.shape
    assert n % block == 0, f"sequence length {n} is not a multiple of the block {block}"
    assert not (cols and token), "the token contract has no INT8 copy in k order (writes_cols)"
    dev = x.device
    out_rows = torch.empty(b, h, n, d, device=dev, dtype=torch.int8) if rows else None
    out_cols = empty_cols(x) if cols else None
    scale = torch.empty(b, h, n if token else n // block, device=dev, dtype=torch.float32)
    block_mean = torch.empty(b, h, n // block, d, device=dev, dtype=torch.float32) if smooth_block else None
    dummy = scale  # never dereferenced: the matching constexpr flag is off
    launch("quantize", _quantize_blocks_kernel, (n // block, b * h),
        x, mean if mean is not None else dummy, out_rows if rows else dummy, out_cols if cols else dummy,
        scale, block_mean if smooth_block else dummy, *x.stride(), h, n,
        BLOCK=block, HEAD_DIM=d, SUBTRACT_MEAN=mean is not None, SMOOTH_BLOCK=smooth_block,
        WRITE_ROWS=rows, WRITE_COLS=cols, TOKEN=token, num_warps=_warps(block, d), tuning=tuning)
    return out_rows, out_cols, scale, block_mean


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """The quantise launches' inputs (and the op's): q, k, v of one (batch, heads, seq, head_dim) shape and one 16-bit
    float dtype (the kernels would quantise fp32 too, reading twice the bytes the op is timed and sized for)."""
    assert q.dim() == 4 and q.shape == k.shape == v.shape, "q, k, v must be (batch, heads, seq, head_dim), equal"
    assert q.dtype == k.dtype == v.dtype and q.dtype in (torch.float16, torch.bfloat16), \
        f"triton backend takes fp16/bf16, got {q.dtype}, {k.dtype}, {v.dtype}"


def quantize_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_q: int, block_kv: int, *,
                 k_mean: torch.Tensor | None, smooth_q: bool, cols: bool, token: bool = False,
                 quantize_q: bool = True, pdl: bool = False, tuning: Tuning | None = None):
    """quantize_blocks of q (block_q; Q-smoothing if smooth_q), k (block_kv; minus k_mean if given)
    and v (the forward's kv tile, validate.key_tile; cols only) in one launch: (q8, q8t, s_q,
    mu_q, k8, k8t, s_k, v8t, s_v), the cols of q and k only if writes_cols(cols, token) (the block backward's
    operands), else None; `token`: Q and K with one scale per token, s_q and s_k (B,H,N), and no cols.
    Bit-identical to three quantize_blocks calls, in one launch instead of three (~50 us of host time each on an H200's
    host). Every program takes a tile of max(block_q, block_kv, V's block) rows: with the smaller blocks'
    programs as launched alone (64 rows, 4 warps at d=128), one launch took the register count
    and warps of the largest and ran 22-57% slower than the three launches together.
    quantize_q False (token, no Q-smoothing): K and V only; q8 and s_q are returned unwritten, for the
    token forward to fill (forward.run with q). pdl: the forward is launched next as this launch's programmatic
    dependent (launch.forward_pdl): every program triggers it as it starts."""
    assert quantize_q or (token and not smooth_q), "only the token contract without Q-smoothing skips Q"
    check_qkv(q, k, v)
    b, h, n, d = q.shape
    assert n % block_q == 0 and n % block_kv == 0, f"sequence length {n} is not a multiple of the blocks"
    block_v, tile = _qkv_tile(block_q, block_kv, token)
    assert n % block_v == 0, f"sequence length {n} is not a multiple of the forward's kv tile {block_v}"
    if smooth_q and block_q < tile:   # Q-smoothing's block mean needs its block whole
        q8, q8t, s_q, mu_q = quantize_blocks(q, block_q, smooth_block=True, cols=writes_cols(cols, token),
                                             token=token, tuning=tuning)
        k8, k8t, s_k, _ = quantize_blocks(k, block_kv, mean=k_mean, cols=writes_cols(cols, token), token=token,
                                          tuning=tuning)
        _, v8t, s_v, _ = quantize_blocks(v, block_v, rows=False, cols=True, tuning=tuning)
        return q8, q8t, s_q, mu_q, k8, k8t, s_k, v8t, s_v
    outputs = _qkv_outputs(q, block_q, block_kv, block_v, smooth_q=smooth_q, cols=cols, token=token)
    q8, q8t, s_q, mu_q, k8, k8t, s_k, v8t, s_v = outputs
    dummy = s_v   # never dereferenced: the matching constexpr flag is off
    launch("quantize", _quantize_qkv_kernel, (n // tile, b * h, 3 if quantize_q else 2),
        q, k, v, k_mean if k_mean is not None else dummy, q8, q8t if q8t is not None else dummy, s_q,
        mu_q if smooth_q else dummy, k8, k8t if k8t is not None else dummy, s_k, v8t, s_v,
        *q.stride(), *k.stride(), *v.stride(), h, n,
        TILE=tile, BLOCK_Q=block_q, BLOCK_KV=block_kv, BLOCK_V=block_v, HEAD_DIM=d, SMOOTH_K=k_mean is not None,
        SMOOTH_Q=smooth_q, COLS=writes_cols(cols, token), TOKEN=token, SKIP_Q=not quantize_q,
        num_warps=_warps(tile, d), **_pdl(pdl), tuning=tuning)
    return outputs


def writes_cols(cols: bool, token: bool) -> bool:
    """Whether the quantise launch writes Q^T and K^T (INT8 in k order): for the backward (cols), in the block
    contract only; the token backward's dQ and dK are bf16 products with K and Q themselves (simulate.token_dq,
    token_dk), and nothing else reads them. The quantise launches take it as their COLS."""
    return cols and not token


def empty_cols(like: torch.Tensor) -> torch.Tensor:
    """An INT8 copy in k order (B, H, D, N) of a (B, H, N, D) tensor like `like`, unwritten: the block backward's
    Q^T and K^T, which the quantise launch writes."""
    b, h, n, d = like.shape
    return like.new_empty((b, h, d, n), dtype=torch.int8)


def _qkv_tile(block_q: int, block_kv: int, token: bool) -> tuple[int, int]:
    """(V's block, the quantise launch's tile): V is quantised per the forward's kv tile (validate.key_tile), and
    every program takes a tile of the largest block (with the smaller blocks' programs launched alone, one launch
    took the register count and warps of the largest and ran slower)."""
    block_v = key_tile("token" if token else "block", block_kv)
    return block_v, max(block_q, block_kv, block_v)


def _qkv_outputs(q: torch.Tensor, block_q: int, block_kv: int, block_v: int, *, smooth_q: bool, cols: bool,
                 token: bool) -> tuple:
    """quantize_qkv's outputs, allocated: (q8, q8t, s_q, mu_q, k8, k8t, s_k, v8t, s_v)."""
    b, h, n, d = q.shape
    dev = q.device

    def i8(*shape):
        return torch.empty(*shape, device=dev, dtype=torch.int8)

    def f32(*shape):
        return torch.empty(*shape, device=dev, dtype=torch.float32)
    k8, v8t = i8(b, h, n, d), i8(b, h, d, n)
    k8t = empty_cols(q) if writes_cols(cols, token) else None
    s_k = f32(b, h, n) if token else f32(b, h, n // block_kv)
    s_v = f32(b, h, n // block_v)
    q8, q8t = i8(b, h, n, d), empty_cols(q) if writes_cols(cols, token) else None
    s_q = f32(b, h, n) if token else f32(b, h, n // block_q)
    mu_q = f32(b, h, n // block_q, d) if smooth_q else None
    return q8, q8t, s_q, mu_q, k8, k8t, s_k, v8t, s_v


# Rounds of other work between a head's mean chunks and its K tiles (_quantize_qkv_mean_kernel). H200, model layout,
# bf16, in CUDA graphs (python -m benchmarks.prepass --lags 2 8 16 32 64 128; docs/benchmarks.md, "The pre-pass's lag
# on the H200"): lag 8 was within 4% of the best lag at every d=64 shape, both contracts, and about as fast as the
# two launches; lag 2 (the H100's choice, "Fourteenth session") 12-13% slower (token); lags past 16 slower again. In a
# fwd+bwd step (kernel A/B) the quantise launch -11..-13% (token), -6..-7% (block).
MEAN_LAG = 8
# Where the one launch is the op's: d=64. At d=128 it was slower than the two launches inside a fwd+bwd step
# (+30 us token, +17 us block at (8, 8, 4096, 128) causal, H100 kernel A/B), though faster back to back.
MEAN_IN_LAUNCH_HEAD_DIMS = (64,)


def mean_in_quantise_launch(k: torch.Tensor, tuning: Tuning | None) -> bool:
    """Whether quantize_smoothed_qkv takes K's mean inside the quantise launch: on a GPU, and where a tool
    records the GPU's launches (tools.offline); on the CPU the interpreter's kernels quantise the
    simulation's K, so its mean is PyTorch's (sequence_mean)."""
    return k.is_cuda or (tuning is not None and tuning.recorded is not None)


def quantize_smoothed_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_q: int, block_kv: int, *,
                          smooth_q: bool, cols: bool, token: bool = False, quantize_q: bool = True,
                          pdl: bool = False, tuning: Tuning | None = None):
    """quantize_qkv with K-smoothing by K's sequence mean, and that mean: (q8, q8t, s_q, mu_q, k8, k8t, s_k, v8t,
    s_v, k_mean (B*H, D) fp32).

    On a GPU (and where a tool records the GPU's launches) at the head dims of MEAN_IN_LAUNCH_HEAD_DIMS the mean
    is taken in the quantise launch itself (_quantize_qkv_mean_kernel, _mean_chunk's arithmetic: the mean has
    sequence_mean's bits where the two launches reduce with the same warps): one pass instead of a mean kernel
    and then the quantise kernel. Elsewhere sequence_mean (on the CPU PyTorch's mean, the simulation's), then
    quantize_qkv."""
    if (not mean_in_quantise_launch(k, tuning) or k.shape[-1] not in MEAN_IN_LAUNCH_HEAD_DIMS
            or (smooth_q and block_q < _qkv_tile(block_q, block_kv, token)[1])):
        k_mean = sequence_mean(k)
        return (*quantize_qkv(q, k, v, block_q, block_kv, k_mean=k_mean, smooth_q=smooth_q, cols=cols, token=token,
                              quantize_q=quantize_q, pdl=pdl, tuning=tuning), k_mean)
    return _quantize_qkv_with_mean(q, k, v, block_q, block_kv, smooth_q=smooth_q, cols=cols, token=token,
                                   quantize_q=quantize_q, pdl=pdl, tuning=tuning)


def _quantize_qkv_with_mean(q, k, v, block_q: int, block_kv: int, *, smooth_q: bool, cols: bool, token: bool,
                            quantize_q: bool, pdl: bool = False, tuning: Tuning | None = None,
                            lag: int | None = None):
    """quantize_smoothed_qkv's one launch, on any device (the interpreter's test calls it on the CPU)."""
    assert quantize_q or (token and not smooth_q), "only the token contract without Q-smoothing skips Q"
    check_qkv(q, k, v)
    b, h, n, d = q.shape
    block_v, tile = _qkv_tile(block_q, block_kv, token)
    assert n % tile == 0, f"sequence length {n} is not a multiple of the blocks"
    assert not smooth_q or block_q == tile, "Q-smoothing's block mean needs the launch's tile to be its block"
    outputs = _qkv_outputs(q, block_q, block_kv, block_v, smooth_q=smooth_q, cols=cols, token=token)
    q8, q8t, s_q, mu_q, k8, k8t, s_k, v8t, s_v = outputs
    step, rows, chunks = _mean_chunks(n, d)
    partial = torch.empty(b * h, chunks, d, device=k.device, dtype=torch.float32)
    counters = torch.zeros(1 + 2 * b * h, device=k.device, dtype=torch.int32)   # ticket, arrived, mean ready
    k_mean = torch.empty(b * h, d, device=k.device, dtype=torch.float32)
    lag = min(MEAN_LAG if lag is None else lag, b * h)   # rounds past the last head's would hold no work
    per_round = chunks + (n // tile) * (3 if quantize_q else 2)   # chunks, Q and V tiles, K tiles
    dummy = s_v   # never dereferenced: the matching constexpr flag is off
    launch("quantize", _quantize_qkv_mean_kernel, ((b * h + lag) * per_round,),
        q, k, v, k_mean, q8, q8t if q8t is not None else dummy, s_q, mu_q if smooth_q else dummy, k8,
        k8t if k8t is not None else dummy, s_k, v8t, s_v, partial, counters, *q.stride(), *k.stride(), *v.stride(),
        h, n, b * h, chunks, lag,
        TILE=tile, BLOCK_Q=block_q, BLOCK_KV=block_kv, BLOCK_V=block_v, HEAD_DIM=d, SMOOTH_Q=smooth_q,
        COLS=writes_cols(cols, token), TOKEN=token, SKIP_Q=not quantize_q, MEAN_ROWS=rows, MEAN_STEP=step,
        CHUNKS_P2=triton.next_power_of_2(chunks),
        num_warps=_warps(tile, d), **_pdl(pdl), tuning=tuning)
    return (*outputs, k_mean)


def _pdl(pdl: bool) -> dict:
    """The quantise launch's PDL trigger where the forward is its programmatic dependent (launch.forward_pdl);
    nothing otherwise, so that launch's kernel is the one without it."""
    return {"PDL": True} if pdl else {}


class Preprocessed(NamedTuple):
    """What backward_preprocess writes for the backward's kernels."""
    delta: torch.Tensor                # rowsum(dO * O), (B,H,N) fp32
    lse2: torch.Tensor                 # LSE * log2(e), (B,H,N) fp32
    do8t: torch.Tensor                 # dO^ (B,H,D,N) in k order: INT8 (block), FP8 e4m3 (token)
    s_do: torch.Tensor                 # dO^'s scales, (B,H,N/block_q) fp32
    lse2_p: torch.Tensor | None        # token: LSE * log2(e) - log2(256), (B,H,N) fp32


def backward_preprocess(do: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, block_q: int,
                        token: bool = False, tuning: Tuning | None = None) -> Preprocessed:
    """The backward's per-row pass over dO and O (Preprocessed). token: the token contract, whose dO^ is FP8 e4m3
    (dV's operand in that contract) and whose dK/dV kernels read lse2_p; in the block contract dO^ is INT8 and
    lse2_p None."""
    b, h, n, d = do.shape
    delta = torch.empty(b, h, n, device=do.device, dtype=torch.float32)
    lse2 = torch.empty_like(delta)
    lse2_p = torch.empty_like(delta) if token else None
    do_cols = torch.empty(b, h, d, n, device=do.device, dtype=torch.float8_e4m3fn if token else torch.int8)
    do_scale = torch.empty(b, h, n // block_q, device=do.device, dtype=torch.float32)
    launch("backward_preprocess", _backward_preprocess_kernel, (n // block_q, b * h),
        do, o, lse, delta, lse2, lse2_p if token else delta, do_cols, do_scale,
        *do.stride(), *o.stride(), h, n, BLOCK=block_q, HEAD_DIM=d, TOKEN=token,
        **launch_settings("backward_preprocess", {"num_warps": _preprocess_warps(block_q, d, token)}, tuning),
        tuning=tuning)
    return Preprocessed(delta, lse2, do_cols, do_scale, lse2_p)
