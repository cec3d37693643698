"""dK and dV of the token contract at head dim 128 in one launch, the work split by role (registry: dkdv
"gluon-roles", experimental, not yet measured on a GPU).

Today's d=128 dK/dV runs as two launches (dv, then dk; dkdv_ws_hopper), each computing S^T and P^T of every
(kv tile, q block): one warpgroup cannot hold dV's and dK's 64 x 128 fp32 accumulators beside the per-block
temporaries the token contract needs (dV's FP8 product scaled by s_dO / 256 per q block, dK's bf16 operand
dS^T). Here one program holds one 64-row kv tile and two consumer warpgroups share it:

- warpgroup 0 (the default partition): S^T = K^ Q^T of both q slices, 256 P^T = exp2(...) (masked on the
  causal diagonal block), P^T into shared memory (fp32, one buffer of both slices: p_full / p_empty
  mbarriers), then dV = P^T dO in FP8 e4m3, both slices chained, scaled per q block;
- warpgroup 1: dP^T = V dO^T of both slices (bf16), P^T from shared memory, dS^T = P^T (dP^T - delta),
  dK += bf16(dS^T) Q16 (Q itself in bf16 rows, simulate.token_dk);
- a producer warp fills the ring of q blocks (dkdv_ws_hopper._producer, PASS BOTH: Q^, LSE, s_Q, dO^T, dO,
  Q, delta per block), which both warpgroups release.

The arithmetic is dkdv_hopper._q_block_token's, element by element (P^T is the same fp32 number in both
warpgroups), so dK and dV should be bit-identical to the Triton token kernel's. Worked out in
docs/kernel-notes.md ("d=128: one launch for dK and dV"): ~16-17 instructions per score element on an SM
where the two launches issue 21.3. Limits: head dim 128, block_q 128, block_kv 64, no Q-smoothing, a
sequence that is a multiple of 128; TOKEN only.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from .. import hopper
from ..dkdv_hopper import (BOTH, G_P_E4M3_SCALE, _allocate, _allocate_token, _release,
                           _rows, _rows_dot, _rows_dot16, _slice_vector, _token_ds, _token_probs, kv_tile_layouts)
from ..dkdv_ws_hopper import PRODUCER_REGS, _producer, ring_barriers
from ..launch import launch

ROWS = gl.constexpr(64)    # kv rows per program: one tile, shared by both roles
SLICE = gl.constexpr(64)   # q rows per slice; a q block (128) is two
# q blocks in the ring: 99,840 B each (Q, dK's operand, is bf16: 32 KB) + K^, V (24,576) + P^T (32,768) of 232,448;
# two took 257 KB once a bf16 Q replaced the 16 KB Q^T (tests/test_triton_offline.py checks the build fits)
STAGES = 1
CONSUMER_REGS = 240
# Loops of a program that each walk every score element once (one per role): tools.offline --loop-mix sums them.
ROLE_LOOPS = 2


@gluon.jit
def _p_role(k_smem, q_smem, dot_smem, lse_smem, sq_smem, p_smem, kv_bar, full, empty, p_full, p_empty, SK_tile, SDO_bh,
            DV_bh, stride_gn, start_n, first, n_blocks, sm_scale, HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr,
            STAGES: gl.constexpr):
    """Warpgroup 0: S^T and 256 P^T of each q block, P^T handed to warpgroup 1, dV."""
    s_layout: gl.constexpr = kv_tile_layouts(SLICE, HEAD_DIM)[0]
    acc_layout: gl.constexpr = kv_tile_layouts(SLICE, HEAD_DIM)[2]
    op_layout: gl.constexpr = kv_tile_layouts(SLICE, HEAD_DIM)[3]
    col: gl.constexpr = gl.SliceLayout(0, s_layout)
    rows = gl.arange(0, SLICE, layout=gl.SliceLayout(1, s_layout))
    kq = gl.load(SK_tile + rows) * (sm_scale * 1.4426950408889634)   # s_K qk_const per kv row
    offs_kv = start_n + rows
    zero_s = gl.zeros([SLICE, SLICE], gl.int32, s_layout)
    dv = gl.zeros([SLICE, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(kv_bar, 0)
    for r in range(n_blocks):
        blk = first + r
        slot = r % STAGES
        mbarrier.wait(full.index(2 * slot), (r // STAGES) & 1)
        sq_a = _slice_vector(sq_smem, slot, 0, col, SLICE, True)
        lse_a = _slice_vector(lse_smem, slot, 0, col, SLICE, True)
        st_a = warpgroup_mma(k_smem, _rows(q_smem, slot, 0, SLICE, HEAD_DIM, True).permute((1, 0)), zero_s,
                             use_acc=False, is_async=True)
        st_b = warpgroup_mma(k_smem, _rows(q_smem, slot, 1, SLICE, HEAD_DIM, True).permute((1, 0)), zero_s,
                             use_acc=False, is_async=True)
        offs_a = blk * 2 * SLICE + gl.arange(0, SLICE, layout=col)
        st_a = warpgroup_mma_wait(1, deps=[st_a])
        p_a = _token_probs(st_a, kq, sq_a, lse_a, offs_a, offs_kv, False, CAUSAL, r == 0)
        st_b = warpgroup_mma_wait(0, deps=[st_b])
        p_b = _token_probs(st_b, kq, _slice_vector(sq_smem, slot, 1, col, SLICE, True),
                           _slice_vector(lse_smem, slot, 1, col, SLICE, True), offs_a + SLICE, offs_kv, False, CAUSAL,
                           r == 0)
        # P^T to warpgroup 1, once it has read the last block's
        if r > 0:
            mbarrier.wait(p_empty.index(0), (r - 1) & 1)
        p_smem.index(0).store(p_a)
        p_smem.index(1).store(p_b)
        _release(p_full, 0)   # every warp's stores are done (a named barrier), then one arrive
        # dV = P^T dO in FP8 e4m3, both slices chained in fp32; the q block's scale is one number
        dv_prod = _rows_dot(p_a, p_b, dot_smem, slot, op_layout,
                            gl.zeros([SLICE, HEAD_DIM], gl.float32, acc_layout), True, SLICE, True)
        dv_prod = warpgroup_mma_wait(0, deps=[dv_prod])
        dv += dv_prod * (gl.load(SDO_bh + blk) * (1.0 / G_P_E4M3_SCALE))
        _release(empty, 2 * slot)
    offs_r = start_n + gl.arange(0, SLICE, layout=gl.SliceLayout(1, acc_layout))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    gl.store(DV_bh + offs_r[:, None] * stride_gn + offs_d[None, :], dv.to(DV_bh.dtype.element_ty))


@gluon.jit
def _y_role(v_tile, do_smem, qt_smem, delta_smem, sq_smem, p_smem, kv_bar, full, empty, p_full, p_empty, DK_bh,
            stride_gn, start_n, n_blocks, sm_scale, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
    """Warpgroup 1: dP^T of each q block, P^T from warpgroup 0, dS^T, dK."""
    s_layout: gl.constexpr = kv_tile_layouts(SLICE, HEAD_DIM)[0]
    dp_layout: gl.constexpr = kv_tile_layouts(SLICE, HEAD_DIM)[1]
    acc_layout: gl.constexpr = kv_tile_layouts(SLICE, HEAD_DIM)[2]
    col: gl.constexpr = gl.SliceLayout(0, s_layout)
    zero_dp = gl.zeros([SLICE, SLICE], gl.float32, dp_layout)
    acc16_layout: gl.constexpr = kv_tile_layouts(SLICE, HEAD_DIM)[4]   # a bf16 dot's accumulator
    dk = gl.zeros([SLICE, HEAD_DIM], gl.float32, acc16_layout)
    mbarrier.wait(kv_bar, 0)
    for r in range(n_blocks):
        slot = r % STAGES
        mbarrier.wait(full.index(2 * slot), (r // STAGES) & 1)
        dpt_a = warpgroup_mma(v_tile, _rows(do_smem, slot, 0, SLICE, HEAD_DIM, True).permute((1, 0)), zero_dp,
                              use_acc=False, is_async=True)
        dpt_b = warpgroup_mma(v_tile, _rows(do_smem, slot, 1, SLICE, HEAD_DIM, True).permute((1, 0)), zero_dp,
                              use_acc=False, is_async=True)
        delta_a = _slice_vector(delta_smem, slot, 0, col, SLICE, True)
        mbarrier.wait(p_full.index(0), r & 1)
        p_a = p_smem.index(0).load(s_layout)
        p_b = p_smem.index(1).load(s_layout)
        _release(p_empty, 0)
        dpt_a = warpgroup_mma_wait(1, deps=[dpt_a])
        ds_a = _token_ds(p_a, dpt_a, delta_a, s_layout)
        dpt_b = warpgroup_mma_wait(0, deps=[dpt_b])
        ds_b = _token_ds(p_b, dpt_b, _slice_vector(delta_smem, slot, 1, col, SLICE, True), s_layout)
        dk = _rows_dot16(ds_a, ds_b, qt_smem, slot, dk, True, SLICE, HEAD_DIM, True)   # dK += bf16(dS^T) Q16
        dk = warpgroup_mma_wait(0, deps=[dk])
        _release(empty, 2 * slot)
    offs_r = start_n + gl.arange(0, SLICE, layout=gl.SliceLayout(1, acc_layout))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    # dK's terms came from 256 P: exact in a power of two
    gl.store(DK_bh + offs_r[:, None] * stride_gn + offs_d[None, :],
             gl.convert_layout(dk * (sm_scale * (1.0 / G_P_E4M3_SCALE)), acc_layout).to(DK_bh.dtype.element_ty))


@gluon.jit
def _dkdv_roles_kernel(k_desc, v_desc, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc,
                       SQ, SK, SDO, TILE_SCALES, DK, DV, stride_gb, stride_gh, stride_gn, sm_scale, N, H, sq_desc,
                       HEAD_DIM: gl.constexpr, SLICE: gl.constexpr, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                       CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr):
    """One 64-row kv tile per program (causal: kv tile 0 sees the most q blocks and runs first)."""
    pid_n = gl.program_id(0)
    bh = gl.program_id(1)
    start_n = pid_n * ROWS
    q_row0 = bh * N
    vb = bh // H
    vh = bh % H
    t_row0 = bh * HEAD_DIM
    if CAUSAL:
        first = start_n // (2 * SLICE)   # the q block holding the diagonal
    else:
        first = 0
    n_blocks = N // (2 * SLICE) - first

    k_smem, v_smem, v_rows, q_smem, lse_smem, do_smem, qt_smem, dot_smem, delta_smem = _allocate(
        k_desc, v_desc, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, ROWS, HEAD_DIM, STAGES, BOTH, True)
    sq_smem = _allocate_token(sq_desc, lse_smem, STAGES, True, True)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([SLICE, SLICE], gl.float32)
    p_smem = gl.allocate_shared_memory(gl.float32, [2, SLICE, SLICE], p_layout)
    kv_bar, full, empty = ring_barriers(STAGES)
    p_full = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    p_empty = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(p_full.index(0), count=1)
    mbarrier.init(p_empty.index(0), count=1)

    out_bh = vb.to(gl.int64) * stride_gb + vh.to(gl.int64) * stride_gh
    SK_tile = SK + bh * N + start_n
    SDO_bh = SDO + bh * (N // (2 * SLICE))
    gl.warp_specialize([
        (_p_role, (k_smem, q_smem, dot_smem, lse_smem, sq_smem, p_smem, kv_bar.index(0), full, empty, p_full, p_empty,
                   SK_tile, SDO_bh, DV + out_bh, stride_gn, start_n, first, n_blocks, sm_scale, HEAD_DIM, CAUSAL,
                   STAGES)),
        (_y_role, (v_rows, do_smem, qt_smem, delta_smem, sq_smem, p_smem, kv_bar.index(0), full, empty, p_full,
                   p_empty, DK + out_bh, stride_gn, start_n, n_blocks, sm_scale, HEAD_DIM, STAGES)),
        (_producer, (k_desc, v_desc, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, k_smem, v_smem,
                     q_smem, do_smem, qt_smem, dot_smem, lse_smem, delta_smem, kv_bar.index(0), full, empty, q_row0,
                     t_row0, vb, vh, start_n, first, n_blocks, STAGES, SLICE, BOTH, True, sq_desc, sq_smem, True)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def run(c, tuning=None) -> None:
    """dK and dV of a backward.BackwardCall in the token contract at head dim 128 (registry: dkdv
    "gluon-roles")."""
    b, h, n, d = c.q8.shape
    args = hopper.dkdv_args(c.q8, c.q, c.s_q, c.k8, c.s_k, c.v, c.do, c.do8t, c.s_do, c.lse2_p, c.delta,
                            c.tile_scales, c.dk, c.dv, kv_rows=ROWS.value, q_rows=2 * SLICE.value, token=True)
    launch("dkdv", _dkdv_roles_kernel, (n // ROWS.value, b * h), *args, HEAD_DIM=d, SLICE=SLICE.value,
           CAUSAL=c.causal, STAGES=STAGES,
           CONSUMER_REGS=CONSUMER_REGS, PRODUCER_REGS=PRODUCER_REGS, num_warps=4, tuning=tuning)
