"""The whole d=64 backward in one warp-specialised Gluon kernel for Hopper: dK, dV and dQ from
one computation of S, P, dP and dS per score element (the paper's Algorithm 2 as written).
Experimental (registry: dq and dkdv "fused"; kernels="default,fused"): correct, but slower than the
default two-kernel backward on an H100 (measured below), and its dQ is not bit-reproducible.

The default backward (backward.py's dQ kernel, then dkdv_ws_hopper) computes S, P, dP and dS
twice: the dQ kernel, one q block per program, measures each (block_q x block_kv) tile's P and dS
maxima and keeps dQ in registers; the dK/dV kernel, kv-major, recomputes them and quantises with
those scales: 17.1 + 14.2 SASS instructions per score element at d=64. Here a program holds 128 kv
rows on two consumer warpgroups, as dkdv_ws_hopper, and each consumer owns whole quantisation
tiles (64 kv rows x a 128-row q block), so it takes their scales itself: 20.3 instructions per
score element in one loop (offline, sass_mix; the causal build 20.9).

    per q block (ring slot filled by the producer warp; the blocks from the last to the first):
      issue S_a, S_b (INT8), dP_a, dP_b (16-bit) | P_a, P_b | dS_a, dS_b (fp32)
      tile maxima of P and |dS|: one exchange inside the warpgroup (4 warps, a named barrier)
      P^ -> issue dV (A from registers, dO^T in k order) | dS^ -> issue dK (Q^T in k order), and
        dS^ stored transposed into shared memory as byte pairs (stmatrix .trans: kv rows r and
        r+8 share a 16-bit element, so its kv order is 0, 8, 1, 9, ... in each 16: "pair order")
      wait dV, convert | issue dQ = dS^ K^ (A = that tile, B = K^T in pair order) | wait dK,
      convert, release the slot | wait dQ, add its fp32 partial into a buffer (red.add.v2.f32)

Measured (H100, (8,16,4096,64) causal, docs/kernel-notes.md): 2.77 ms against 1.12 (dQ) +
1.05 (dK/dV) for the two kernels. With the same instructions but no atomic traffic it took 2.07 ms
(ncu: L2 at 85% of its peak, 4.4 GB of atomics: two 64-row kv tiles per program, each with its
own dS scale, cannot share one int32 dQ product); without the dQ product at all 1.47 ms: its
wait, conversion and atomics sit at the end of every block with nothing to overlap. A fourth
warpgroup for dQ (summing both tiles before the atomics) needs registers the consumers do not
leave: P and dS of both slices must be live at the exchange, with dV, dK beside them (~236 per
thread); with dV, dK in shared memory it fitted and took 2.90 ms.

What else it costs: the dQ partials are added in whatever order the programs reach them, so dQ
moves in its last bits run to run (dK, dV and O do not); an fp32 buffer of B*H*N*D*4 bytes while
the backward runs; K^T re-ordered into pair order (pair_order_from_k_order, a gather: 0.14 ms).

Numerics against the two-kernel backward: the same contract (per-tile amax of P and dS, INT8
everywhere but dP); the tile scales come from this orientation's dP sums, so they differ from the
dQ kernel's in the last bits, and dS^ needs no saturation (its own amax bounds it).

Limits (else the two-kernel backward runs): head_dim 64, block_q 128, block_kv 64, no
Q-smoothing, seq a multiple of 128.
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)

from .._common import k_order_index
from ..dkdv_hopper import (BOTH, _allocate, _cols, _int8_bits, _load_block, _release, _rows, _seq_copy, _slice_probs,
                           _slice_vector, as_a_operand, kv_tile_layouts)
from ..dkdv_ws_hopper import kv_program, ring_barriers
from ..dq_hopper import _block_scales
from ..hopper import desc, seq_desc
from ..launch import launch

SLICE = 64            # kv rows per consumer = block_kv; q rows per slice (a q block is two)
STAGES = 3            # q blocks in the ring
CONSUMER_REGS = 240   # 2 consumers x 128 threads x 240 + 128 x 24 = an SM's 64 K registers
PRODUCER_REGS = 24

_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier   # (Triton 3.6: thread_barrier)


def pair_order_index(n: int, device=None) -> torch.Tensor:
    """The sequence index stored at each of n positions in pair order (n a multiple of 16): within
    each 16, position 2i + h holds index 8h + i."""
    return torch.arange(n, device=device).reshape(n // 16, 2, 8).permute(0, 2, 1).reshape(n)


def pair_order_from_k_order(k8t: torch.Tensor) -> torch.Tensor:
    """A k-ordered (..., D, N) copy (quantize.py's K^T) re-ordered into pair order."""
    n = k8t.shape[-1]
    position_of = torch.empty(n, dtype=torch.long, device=k8t.device)
    position_of[k_order_index(n, k8t.device)] = torch.arange(n, device=k8t.device)   # index -> k-order position
    return k8t[..., position_of[pair_order_index(n, k8t.device)]]


@gluon.jit
def _load_kv(k_desc, v_desc, kt_desc, k_smem, v_smem, kt_smem, kv_bar, q_row0, t_row0, start_n, vb, vh):
    """TMA of the program's K^, V and K^T (pair order) on kv_bar."""
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes + kt_desc.block_type.nbytes)
    _seq_copy(v_desc, vb, vh, q_row0, start_n, kv_bar, v_smem)
    tma.async_copy_global_to_shared(k_desc, [q_row0 + start_n, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(kt_desc, [t_row0, start_n], kv_bar, kt_smem)


@gluon.jit
def _producer(k_desc, v_desc, kt_desc, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, k_smem, v_smem,
              kt_smem, q_smem, do_smem, qt_smem, dot_smem, lse_smem, delta_smem, kv_bar, full, empty, q_row0, t_row0,
              vb, vh, start_n, first, n_blocks, STAGES: gl.constexpr, SLICE: gl.constexpr):
    """K^, V, K^T of both kv tiles, then every q block the consumers walk (the last first), each into
    a ring slot once both consumers have released it."""
    _load_kv(k_desc, v_desc, kt_desc, k_smem, v_smem, kt_smem, kv_bar, q_row0, t_row0, start_n, vb, vh)
    for r in range(n_blocks):
        slot = r % STAGES
        if r >= STAGES:
            mbarrier.wait(empty.index(2 * slot), ((r // STAGES) - 1) & 1)
        _load_block(q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, q_smem, do_smem, qt_smem, dot_smem,
                    lse_smem, delta_smem, full, r, first + n_blocks - 1 - r, q_row0, t_row0, vb, vh, STAGES, SLICE,
                    BOTH, lse_desc, lse_smem, False)


@gluon.jit
def _tile_maxima(p_a, p_b, ds_a, ds_b, xbuf, all_layout: gl.constexpr):
    """max(P), max|dS| over the consumer's tile (both slices): each warp reduces its rows and
    writes one pair, and after one barrier of the warpgroup every thread reads all four."""
    # P >= 0 orders like its bits as integers (VIMNMX3 takes two elements per instruction)
    p_rows = gl.maximum(gl.max(p_a.to(gl.int32, bitcast=True), axis=1),
                        gl.max(p_b.to(gl.int32, bitcast=True), axis=1)).to(gl.float32, bitcast=True)
    ds_rows = gl.maximum(gl.max(gl.abs(ds_a), axis=1), gl.max(gl.abs(ds_b), axis=1))
    rows = gl.join(p_rows, ds_rows)                                              # [kv rows, 2]
    nw: gl.constexpr = gl.num_warps()
    per_warp = gl.max(gl.reshape(rows, [nw, rows.shape[0] // nw, 2]), axis=1)   # [warps, 2]
    xbuf.store(per_warp)
    _cta_barrier()   # in a warp_specialize partition: a named barrier of its 4 warps
    both = gl.max(xbuf.load(all_layout), axis=0)                                  # [2], in every thread
    col = gl.arange(0, 2, layout=gl.SliceLayout(0, all_layout))
    # (both are >= 0: a max against 0 picks one element)
    return gl.max(gl.where(col == 0, both, 0.0), axis=0), gl.max(gl.where(col == 1, both, 0.0), axis=0)


@gluon.jit
def _store_transposed_pairs(ds_bits, pairs_smem, SLICE: gl.constexpr):
    """dS^ of one slice, int8 in the low bytes of ds_bits [SLICE kv, SLICE q] (a wgmma accumulator
    layout: a thread holds kv rows g and g + 8 of each 16), into pairs_smem [SLICE q, SLICE / 2]
    int16 transposed: element (q, 8w + g) = bytes (kv 16w + g, kv 16w + 8 + g). ptxas makes the
    store stmatrix .trans (STSM.16.MT88), so the bytes of a q row are kv in pair order."""
    x = gl.reshape(ds_bits, [SLICE // 16, 2, 8, SLICE])     # kv = 16 w + 8 h + g
    x = gl.permute(x, [0, 2, 3, 1])                          # [w, g, q, h]
    lo, hi = gl.split(gl.reshape(x, [SLICE // 2, SLICE, 2]))
    pairs = ((lo & 0xFF) | ((hi & 0xFF) << 8)).to(gl.int16)  # [pairs, q]
    pairs_smem.permute((1, 0)).store(pairs)


@gluon.jit
def _q_block(r, blk, dv, dk, k_tile, v_tile, kt_tile, q_smem, do_smem, qt_smem, dot_smem, lse_smem, delta_smem, ds16,
             ds_tile, xbuf, full, empty, SQ_bh, SDO_bh, DQA_bh, offs_kv, k_scale, qk_const, dq_const,
             s_layout: gl.constexpr, dp_layout: gl.constexpr, acc_layout: gl.constexpr, op_layout: gl.constexpr,
             all_layout: gl.constexpr, HEAD_DIM: gl.constexpr, SLICE: gl.constexpr, STAGES: gl.constexpr,
             MASK: gl.constexpr):
    """dV, dK after q block `blk` (ring slot r % STAGES), and its dQ partial added into DQA; MASK:
    the causal mask on both slices (the block holding the diagonal)."""
    col: gl.constexpr = gl.SliceLayout(0, s_layout)
    slot = r % STAGES
    q_scale = gl.load(SQ_bh + blk)
    s_do = gl.load(SDO_bh + blk)
    offs_a = blk * 2 * SLICE + gl.arange(0, SLICE, layout=col)
    offs_b = offs_a + SLICE
    zero_s = gl.zeros([SLICE, SLICE], gl.int32, s_layout)
    zero_dp = gl.zeros([SLICE, SLICE], gl.float32, dp_layout)
    zero_acc = gl.zeros([SLICE, HEAD_DIM], gl.int32, acc_layout)
    zero_dq = gl.zeros([2 * SLICE, HEAD_DIM], gl.int32, acc_layout)
    mbarrier.wait(full.index(2 * slot), (r // STAGES) & 1)
    st_a = warpgroup_mma(k_tile, _rows(q_smem, slot, 0, SLICE, HEAD_DIM, True).permute((1, 0)), zero_s,
                         use_acc=False, is_async=True)
    st_b = warpgroup_mma(k_tile, _rows(q_smem, slot, 1, SLICE, HEAD_DIM, True).permute((1, 0)), zero_s,
                         use_acc=False, is_async=True)
    dpt_a = warpgroup_mma(v_tile, _rows(do_smem, slot, 0, SLICE, HEAD_DIM, True).permute((1, 0)), zero_dp,
                          use_acc=False, is_async=True)
    dpt_b = warpgroup_mma(v_tile, _rows(do_smem, slot, 1, SLICE, HEAD_DIM, True).permute((1, 0)), zero_dp,
                          use_acc=False, is_async=True)
    qk_scale = (q_scale * k_scale) * qk_const
    st_a = warpgroup_mma_wait(3, deps=[st_a])
    p_a = _slice_probs(st_a, qk_scale, _slice_vector(lse_smem, slot, 0, col, SLICE, True), offs_a, offs_kv,
                       MASK, False, False)
    st_b = warpgroup_mma_wait(2, deps=[st_b])
    p_b = _slice_probs(st_b, qk_scale, _slice_vector(lse_smem, slot, 1, col, SLICE, True), offs_b, offs_kv,
                       MASK, False, False)
    dpt_a = warpgroup_mma_wait(1, deps=[dpt_a])
    ds_a = p_a * (gl.convert_layout(dpt_a, s_layout) - _slice_vector(delta_smem, slot, 0, col, SLICE, True)[None, :])
    dpt_b = warpgroup_mma_wait(0, deps=[dpt_b])
    ds_b = p_b * (gl.convert_layout(dpt_b, s_layout) - _slice_vector(delta_smem, slot, 1, col, SLICE, True)[None, :])
    p_amax, ds_amax = _tile_maxima(p_a, p_b, ds_a, ds_b, xbuf, all_layout)
    p_scale, p_inv = _block_scales(p_amax, False)
    ds_scale, ds_inv = _block_scales(ds_amax, False)

    dv_int = warpgroup_mma(as_a_operand(_int8_bits(p_a, p_inv).to(gl.int8), op_layout),
                           _cols(dot_smem, slot, 0, SLICE, True).permute((1, 0)), zero_acc, use_acc=False,
                           is_async=True)
    dv_int = warpgroup_mma(as_a_operand(_int8_bits(p_b, p_inv).to(gl.int8), op_layout),
                           _cols(dot_smem, slot, 1, SLICE, True).permute((1, 0)), dv_int, is_async=True)
    # dS^ goes to the dK product (A from registers) and, transposed, to shared memory for the dQ
    # product; the int32 bits of a slice die once both have them
    dsb_a = _int8_bits(ds_a, ds_inv)   # own amax: in range, no saturation
    _store_transposed_pairs(dsb_a, ds16.slice(0, SLICE), SLICE)
    dk_int = warpgroup_mma(as_a_operand(dsb_a.to(gl.int8), op_layout),
                           _cols(qt_smem, slot, 0, SLICE, True).permute((1, 0)), zero_acc, use_acc=False,
                           is_async=True)
    dsb_b = _int8_bits(ds_b, ds_inv)
    _store_transposed_pairs(dsb_b, ds16.slice(SLICE, SLICE), SLICE)
    dk_int = warpgroup_mma(as_a_operand(dsb_b.to(gl.int8), op_layout),
                           _cols(qt_smem, slot, 1, SLICE, True).permute((1, 0)), dk_int, is_async=True)
    # dV is done before the dQ product starts: its int32 result and its A operand (P^ in registers)
    # are not live beside dQ's (they spilled otherwise)
    dv_int = warpgroup_mma_wait(2, deps=[dv_int])
    dv += dv_int.to(gl.float32) * (p_scale * s_do)
    fence_async_shared()
    _cta_barrier()   # every warp's part of dS^ is in shared memory (the last block's dQ product, which
    #                  read it, was waited on at the end of that block)
    dq_int = warpgroup_mma(ds_tile, kt_tile.permute((1, 0)), zero_dq, use_acc=False, is_async=True)
    dk_int = warpgroup_mma_wait(1, deps=[dk_int])
    dk += dk_int.to(gl.float32) * (ds_scale * q_scale)
    _release(empty, 2 * slot)   # the ring slot's last readers (dV, dK) are done
    dq_int = warpgroup_mma_wait(0, deps=[dq_int])
    # 64-bit offsets, made here: their constant parts fold into the atomics' immediate offsets (with
    # 32-bit ones ptxas widened every sum and rebuilt each address, ~4 instructions per atomic; made
    # once per kernel, they were held in registers across the peeled block and the loop, and spilled)
    dq_rows = gl.arange(0, 2 * SLICE, layout=gl.SliceLayout(1, acc_layout)).to(gl.int64)
    dq_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout)).to(gl.int64)
    gl.atomic_add(DQA_bh + blk * 2 * SLICE * HEAD_DIM + (dq_rows[:, None] * HEAD_DIM + dq_cols[None, :]),
                  dq_int.to(gl.float32) * (ds_scale * dq_const), sem="relaxed")
    return dv, dk


@gluon.jit
def _consumer(TILE: gl.constexpr, k_tile, v_tile, kt_tile, q_smem, do_smem, qt_smem, dot_smem, lse_smem, delta_smem,
              ds16, xbuf, kv_bar, full, empty, SK_tile, SQ_bh, SDO_bh, DK_bh, DV_bh, DQA_bh, stride_gn, start_n,
              first, n_blocks, sm_scale, HEAD_DIM: gl.constexpr, SLICE: gl.constexpr, CAUSAL: gl.constexpr,
              STAGES: gl.constexpr):
    """dK, dV of kv tile TILE (SLICE rows from start_n) and its dQ contributions, on one warpgroup.
    Causal: the diagonal block runs last, masked on both slices (in tile 1 slice a is wholly masked:
    P = 0 adds nothing); the loop runs unmasked."""
    s_layout: gl.constexpr = kv_tile_layouts(SLICE, HEAD_DIM)[0]
    dp_layout: gl.constexpr = kv_tile_layouts(SLICE, HEAD_DIM)[1]
    acc_layout: gl.constexpr = kv_tile_layouts(SLICE, HEAD_DIM)[2]
    op_layout: gl.constexpr = kv_tile_layouts(SLICE, HEAD_DIM)[3]
    all_layout: gl.constexpr = gl.BlockedLayout([4, 2], [32, 1], [4, 1], [1, 0])   # whole [warps, 2] per thread

    k_scale = gl.load(SK_tile)
    qk_const = sm_scale * 1.4426950408889634
    dq_const = k_scale * sm_scale
    offs_kv = start_n + gl.arange(0, SLICE, layout=gl.SliceLayout(1, s_layout))
    ds_tile = ds16._reinterpret(gl.int8, [2 * SLICE, SLICE],
                                gl.NVMMASharedLayout.get_default_for([2 * SLICE, SLICE], gl.int8))
    dv = gl.zeros([SLICE, HEAD_DIM], gl.float32, acc_layout)
    dk = gl.zeros([SLICE, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(kv_bar, 0)

    # The q blocks from the last to the first; causal: the first (the diagonal, masked) after the
    # loop. (Peeled before it, the atomics' address offsets that the compiler hoists for both were
    # live across both, and spilled: 104 B, 62 spill loads and stores in the loops.)
    n_loop = n_blocks - 1 if CAUSAL else n_blocks
    for r in range(n_loop):
        dv, dk = _q_block(r, first + n_blocks - 1 - r, dv, dk, k_tile, v_tile, kt_tile, q_smem, do_smem, qt_smem,
                          dot_smem, lse_smem, delta_smem, ds16, ds_tile, xbuf, full, empty, SQ_bh, SDO_bh, DQA_bh,
                          offs_kv, k_scale, qk_const, dq_const, s_layout, dp_layout, acc_layout, op_layout,
                          all_layout, HEAD_DIM, SLICE, STAGES, False)
    if CAUSAL:
        dv, dk = _q_block(n_loop, first, dv, dk, k_tile, v_tile, kt_tile, q_smem, do_smem, qt_smem, dot_smem,
                          lse_smem, delta_smem, ds16, ds_tile, xbuf, full, empty, SQ_bh, SDO_bh, DQA_bh, offs_kv,
                          k_scale, qk_const, dq_const, s_layout, dp_layout, acc_layout, op_layout, all_layout,
                          HEAD_DIM, SLICE, STAGES, True)

    offs_r = start_n + gl.arange(0, SLICE, layout=gl.SliceLayout(1, acc_layout))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    out = offs_r[:, None] * stride_gn + offs_d[None, :]
    gl.store(DK_bh + out, (dk * sm_scale).to(DK_bh.dtype.element_ty))
    gl.store(DV_bh + out, dv.to(DV_bh.dtype.element_ty))


@gluon.jit
def _fused_kernel(k_desc, v_desc, kt_desc, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc,
                  SQ, SK, SDO, DK, DV, DQA, stride_gb, stride_gh, stride_gn, sm_scale, N, H,
                  HEAD_DIM: gl.constexpr, SLICE: gl.constexpr, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                  CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr):
    pid, bh, start_n, q_row0, vb, vh, t_row0, NQ, first, n_blocks = kv_program(N, H, HEAD_DIM, SLICE, CAUSAL)

    k_smem, v_smem, v_rows, q_smem, lse_smem, do_smem, qt_smem, dot_smem, delta_smem = _allocate(
        k_desc, v_desc, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, 2 * SLICE, HEAD_DIM, STAGES, BOTH,
        True)
    kt_smem = gl.allocate_shared_memory(gl.int8, kt_desc.block_type.shape, kt_desc.layout)
    pair_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([2 * SLICE, SLICE // 2], gl.int16)
    ds16_0 = gl.allocate_shared_memory(gl.int16, [2 * SLICE, SLICE // 2], pair_layout)
    ds16_1 = gl.allocate_shared_memory(gl.int16, [2 * SLICE, SLICE // 2], pair_layout)
    x_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    xbuf0 = gl.allocate_shared_memory(gl.float32, [4, 2], x_layout)
    xbuf1 = gl.allocate_shared_memory(gl.float32, [4, 2], x_layout)
    kv_bar, full, empty = ring_barriers(STAGES)

    NKV = N // SLICE
    SQ_bh = SQ + bh * NQ
    SDO_bh = SDO + bh * NQ
    SK_0 = SK + bh * NKV + 2 * pid
    out_bh = vb.to(gl.int64) * stride_gb + vh.to(gl.int64) * stride_gh
    DQA_bh = DQA + bh.to(gl.int64) * N * HEAD_DIM
    gl.warp_specialize([
        (_consumer, (0, k_smem.slice(0, SLICE), v_rows.slice(0, SLICE), kt_smem.slice(0, SLICE, dim=1), q_smem,
                     do_smem, qt_smem, dot_smem, lse_smem, delta_smem, ds16_0, xbuf0, kv_bar.index(0), full, empty,
                     SK_0, SQ_bh, SDO_bh, DK + out_bh, DV + out_bh, DQA_bh, stride_gn, start_n, first, n_blocks,
                     sm_scale, HEAD_DIM, SLICE, CAUSAL, STAGES)),
        (_consumer, (1, k_smem.slice(SLICE, SLICE), v_rows.slice(SLICE, SLICE), kt_smem.slice(SLICE, SLICE, dim=1),
                     q_smem, do_smem, qt_smem, dot_smem, lse_smem, delta_smem, ds16_1, xbuf1, kv_bar.index(0), full,
                     empty, SK_0 + 1, SQ_bh, SDO_bh, DK + out_bh, DV + out_bh, DQA_bh, stride_gn, start_n + SLICE,
                     first, n_blocks, sm_scale, HEAD_DIM, SLICE, CAUSAL, STAGES)),
        (_producer, (k_desc, v_desc, kt_desc, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, k_smem, v_smem,
                     kt_smem, q_smem, do_smem, qt_smem, dot_smem, lse_smem, delta_smem, kv_bar.index(0), full, empty,
                     q_row0, t_row0, vb, vh, start_n, first, n_blocks, STAGES, SLICE)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def launch_args(q8, q8t, s_q, k8, k8pt, s_k, v, do, do8t, s_do, lse2, delta, dk, dv, dqa, *, causal: bool):
    """(grid, args, kwargs) of the one fused launch. k8pt: K^T in pair order; dqa: fp32 (B, H, N, D)
    zeros, into which dQ (times sm_scale) is added."""
    b, h, n, d = q8.shape
    rows = b * h * n
    kv_rows = q_rows = 2 * SLICE
    args = (desc(k8.reshape(rows, d), [kv_rows, d]), seq_desc(v, kv_rows),
            desc(k8pt.reshape(b * h * d, n), [d, kv_rows]), desc(q8.reshape(rows, d), [q_rows, d]),
            seq_desc(do, q_rows), desc(q8t.reshape(b * h * d, n), [d, q_rows]),
            desc(do8t.reshape(b * h * d, n), [d, q_rows]), desc(lse2.reshape(rows), [q_rows]),
            desc(delta.reshape(rows), [q_rows]), s_q, s_k, s_do, dk, dv, dqa, *dk.stride()[:3], 1.0 / d ** 0.5, n, h)
    kwargs = dict(HEAD_DIM=d, SLICE=SLICE, CAUSAL=causal, STAGES=STAGES, CONSUMER_REGS=CONSUMER_REGS,
                  PRODUCER_REGS=PRODUCER_REGS, num_warps=4)
    return (n // (2 * SLICE), b * h), args, kwargs


def run(c, tuning=None) -> None:
    """dQ, dK, dV of a backward.BackwardCall in one launch (registry: dq and dkdv "fused"): dQ is
    added into an fp32 buffer, then cast into c.dq."""
    dqa = torch.zeros(c.q8.shape, device=c.q8.device, dtype=torch.float32)
    grid, args, kwargs = launch_args(c.q8, c.q8t, c.s_q, c.k8, pair_order_from_k_order(c.k8t), c.s_k, c.v, c.do,
                                     c.do8t, c.s_do, c.lse2, c.delta, c.dk, c.dv, dqa, causal=c.causal)
    launch("fused", _fused_kernel, grid, *args, tuning=tuning, **kwargs)
    c.dq.copy_(dqa)
