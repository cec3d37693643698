"""dK/dV kernel for Hopper in Gluon (registry: dkdv "gluon"): backward.py's arithmetic in the same
order (bit-identical dK, dV), with its memory traffic and waits placed by hand. Its per-tile loop
(_kv_tile, _q_block) is also what the default, dkdv_ws_hopper's warp-specialised kernel, runs.

64 kv rows on one warpgroup, two programs per SM, a whole 128-row q block per loop step, each
INT8 dot result converted once per block. At d=64 one launch computes dK and dV (backward.py's
d=64 shape); at d=128 two launches of the same kernel (PASS = DV_ONLY, then DK_ONLY), where
backward.py runs 128 kv rows on two warpgroups that synchronise every step (ncu: barrier stalls
1.1 cycles per instruction). A q block is two 64-row slices a, b; the INT8 dots of a block chain
in int32 on the tensor cores (the dK/dV pass at d=64):

    issue S_a, dP_a | P_a (S_a) -> issue dV_a | dS_a (dP_a) -> issue dK_a | issue S_b, dP_b
    P_b -> issue dV_b (onto dV_a) | dS_b -> issue dK_b (onto dK_a)
    convert dV (while dK_b runs) | convert dK

What makes it faster than the Triton kernel (ncu, (8,16,4096,64) causal, H200; docs/kernel-notes.md)
is not the overlap with the tensor cores (wgmma waits were never a large stall) but
the loads: the Triton kernel spills at 255 registers and reloads inside its loop, and both
versions waited on global loads of LSE, delta and the block scales (long scoreboard 0.7 cycles
per instruction). Here LSE and delta come by TMA with the q block and are read from shared
memory after the S/dP waits (short live ranges, no spills), and the block scales are staged in
shared memory for 32 blocks at a time (_stage_scales). A q block comes as one TMA copy per tensor
(every copy costs a CTA barrier and ~13 instructions here), except in the d=128 dK pass: there
every slice has its own copies and ring barrier, so with one pipeline stage (to keep two
programs per SM) it refills slice a's buffers as soon as slice a is done, while slice b still
runs, and it masks the causal diagonal block inside its main loop instead of running it peeled
before the loop (DK_DIAG_IN_LOOP: the peeled copy made the pass spill). P^ and dS^ reach the
INT8 dots without lane shuffles (as_a_operand: Q^T and dO^T are in k order); dS^ saturates in
the fma itself (_saturated_ds_bits). Triton kernel -> this one, H200: (8,16,4096,64) causal
dK/dV 1.55 -> 1.15 ms; (8,8,4096,128) 1.52 -> 1.13 ms causal, 2.68 -> 1.97 ms without a mask.

By default these passes run as dkdv_ws_hopper's warp-specialised kernel, which calls _q_block
(WS) with a producer warp issuing every copy; this kernel is its bit-identical reference and runs
where it does not apply (a sequence that is not a multiple of 128). The host side: hopper.py.

TOKEN (the token contract, opt-in in the registry): the same kernels with _q_block_token as the
per-block step, backward.py's TOKEN arithmetic: dV = P^T dO in FP8 e4m3 (P with a static scale), and
dK = bf16(dS^T) Q16 (dS from dO as given, Q16 Q itself in bf16 rows, which the ring carries in Q^T's place);
no scale is a maximum. s_Q per q row (S's) comes by TMA with the block, like LSE (docs/kernel-notes.md, "The
token contract's Gluon dK/dV", "Twentieth session").

Limits (registry; else backward.py runs): head_dim 64 or 128, block_q 128, block_kv 64, no
Q-smoothing.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .. import quant

G_MAGIC_F = gl.constexpr(12582912.0)   # 1.5 * 2**23: see _common.MAGIC_F
G_DS_SPAN = gl.constexpr(254.0)   # see _common.saturated_ds_to_int8
G_P_E4M3_SCALE = gl.constexpr(quant.P_E4M3_SCALE)   # see _common.P_E4M3_SCALE

# What one launch computes (PASS): at d=128 dV and dK are two launches, as in backward.py (one
# warpgroup cannot hold both 64 x 128 pairs of fp32 and int32 accumulators).
BOTH = gl.constexpr(0)
DV_ONLY = gl.constexpr(1)
DK_ONLY = gl.constexpr(2)

ROWS = 64       # kv rows per program = block_kv
SLICE = 64      # q rows per slice; a q block (128) is two
STAGES = 2      # q blocks in flight
# d=128's dK pass loads Q^, dO, Q^T per block (80 KB per stage): one stage keeps two programs per
# SM, two would leave one. With each slice refilled as soon as it is done, one stage is the
# faster at every length measured, causal or not (docs/kernel-notes.md).
STAGES_DK128 = 1
# Causal: the d=128 dK pass masks the diagonal q block inside its main loop (a branch taken once)
# instead of running it peeled before the loop. The peeled copy pushed it to 255 registers with
# 160 B spilled, and the spill reloads sat in the loop (~25 LDL/STL per block: wgmma descriptors):
# dV + dK 1.26 -> 1.13 ms at (8,8,4096,128). The other passes do not spill peeled, and
# in-loop masking measured 2-3% slower there.
DK_DIAG_IN_LOOP = True
# The dK pass at d=128 refills each slice's buffers as soon as that slice is done (per-slice copies),
# the other passes load a whole q block per copy.
DK_BLOCKED = False
# The dQ probe's reductions (_kv_tile's DQ_REDUCE, dkdv_ws_hopper's reducer; tools.dq_reduce_probe): none, fp32 as
# they come, fp32 in a fixed order of programs, or int32 fixed point as they come.
NO_DQ = gl.constexpr(0)
UNORDERED_DQ = gl.constexpr(1)
ORDERED_DQ = gl.constexpr(2)
FIXED_DQ = gl.constexpr(3)
PRODUCT_DQ = gl.constexpr(4)   # FIXED_DQ after a real dQ product (its operands' values unwritten)
PRODUCT_X_DQ = gl.constexpr(5)   # PRODUCT_DQ with X^ made and stored by each block (_x_probe)
PRODUCT_Y16_DQ = gl.constexpr(6)   # FIXED_DQ after a bf16 dQ product of Y (stored by each block, _y16_probe)
# A program holds the scales of this many q blocks at a time in shared memory (_stage_scales).
SCALE_CHUNK = gl.constexpr(32)

_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier   # (Triton 3.6: thread_barrier)


@gluon.constexpr_function
def kv_tile_layouts(SLICE, HEAD_DIM):
    """The wgmma layouts of one warpgroup's kv tile (SLICE rows): S^T (INT8 dot), dP^T (16-bit dot),
    the dV/dK accumulators, P^/dS^ as the A operand of the INT8 dots, and the token contract's dK
    accumulator (a bf16 dot's)."""
    acc = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 32])
    return (gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, SLICE, 32]),
            gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, SLICE, 16]),
            acc, gl.DotOperandLayout(operand_index=0, parent=acc, k_width=4),
            gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]))


@gluon.jit
def _seq_copy(desc, vb, vh, row0, row, bar, dest):
    """TMA of v or dO rows row.. of head (vb, vh): a 2-D (B*H*N, D) descriptor, whose head starts at
    row0, or a 4-D (B, H, N, D) one on the tensor's own strides (seq_desc picks)."""
    if len(desc.block_type.shape) == 4:
        tma.async_copy_global_to_shared(desc, [vb, vh, row, 0], bar, dest)
    else:
        tma.async_copy_global_to_shared(desc, [row0 + row, 0], bar, dest)


@gluon.jit
def _load_kv(k_desc, v_desc, k_smem, v_smem, kv_bar, q_row0, start_n, vb, vh, PASS: gl.constexpr):
    """TMA of the program's K^ rows from start_n (and V, unless the dV pass) on kv_bar."""
    if PASS != DV_ONLY:
        mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        _seq_copy(v_desc, vb, vh, q_row0, start_n, kv_bar, v_smem)
    else:
        mbarrier.expect(kv_bar, k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [q_row0 + start_n, 0], kv_bar, k_smem)


@gluon.jit
def _qt_copy(qt_desc, q_row0, t_row0, row, vb, vh, bar, dest, TOKEN: gl.constexpr):
    """TMA of dK's Q operand from q row `row` of the head: Q^T INT8 (rows t_row0.. of the (B*H*D, N) copy, columns
    row..), or TOKEN Q itself in bf16 rows, as dO's (hopper.seq_desc: its own strides, or 2-D when contiguous)."""
    if TOKEN:
        _seq_copy(qt_desc, vb, vh, q_row0, row, bar, dest)
    else:
        tma.async_copy_global_to_shared(qt_desc, [t_row0, row], bar, dest)


@gluon.jit
def _load_block(q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, q_smem, do_smem, qt_smem, dot_smem,
                lse_smem, delta_smem, bars, r, blk, q_row0, t_row0, vb, vh, STAGES: gl.constexpr,
                SLICE: gl.constexpr, PASS: gl.constexpr, sq_desc, sq_smem, TOKEN: gl.constexpr):
    """TMA of all of q block `blk` into ring slot r % STAGES on one barrier, each tensor as one copy of
    the whole block: Q^ and LSE (TOKEN: and s_Q, one scale per q row), dO^T for dV, dO, Q^T (TOKEN: Q
    rows, _qt_copy) and delta for dK. (A Gluon kernel that is not warp specialised puts a CTA barrier and
    ~13 instructions at every copy: at d=64 per-slice copies were 16% of the loop's instructions; per-slice
    barriers measured 6% slower there.)"""
    slot = r % STAGES
    bar = bars.index(2 * slot)
    dv_bytes: gl.constexpr = dot_desc.block_type.nbytes if PASS != DK_ONLY else 0
    dk_bytes: gl.constexpr = (do_desc.block_type.nbytes + qt_desc.block_type.nbytes
                              + delta_desc.block_type.nbytes) if PASS != DV_ONLY else 0
    sq_bytes: gl.constexpr = sq_desc.block_type.nbytes if TOKEN else 0
    mbarrier.expect(bar, q_desc.block_type.nbytes + lse_desc.block_type.nbytes + dv_bytes + dk_bytes + sq_bytes)
    row = blk * 2 * SLICE
    tma.async_copy_global_to_shared(q_desc, [q_row0 + row, 0], bar, q_smem.index(slot))
    if TOKEN:
        tma.async_copy_global_to_shared(sq_desc, [q_row0 + row], bar, sq_smem.index(slot))
    if PASS != DV_ONLY:
        _seq_copy(do_desc, vb, vh, q_row0, row, bar, do_smem.index(slot))
    tma.async_copy_global_to_shared(lse_desc, [q_row0 + row], bar, lse_smem.index(slot))
    if PASS != DK_ONLY:
        tma.async_copy_global_to_shared(dot_desc, [t_row0, row], bar, dot_smem.index(slot))
    if PASS != DV_ONLY:
        _qt_copy(qt_desc, q_row0, t_row0, row, vb, vh, bar, qt_smem.index(slot), TOKEN)
        tma.async_copy_global_to_shared(delta_desc, [q_row0 + row], bar, delta_smem.index(slot))


@gluon.jit
def _load_slice(q_desc, do_desc, qt_desc, lse_desc, delta_desc, q_smem, do_smem, qt_smem, lse_smem, delta_smem,
                bars, r, blk, h, q_row0, t_row0, vb, vh, STAGES: gl.constexpr, SLICE: gl.constexpr, sq_desc, sq_smem,
                TOKEN: gl.constexpr):
    """The dK pass (DK_ONLY): TMA of slice h of q block `blk` into ring slot r % STAGES, on its own
    barrier (Q^, LSE, dO, Q^T, delta; TOKEN: s_Q). A slice's buffers are refilled as soon as its own
    last wgmma is done (the other slice of the block may still be running; TOKEN: at the block's end)."""
    i = 2 * (r % STAGES) + h
    bar = bars.index(i)
    sq_bytes: gl.constexpr = sq_desc.block_type.nbytes if TOKEN else 0
    mbarrier.expect(bar, q_desc.block_type.nbytes + lse_desc.block_type.nbytes + do_desc.block_type.nbytes
                    + qt_desc.block_type.nbytes + delta_desc.block_type.nbytes + sq_bytes)
    row = blk * 2 * SLICE + h * SLICE
    tma.async_copy_global_to_shared(q_desc, [q_row0 + row, 0], bar, q_smem.index(i))
    if TOKEN:
        tma.async_copy_global_to_shared(sq_desc, [q_row0 + row], bar, sq_smem.index(i))
    tma.async_copy_global_to_shared(lse_desc, [q_row0 + row], bar, lse_smem.index(i))
    _seq_copy(do_desc, vb, vh, q_row0, row, bar, do_smem.index(i))
    _qt_copy(qt_desc, q_row0, t_row0, row, vb, vh, bar, qt_smem.index(i), TOKEN)
    tma.async_copy_global_to_shared(delta_desc, [q_row0 + row], bar, delta_smem.index(i))


@gluon.jit
def _rows(smem, slot, h, SLICE: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCKED: gl.constexpr):
    """Slice h of ring slot `slot` as [SLICE, HEAD_DIM] rows (Q^ or dO): part of a block copy
    (BLOCKED: [ring, 2*SLICE, D]) or a slice copy of its own ([2*ring, SLICE, D]); dO buffers may
    be 4-D boxes (1, 1, rows, D)."""
    if BLOCKED:
        view = smem.index(slot).reshape([2 * SLICE, HEAD_DIM]).slice(h * SLICE, SLICE, dim=0)
    else:
        view = smem.index(2 * slot + h).reshape([SLICE, HEAD_DIM])
    return view


@gluon.jit
def _cols(smem, slot, h, SLICE: gl.constexpr, BLOCKED: gl.constexpr):
    """Slice h of ring slot `slot` of a sequence-contiguous copy (Q^T, dO^T) as [D, SLICE]."""
    if BLOCKED:
        view = smem.index(slot).slice(h * SLICE, SLICE, dim=1)
    else:
        view = smem.index(2 * slot + h)
    return view


@gluon.jit
def _slice_vector(smem, slot, h, col: gl.constexpr, SLICE: gl.constexpr, BLOCKED: gl.constexpr):
    """LSE or delta of slice h: a block row of [STAGES, 2*SLICE] (BLOCKED) or a slice row of [2*STAGES, SLICE]."""
    if BLOCKED:
        vector = smem.index(slot).slice(h * SLICE, SLICE).load(col)
    else:
        vector = smem.index(2 * slot + h).load(col)
    return vector


@gluon.jit
def _int8_bits(x, inv):
    """_common.round_scaled_to_int8 up to the final truncation: round(x * inv) in the low byte."""
    return (x * inv + G_MAGIC_F).to(gl.int32, bitcast=True)


@gluon.jit
def _saturated_ds_bits(p, dpt, delta, kq, s_layout: gl.constexpr):
    """_common.saturated_ds_to_int8 up to the final truncation, the same fmas (bit-identical):
    dS = P (dP - delta) saturated at +-127 in three fmas, FFMA.SAT the clamp; delta * kq once
    per column."""
    u = gl.fma(gl.convert_layout(dpt, s_layout), kq, -(delta * kq)[None, :])
    y = gl.minimum(gl.maximum(gl.fma(p, u, 0.5), 0.0), 1.0)
    return gl.fma(y, G_DS_SPAN, G_MAGIC_F - 127.0).to(gl.int32, bitcast=True)


@gluon.jit
def as_a_operand(x, op_layout: gl.constexpr):
    """int8 x (rows, cols) in a wgmma accumulator layout as the A operand of an INT8 wgmma whose B
    operand is a k-ordered copy: _common.to_k_order's column permutation, after which each thread
    already holds its operand bytes (asserted: the conversion moves no data between threads)."""
    R: gl.constexpr = x.shape[0]
    C: gl.constexpr = x.shape[1]
    y = gl.reshape(gl.permute(gl.reshape(x, [R, C // 16, 2, 4, 2]), [0, 1, 3, 2, 4]), [R, C])
    return gl.convert_layout(y, op_layout, assert_trivial=True)


@gluon.jit
def _release(empty, i):
    """Tell a producer warp (dkdv_ws_hopper) that this warpgroup is done with ring entry i: every warp
    has read its LSE and delta, and the wgmmas that read it were waited on."""
    _cta_barrier()   # inside a warp-specialised partition: a named barrier of its own warps
    mbarrier.arrive(empty.index(i))


@gluon.jit
def _slice_probs(st, qk_scale, lse, offs_q, offs_kv, MASK: gl.constexpr, MASK_DIAG: gl.constexpr, diag):
    """P of a slice; the causal mask always (MASK) or only in the block where `diag` (MASK_DIAG)."""
    return _masked_exp2(st.to(gl.float32) * qk_scale - lse[None, :], offs_q, offs_kv, MASK, MASK_DIAG, diag)


@gluon.jit
def _masked_exp2(x, offs_q, offs_kv, MASK: gl.constexpr, MASK_DIAG: gl.constexpr, diag):
    """exp2(x) with _slice_probs' causal mask."""
    if MASK_DIAG:
        # the exp in both branches: with the select alone in one, ptxas predicated it (a compare
        # and a select per element) into every block
        if diag:
            p = gl.where(offs_q[None, :] >= offs_kv[:, None], gl.exp2(x), 0.0)
        else:
            p = gl.exp2(x)
    else:
        p = gl.exp2(x)
        if MASK:
            p = gl.where(offs_q[None, :] >= offs_kv[:, None], p, 0.0)
    return p


@gluon.jit
def _stage_scales(sc_smem, blk0, NQ, SQ_bh, SDO_bh, TS_kv, CHUNK: gl.constexpr, stage_layout: gl.constexpr):
    """The scales of q blocks blk0 .. blk0 + CHUNK - 1 (those < NQ) into sc_smem [CHUNK, 8], one record per
    block: the dQ kernel's (s_P, 1/s_P, s_dS, 1/s_dS) of this kv tile (contiguous: the tile scales are
    kv-major), s_Q, s_dO. Read per block from shared memory, they are no global load in the loop and
    nothing carried across blocks in registers (-2..3% at d=64, a wash at d=128)."""
    rows = blk0 + gl.arange(0, CHUNK, layout=gl.SliceLayout(1, stage_layout))[:, None]
    field = gl.arange(0, 8, layout=gl.SliceLayout(0, stage_layout))[None, :]
    ok = rows < NQ
    tile = gl.load(TS_kv + rows * 4 + field, mask=ok & (field < 4), other=0.0)
    s_q = gl.load(SQ_bh + rows + 0 * field, mask=ok & (field == 4), other=0.0)
    s_do = gl.load(SDO_bh + rows + 0 * field, mask=ok & (field == 5), other=0.0)
    sc_smem.store(gl.where(field < 4, tile, gl.where(field == 4, s_q, s_do)))


@gluon.jit
def _staged_scales(sc_smem, r, CHUNK: gl.constexpr, rec_layout: gl.constexpr):
    """(s_Q, s_dO, s_P, 1/s_P, s_dS, 1/s_dS) of the r-th q block of this program, from _stage_scales'
    record (every thread reads the whole record; picking a field is free in registers)."""
    # the same unswizzled bytes as a ring of records (.index wants a layout of one rank less)
    ring = sc_smem._reinterpret(gl.float32, [CHUNK, 8], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    rec = ring.index(r % CHUNK).load(rec_layout)
    field = gl.arange(0, 8, layout=rec_layout)
    # x + (-0.0) is x: the sums fold away
    return (gl.sum(gl.where(field == 4, rec, -0.0), axis=0), gl.sum(gl.where(field == 5, rec, -0.0), axis=0),
            gl.sum(gl.where(field == 0, rec, -0.0), axis=0), gl.sum(gl.where(field == 1, rec, -0.0), axis=0),
            gl.sum(gl.where(field == 2, rec, -0.0), axis=0), gl.sum(gl.where(field == 3, rec, -0.0), axis=0))


@gluon.jit
def _q_block(r, blk, dv, dk, k_smem, v_tile, q_smem, do_smem, qt_smem, dot_smem, lse_smem, delta_smem, bars,
             q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, n_blocks, q_row0, t_row0, vb, vh, offs_kv,
             sc_smem, k_scale, qk_const, s_layout: gl.constexpr, dp_layout: gl.constexpr, acc_layout: gl.constexpr,
             op_layout: gl.constexpr, STAGES: gl.constexpr, SLICE: gl.constexpr, KV_BLOCK: gl.constexpr,
             HEAD_DIM: gl.constexpr, PASS: gl.constexpr, BLOCKED: gl.constexpr, HAS_A: gl.constexpr,
             MASK_A: gl.constexpr, MASK_B: gl.constexpr, rec_layout: gl.constexpr, MASK_DIAG: gl.constexpr,
             diag, empty, WS: gl.constexpr):
    """dV, dK after q block `blk` (ring slot r). Slice a (rows 0-63 of the block) runs only if
    HAS_A; MASK_* apply the causal mask (the slice holding the diagonal); MASK_DIAG applies it to
    both slices where the runtime `diag` holds (the diagonal block masked inside the main loop,
    DK_DIAG_IN_LOOP); PASS: BOTH, DV_ONLY or DK_ONLY (the other accumulator is returned unchanged).
    WS (dkdv_ws_hopper): a producer warp fills the ring; instead of refilling a slot, the block
    arrives on its `empty` barrier where the refill would be."""
    slot = r % STAGES
    q_scale, s_do, p_scale, p_inv, ds_scale, ds_inv = _staged_scales(sc_smem, r, SCALE_CHUNK, rec_layout)
    # backward.py's products, in its order
    qk_scale = (q_scale * k_scale) * qk_const
    dv_scale = p_scale * s_do
    dk_scale = ds_scale * q_scale
    ds_kq = ds_inv * (1.0 / G_DS_SPAN)   # see _common.saturated_ds_to_int8
    col: gl.constexpr = gl.SliceLayout(0, s_layout)
    offs_a = blk * 2 * SLICE + gl.arange(0, SLICE, layout=col)
    offs_b = offs_a + SLICE
    zero_s = gl.zeros([SLICE, SLICE], gl.int32, s_layout)
    zero_dp = gl.zeros([SLICE, SLICE], gl.float32, dp_layout)
    zero_acc = gl.zeros([SLICE, HEAD_DIM], gl.int32, acc_layout)

    phase = (r // STAGES) & 1
    if PASS == DV_ONLY:
        # Both S slices first: slice b's runs on the tensor cores while slice a's P is made.
        mbarrier.wait(bars.index(2 * slot), phase)   # also when slice a is unused: it must land before its refill
        if HAS_A:
            st_a = warpgroup_mma(k_smem, _rows(q_smem, slot, 0, SLICE, HEAD_DIM, BLOCKED).permute((1, 0)), zero_s,
                                 use_acc=False, is_async=True)
        st_b = warpgroup_mma(k_smem, _rows(q_smem, slot, 1, SLICE, HEAD_DIM, BLOCKED).permute((1, 0)),
                             zero_s, use_acc=False, is_async=True)
        if HAS_A:
            st_a = warpgroup_mma_wait(1, deps=[st_a])
            p_a = _slice_probs(st_a, qk_scale, _slice_vector(lse_smem, slot, 0, col, SLICE, BLOCKED), offs_a, offs_kv,
                               MASK_A, MASK_DIAG, diag)
            p8_a = as_a_operand(_int8_bits(p_a, p_inv).to(gl.int8), op_layout)
            dv_int = warpgroup_mma(p8_a, _cols(dot_smem, slot, 0, SLICE, BLOCKED).permute((1, 0)),
                                   zero_acc, use_acc=False, is_async=True)
            st_b = warpgroup_mma_wait(1, deps=[st_b])
        else:
            st_b = warpgroup_mma_wait(0, deps=[st_b])
        p_b = _slice_probs(st_b, qk_scale, _slice_vector(lse_smem, slot, 1, col, SLICE, BLOCKED), offs_b, offs_kv,
                           MASK_B, MASK_DIAG, diag)
        p8_b = as_a_operand(_int8_bits(p_b, p_inv).to(gl.int8), op_layout)
        if HAS_A:
            dv_int = warpgroup_mma(p8_b, _cols(dot_smem, slot, 1, SLICE, BLOCKED).permute((1, 0)),
                                   dv_int, is_async=True)
        else:
            dv_int = warpgroup_mma(p8_b, _cols(dot_smem, slot, 1, SLICE, BLOCKED).permute((1, 0)),
                                   zero_acc, use_acc=False, is_async=True)
    else:
        mbarrier.wait(bars.index(2 * slot), phase)
        if HAS_A:
            st_a = warpgroup_mma(k_smem, _rows(q_smem, slot, 0, SLICE, HEAD_DIM, BLOCKED).permute((1, 0)),
                                 zero_s, use_acc=False, is_async=True)
            dpt_a = warpgroup_mma(v_tile, _rows(do_smem, slot, 0, SLICE, HEAD_DIM, BLOCKED).permute((1, 0)),
                                  zero_dp, use_acc=False, is_async=True)
            st_a = warpgroup_mma_wait(1, deps=[st_a])
            lse_a = _slice_vector(lse_smem, slot, 0, col, SLICE, BLOCKED)
            p_a = _slice_probs(st_a, qk_scale, lse_a, offs_a, offs_kv, MASK_A, MASK_DIAG, diag)
            if PASS == BOTH:
                p8_a = as_a_operand(_int8_bits(p_a, p_inv).to(gl.int8), op_layout)
                dv_int = warpgroup_mma(p8_a, _cols(dot_smem, slot, 0, SLICE, BLOCKED).permute((1, 0)),
                                       zero_acc, use_acc=False, is_async=True)
            dpt_a = warpgroup_mma_wait(1 if PASS == BOTH else 0, deps=[dpt_a])
            delta_a = _slice_vector(delta_smem, slot, 0, col, SLICE, BLOCKED)
            ds8_a = as_a_operand(_saturated_ds_bits(p_a, dpt_a, delta_a, ds_kq, s_layout).to(gl.int8),
                                  op_layout)
            dk_int = warpgroup_mma(ds8_a, _cols(qt_smem, slot, 0, SLICE, BLOCKED).permute((1, 0)),
                                   zero_acc, use_acc=False, is_async=True)
        if not BLOCKED:
            mbarrier.wait(bars.index(2 * slot + 1), phase)
        st_b = warpgroup_mma(k_smem, _rows(q_smem, slot, 1, SLICE, HEAD_DIM, BLOCKED).permute((1, 0)),
                             zero_s, use_acc=False, is_async=True)
        dpt_b = warpgroup_mma(v_tile, _rows(do_smem, slot, 1, SLICE, HEAD_DIM, BLOCKED).permute((1, 0)),
                              zero_dp, use_acc=False, is_async=True)
        st_b = warpgroup_mma_wait(1, deps=[st_b])
        # dK pass: slice a's wgmmas are all done (issued before S_b): refill its buffers now, so
        # with one pipeline stage the next block's first half loads during this one's second half
        # (at d=64 the early refill measured no better and costs registers: both refill at the end)
        if WS:
            if not BLOCKED:
                _release(empty, 2 * slot)
        elif not BLOCKED and r + STAGES < n_blocks:
            _load_slice(q_desc, do_desc, qt_desc, lse_desc, delta_desc, q_smem, do_smem, qt_smem, lse_smem,
                        delta_smem, bars, r + STAGES, blk + STAGES, 0, q_row0, t_row0, vb, vh, STAGES, SLICE,
                        lse_desc, lse_smem, False)
        lse_b = _slice_vector(lse_smem, slot, 1, col, SLICE, BLOCKED)
        p_b = _slice_probs(st_b, qk_scale, lse_b, offs_b, offs_kv, MASK_B, MASK_DIAG, diag)
        if PASS == BOTH:
            p8_b = as_a_operand(_int8_bits(p_b, p_inv).to(gl.int8), op_layout)
            if HAS_A:
                dv_int = warpgroup_mma(p8_b, _cols(dot_smem, slot, 1, SLICE, BLOCKED).permute((1, 0)),
                                       dv_int, is_async=True)
            else:
                dv_int = warpgroup_mma(p8_b, _cols(dot_smem, slot, 1, SLICE, BLOCKED).permute((1, 0)), zero_acc,
                                       use_acc=False, is_async=True)
        dpt_b = warpgroup_mma_wait(1 if PASS == BOTH else 0, deps=[dpt_b])
        delta_b = _slice_vector(delta_smem, slot, 1, col, SLICE, BLOCKED)
        ds8_b = as_a_operand(_saturated_ds_bits(p_b, dpt_b, delta_b, ds_kq, s_layout).to(gl.int8),
                              op_layout)
        if HAS_A:
            dk_int = warpgroup_mma(ds8_b, _cols(qt_smem, slot, 1, SLICE, BLOCKED).permute((1, 0)),
                                   dk_int, is_async=True)
        else:
            dk_int = warpgroup_mma(ds8_b, _cols(qt_smem, slot, 1, SLICE, BLOCKED).permute((1, 0)),
                                   zero_acc, use_acc=False, is_async=True)
    if PASS == BOTH:
        dv_int = warpgroup_mma_wait(1, deps=[dv_int])
        dv += dv_int.to(gl.float32) * dv_scale
        dk_int = warpgroup_mma_wait(0, deps=[dk_int])
        dk += dk_int.to(gl.float32) * dk_scale
    elif PASS == DV_ONLY:
        dv_int = warpgroup_mma_wait(0, deps=[dv_int])
        dv += dv_int.to(gl.float32) * dv_scale
    else:
        dk_int = warpgroup_mma_wait(0, deps=[dk_int])
        dk += dk_int.to(gl.float32) * dk_scale
    if WS:
        _release(empty, 2 * slot + (0 if BLOCKED else 1))
    elif r + STAGES < n_blocks:   # the slot is free again (in the dK pass, slice a was refilled already)
        if BLOCKED:
            _load_block(q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, q_smem, do_smem, qt_smem,
                        dot_smem, lse_smem, delta_smem, bars, r + STAGES, blk + STAGES, q_row0, t_row0, vb, vh, STAGES,
                        SLICE, PASS, lse_desc, lse_smem, False)
        else:
            _load_slice(q_desc, do_desc, qt_desc, lse_desc, delta_desc, q_smem, do_smem, qt_smem, lse_smem,
                        delta_smem, bars, r + STAGES, blk + STAGES, 1, q_row0, t_row0, vb, vh, STAGES, SLICE,
                        lse_desc, lse_smem, False)
    return dv, dk


@gluon.jit
def _slice_dot(op, smem, slot, h: gl.constexpr, acc, USE_ACC: gl.constexpr, SLICE: gl.constexpr,
               BLOCKED: gl.constexpr):
    """op (an A operand in registers) times slice h's tile of a sequence-contiguous copy in `smem`,
    into `acc` (a fresh accumulator unless USE_ACC); issued asynchronously."""
    return warpgroup_mma(op, _cols(smem, slot, h, SLICE, BLOCKED).permute((1, 0)), acc, use_acc=USE_ACC,
                         is_async=True)


@gluon.jit
def _rows_dot(x_a, x_b, smem, slot, op_layout: gl.constexpr, zero_acc, HAS_A: gl.constexpr,
              SLICE: gl.constexpr, BLOCKED: gl.constexpr):
    """The token contract's dV = P^T dO of one q block (backward.py's TOKEN branch): the rows of x^T (kv rows, 256 P^T
    as exp2 gives it: P <= 1 needs no maximum; both q slices, x_a read only if HAS_A) in FP8 e4m3, times the slices'
    e4m3 dO^T tiles in `smem`, chained in fp32 from zero_acc; issued asynchronously."""
    if HAS_A:
        acc = _slice_dot(as_a_operand(x_a.to(gl.float8e4nv), op_layout), smem, slot, 0, zero_acc, False, SLICE,
                         BLOCKED)
        return _slice_dot(as_a_operand(x_b.to(gl.float8e4nv), op_layout), smem, slot, 1, acc, True, SLICE, BLOCKED)
    return _slice_dot(as_a_operand(x_b.to(gl.float8e4nv), op_layout), smem, slot, 1, zero_acc, False, SLICE, BLOCKED)


@gluon.jit
def _rows_dot16(x_a, x_b, smem, slot, acc, HAS_A: gl.constexpr, SLICE: gl.constexpr, HEAD_DIM: gl.constexpr,
                BLOCKED: gl.constexpr):
    """The token contract's dK = bf16(dS^T) Q16 of one q block (simulate.token_dk), added into acc (fp32, in a bf16
    dot's accumulator layout, across the q blocks): the rows of x^T (kv rows, 256 dS^T; both q slices, x_a read only
    if HAS_A) rounded to bf16 as A operands from registers, times the slices' Q rows in `smem` (bf16 [q, D]: an
    MN-major B, which 16-bit wgmma takes); issued asynchronously. No scale."""
    op16: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
    if HAS_A:
        acc = warpgroup_mma(gl.convert_layout(x_a.to(gl.bfloat16), op16), _rows(smem, slot, 0, SLICE, HEAD_DIM,
                                                                                  BLOCKED), acc, is_async=True)
    return warpgroup_mma(gl.convert_layout(x_b.to(gl.bfloat16), op16), _rows(smem, slot, 1, SLICE, HEAD_DIM, BLOCKED),
                         acc, is_async=True)


@gluon.jit
def _token_probs(st, kq, sq, lse, offs_q, offs_kv, MASK: gl.constexpr, MASK_DIAG: gl.constexpr, diag):
    """256 P^T of a slice in the token contract, as backward.py (TOKEN) computes it: S^T = int(K^ Q^T) *
    (s_K qk_const) per kv row * s_Q per q column, then exp2(S^T - lse), lse = LSE2 - log2(256); masked as
    _slice_probs. The
    second multiply and the subtraction become one fma, by the same contraction as in backward.py
    (written as a subtraction: gl.fma(a, b, -c) would materialise -c as 0 - c, one FADD per column)."""
    return _masked_exp2(st.to(gl.float32) * kq[:, None] * sq[None, :] - lse[None, :], offs_q, offs_kv, MASK,
                        MASK_DIAG, diag)


@gluon.jit
def _token_ds(p, dpt, delta, s_layout: gl.constexpr):
    """dS^T = P^T (dP^T - delta), as backward.py: one subtraction of delta (the delta ring's, per q column), then
    the multiply by P^T (256 P^T: dS^T comes out 256 times, as dK's terms)."""
    return p * (gl.convert_layout(dpt, s_layout) - delta[None, :])


@gluon.jit
def _x_probe(y, kq, dst):
    """A fused backward's X^ of one q slice, for its cost (tools.dq_reduce_probe): X^T = dS^T s_K with one
    multiply per element (kq stands in for s_K), its maximum per q
    column over this warpgroup's kv rows (a fused kernel also exchanges it with the other warpgroup), INT8 by
    it, stored transposed (q rows, keys contiguous: the dQ product's A operand) into the first SLICE keys of dst."""
    x = y * kq[:, None]
    cmax = gl.max(gl.abs(x), axis=0)
    inv = gl.where(cmax > 0, 127.0 / gl.maximum(cmax, 1e-30), 0.0)
    dst.slice(0, x.shape[0], dim=1).permute((1, 0)).store(_int8_bits(x, inv[None, :]).to(gl.int8))


@gluon.jit
def _y16_probe(y, dst):
    """A fused backward's dQ operand of one q slice in bf16, for its cost (tools.dq_reduce_probe): 256 dS^T (what
    dK's path already holds in fp32) rounded to bf16 and stored transposed (q rows, keys contiguous: the bf16 dQ
    product's A operand) into the first SLICE keys of dst; 1 / 256 would scale dQ at the end. No maximum: the
    product is 16-bit (simulate.token_dq)."""
    dst.slice(0, y.shape[0], dim=1).permute((1, 0)).store(y.to(gl.bfloat16))


@gluon.jit
def _q_block_token(r, blk, dv, dk, k_smem, v_tile, q_smem, do_smem, qt_smem, dot_smem, lse_smem, delta_smem, sq_smem,
                   bars, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, sq_desc, n_blocks, q_row0, t_row0,
                   vb, vh, offs_kv, kq, SDO_bh, s_layout: gl.constexpr, dp_layout: gl.constexpr,
                   acc_layout: gl.constexpr, op_layout: gl.constexpr, STAGES: gl.constexpr, SLICE: gl.constexpr,
                   HEAD_DIM: gl.constexpr, PASS: gl.constexpr, BLOCKED: gl.constexpr, HAS_A: gl.constexpr,
                   MASK_A: gl.constexpr, MASK_B: gl.constexpr, MASK_DIAG: gl.constexpr, diag, empty, WS: gl.constexpr,
                   dq_x, DQ_MODE: gl.constexpr):
    """_q_block in the token contract (backward.py's TOKEN branches, in its order): dV, dK after q block
    `blk` (ring slot r); kq = s_K qk_const per kv row; the same flags as _q_block.

    dV = P^T dO is FP8 e4m3: 256 P^T with no maximum (P <= 1) times dO^T's e4m3 tiles, chained over
    both slices in fp32 and scaled by s_dO / 256, one number per q block. The LSE ring holds LSE2 -
    log2(256) (backward_preprocess), so exp2 yields 256 P^T with no multiply; dS^T is then 256 times
    too (a power of two: bf16(256 dS^T) = 256 bf16(dS^T)), and the kernel's last dK scale divides by 256.
    dK += bf16(dS^T) Q16 (dP^T from dO as given, Q16 Q itself in bf16 rows from the ring: simulate.token_dk) is a
    bf16 product chained into the dK accumulator across the q blocks, with no scale. Order, to keep
    at most three 64 x 64 fp32 tiles beside the accumulators (d=64, BOTH): S^T of both slices issued;
    P^T of slice a; dP^T of slice a issued; P^T of slice b; dV of both issued; dS^T of slice a; dP^T of
    slice b; dV added; dS^T of slice b; dK of both. Slice a (HAS_A False: wholly above the causal
    diagonal) is then skipped: its P^T is 0, which adds nothing to dV or dK.
    The ring entry (both slices) is released at the block's end. DQ_MODE (tools.dq_reduce_probe; NO_DQ by default):
    while dK's product runs, a fused backward's dQ operand of both slices is made and stored to dq_x: X^ (_x_probe)
    with PRODUCT_X_DQ, dS in bf16 (_y16_probe) with PRODUCT_Y16_DQ."""
    slot = r % STAGES
    phase = (r // STAGES) & 1
    s_do = gl.load(SDO_bh + blk)   # dO^'s scale: per q block, as in the block contract
    col: gl.constexpr = gl.SliceLayout(0, s_layout)
    offs_a = blk * 2 * SLICE + gl.arange(0, SLICE, layout=col)
    offs_b = offs_a + SLICE
    zero_s = gl.zeros([SLICE, SLICE], gl.int32, s_layout)
    zero_dp = gl.zeros([SLICE, SLICE], gl.float32, dp_layout)
    DK_PASS: gl.constexpr = PASS != DV_ONLY
    DV_PASS: gl.constexpr = PASS != DK_ONLY

    # S^T of both slices; the d=128 dK pass: dP^T of slice a too (at d=64, BOTH, it is issued once slice
    # a's P^T is made: with three products in flight (96 registers) beside dV and dK the pass was 4%
    # slower without a mask, docs/kernel-notes.md).
    # wgmma groups complete in issue order: each wait's count is what may still be in flight after it.
    # EARLY (d=128): slice a's s_Q and LSE columns are read before the products are issued. Read
    # after, they queue behind the wgmmas' shared-memory reads, and the fmas that use them waited on
    # the short scoreboard (ncu). At d=64 their 32 registers, live across the issue, made ptxas
    # wait for S^T of slice b before slice a's P^T, which cost more (docs/kernel-notes.md).
    EARLY: gl.constexpr = HEAD_DIM > 64
    mbarrier.wait(bars.index(2 * slot), phase)
    if HAS_A:
        if EARLY:
            sq_a = _slice_vector(sq_smem, slot, 0, col, SLICE, BLOCKED)
            lse_a = _slice_vector(lse_smem, slot, 0, col, SLICE, BLOCKED)
        st_a = warpgroup_mma(k_smem, _rows(q_smem, slot, 0, SLICE, HEAD_DIM, BLOCKED).permute((1, 0)), zero_s,
                             use_acc=False, is_async=True)
        if PASS == DK_ONLY:
            dpt_a = warpgroup_mma(v_tile, _rows(do_smem, slot, 0, SLICE, HEAD_DIM, BLOCKED).permute((1, 0)),
                                  zero_dp, use_acc=False, is_async=True)
    if not BLOCKED:
        mbarrier.wait(bars.index(2 * slot + 1), phase)
    st_b = warpgroup_mma(k_smem, _rows(q_smem, slot, 1, SLICE, HEAD_DIM, BLOCKED).permute((1, 0)), zero_s,
                         use_acc=False, is_async=True)
    if HAS_A:
        st_a = warpgroup_mma_wait(2 if PASS == DK_ONLY else 1, deps=[st_a])
        if not EARLY:
            sq_a = _slice_vector(sq_smem, slot, 0, col, SLICE, BLOCKED)
            lse_a = _slice_vector(lse_smem, slot, 0, col, SLICE, BLOCKED)
        p_a = _token_probs(st_a, kq, sq_a, lse_a, offs_a, offs_kv, MASK_A, MASK_DIAG, diag)
        if PASS == BOTH:
            dpt_a = warpgroup_mma(v_tile, _rows(do_smem, slot, 0, SLICE, HEAD_DIM, BLOCKED).permute((1, 0)),
                                  zero_dp, use_acc=False, is_async=True)
        if PASS == DK_ONLY:
            dpt_a = warpgroup_mma_wait(1, deps=[dpt_a])
            p_a = _token_ds(p_a, dpt_a, _slice_vector(delta_smem, slot, 0, col, SLICE, BLOCKED), s_layout)   # dS^T
    if PASS == DK_ONLY:   # dP^T of slice b only now: all four tiles in flight spilled at d=128
        dpt_b = warpgroup_mma(v_tile, _rows(do_smem, slot, 1, SLICE, HEAD_DIM, BLOCKED).permute((1, 0)), zero_dp,
                              use_acc=False, is_async=True)
        st_b = warpgroup_mma_wait(1, deps=[st_b])
    elif HAS_A and DK_PASS:
        st_b = warpgroup_mma_wait(1, deps=[st_b])
    else:
        st_b = warpgroup_mma_wait(0, deps=[st_b])
    sq_b = _slice_vector(sq_smem, slot, 1, col, SLICE, BLOCKED)
    p_b = _token_probs(st_b, kq, sq_b, _slice_vector(lse_smem, slot, 1, col, SLICE, BLOCKED), offs_b, offs_kv,
                       MASK_B, MASK_DIAG, diag)

    if DV_PASS:
        # dV = P^T dO in FP8 e4m3, both slices chained in fp32; the q block's scale is one number
        dv_prod = _rows_dot(p_a if HAS_A else p_b, p_b, dot_smem, slot, op_layout,
                            gl.zeros([SLICE, HEAD_DIM], gl.float32, acc_layout), HAS_A, SLICE, BLOCKED)
        dv_scale = s_do * (1.0 / G_P_E4M3_SCALE)   # exact: a power of two
    if PASS == BOTH:
        # dS^T of slice a (its dP^T was issued before the dV dots), then slice b's dP^T
        if HAS_A:   # delta read before the wait, so that its latency runs with it
            delta_a = _slice_vector(delta_smem, slot, 0, col, SLICE, BLOCKED)
            dpt_a = warpgroup_mma_wait(2, deps=[dpt_a])
            p_a = _token_ds(p_a, dpt_a, delta_a, s_layout)   # dS^T
        dpt_b = warpgroup_mma(v_tile, _rows(do_smem, slot, 1, SLICE, HEAD_DIM, BLOCKED).permute((1, 0)), zero_dp,
                              use_acc=False, is_async=True)
        dv_prod = warpgroup_mma_wait(1, deps=[dv_prod])
        dv += dv_prod * dv_scale
        delta_b = _slice_vector(delta_smem, slot, 1, col, SLICE, BLOCKED)   # likewise before the wait
        dpt_b = warpgroup_mma_wait(0, deps=[dpt_b])
    elif PASS == DV_ONLY:
        dv_prod = warpgroup_mma_wait(0, deps=[dv_prod])
        dv += dv_prod * dv_scale
    else:
        dpt_b = warpgroup_mma_wait(0, deps=[dpt_b])

    if DK_PASS:
        # dK += bf16(dS^T) Q16 (Q itself in bf16 rows): a 16-bit product, no scale to find
        if PASS != BOTH:
            delta_b = _slice_vector(delta_smem, slot, 1, col, SLICE, BLOCKED)
        y_b = _token_ds(p_b, dpt_b, delta_b, s_layout)
        dk_next = _rows_dot16(p_a if HAS_A else y_b, y_b, qt_smem, slot, dk, HAS_A, SLICE, HEAD_DIM, BLOCKED)
        if DQ_MODE == PRODUCT_Y16_DQ:
            if HAS_A:
                _y16_probe(p_a, dq_x.index(0))
            _y16_probe(y_b, dq_x.index(1))
        if DQ_MODE == PRODUCT_X_DQ:
            if HAS_A:
                _x_probe(p_a, kq, dq_x.index(0))
            _x_probe(y_b, kq, dq_x.index(1))
        dk = warpgroup_mma_wait(0, deps=[dk_next])

    if WS:
        _cta_barrier()   # as _release, for both slices' entries
        mbarrier.arrive(empty.index(2 * slot))
        if not BLOCKED:
            mbarrier.arrive(empty.index(2 * slot + 1))
    elif r + STAGES < n_blocks:
        if BLOCKED:
            _load_block(q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, q_smem, do_smem, qt_smem,
                        dot_smem, lse_smem, delta_smem, bars, r + STAGES, blk + STAGES, q_row0, t_row0, vb, vh, STAGES,
                        SLICE, PASS, sq_desc, sq_smem, True)
        else:
            for h in gl.static_range(2):
                _load_slice(q_desc, do_desc, qt_desc, lse_desc, delta_desc, q_smem, do_smem, qt_smem, lse_smem,
                            delta_smem, bars, r + STAGES, blk + STAGES, h, q_row0, t_row0, vb, vh, STAGES, SLICE,
                            sq_desc, sq_smem, True)
    return dv, dk


@gluon.jit
def _q_step(r, blk, dv, dk, k_smem, v_tile, q_smem, do_smem, qt_smem, dot_smem, lse_smem, delta_smem, bars,
            q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, n_blocks, q_row0, t_row0, vb, vh, offs_kv,
            sc_smem, k_scale, qk_const, s_layout: gl.constexpr, dp_layout: gl.constexpr, acc_layout: gl.constexpr,
            op_layout: gl.constexpr, STAGES: gl.constexpr, SLICE: gl.constexpr, HEAD_DIM: gl.constexpr,
            PASS: gl.constexpr, BLOCKED: gl.constexpr, HAS_A: gl.constexpr, MASK_A: gl.constexpr, MASK_B: gl.constexpr,
            rec_layout: gl.constexpr, MASK_DIAG: gl.constexpr, diag, empty, WS: gl.constexpr, sq_smem, sq_desc,
            SDO_bh, TOKEN: gl.constexpr, dq_x, DQ_MODE: gl.constexpr):
    """One q block of _kv_tile's loop in the contract TOKEN names: _q_block_token (k_scale: s_K qk_const
    per kv row; s_Q and s_dO from sq_smem and SDO_bh) or _q_block (k_scale: the tile's; sc_smem's records)."""
    if TOKEN:
        dv, dk = _q_block_token(r, blk, dv, dk, k_smem, v_tile, q_smem, do_smem, qt_smem, dot_smem, lse_smem,
                                delta_smem, sq_smem, bars, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc,
                                sq_desc, n_blocks, q_row0, t_row0, vb, vh, offs_kv, k_scale, SDO_bh, s_layout,
                                dp_layout, acc_layout, op_layout, STAGES, SLICE, HEAD_DIM, PASS, BLOCKED, HAS_A,
                                MASK_A, MASK_B, MASK_DIAG, diag, empty, WS, dq_x, DQ_MODE)
    else:
        dv, dk = _q_block(r, blk, dv, dk, k_smem, v_tile, q_smem, do_smem, qt_smem, dot_smem, lse_smem, delta_smem,
                          bars, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, n_blocks, q_row0, t_row0,
                          vb, vh, offs_kv, sc_smem, k_scale, qk_const, s_layout, dp_layout, acc_layout, op_layout,
                          STAGES, SLICE, SLICE, HEAD_DIM, PASS, BLOCKED, HAS_A, MASK_A, MASK_B, rec_layout,
                          MASK_DIAG, diag, empty, WS)
    return dv, dk


@gluon.jit
def _dq_reduce_probe(r, acc, stage, dq_full, dq_empty, half, dq_scale, dq_x, dq_kt, MODE: gl.constexpr,
                     NSTAGE: gl.constexpr, acc_layout: gl.constexpr):
    """A fused backward's dQ partial (tools.dq_reduce_probe): the warpgroup's fp32 [SLICE, D] accumulator `acc`
    stands in for it and goes to stage r % NSTAGE (two let the reducer warp of dkdv_ws_hopper lag one q block; the
    product variants have shared memory for one) and is handed to that warp (barriers 2 half + r % NSTAGE), which
    adds it into dQ by TMA. FIXED_DQ:
    as int32 round(acc dq_scale), fixed point, whose adds give the same bits in any order. PRODUCT_DQ: the partial
    is a real INT8 product first, dq_x[half] (SLICE q rows x 2 SLICE keys, not written: its cost, not its values)
    times dq_kt^T, waited on and converted, then added as FIXED_DQ; PRODUCT_X_DQ: the same, with dq_x written by
    _x_probe in each block; PRODUCT_Y16_DQ: a bf16 product of dq_x (Y, written by _y16_probe in each block) and
    dq_kt (K^T in bf16, not written), then added as FIXED_DQ."""
    slot = r % NSTAGE
    if r >= NSTAGE:   # the reducer has read what this stage held NSTAGE blocks ago
        mbarrier.wait(dq_empty.index(2 * half + slot), ((r // NSTAGE) - 1) & 1)
    if MODE == PRODUCT_Y16_DQ:   # bf16: dq_x holds Y (SLICE q rows x 2 SLICE keys), dq_kt K^T
        acc16: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, acc.shape[1], 16])
        prod = warpgroup_mma(dq_x.index(half), dq_kt.permute((1, 0)), gl.zeros(acc.shape, gl.float32, acc16),
                             use_acc=False, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[prod])
    elif MODE >= PRODUCT_DQ:
        prod = warpgroup_mma(dq_x.index(half), dq_kt.permute((1, 0)), gl.zeros(acc.shape, gl.int32, acc_layout),
                             use_acc=False, is_async=True)
        prod = warpgroup_mma_wait(0, deps=[prod])
        acc = prod.to(gl.float32)
    if MODE >= FIXED_DQ:
        stage.index(slot).store(gl.inline_asm_elementwise("cvt.rni.s32.f32 $0, $1;", "=r,r", [acc * dq_scale],
                                                          dtype=gl.int32, is_pure=True, pack=1))
    else:
        stage.index(slot).store(acc)
    fence_async_shared()
    _cta_barrier()
    mbarrier.arrive(dq_full.index(2 * half + slot))


@gluon.jit
def _kv_tile(k_tile, v_tile, q_smem, do_smem, qt_smem, dot_smem, lse_smem, delta_smem, sc_smem, kv_bar, full, empty,
             q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, SK_tile, SQ_bh, SDO_bh, TS_kv, DK_bh, DV_bh,
             stride_gn, start_n, first, n_blocks, NQ, q_row0, t_row0, vb, vh, sm_scale, diag_in_a,
             HEAD_DIM: gl.constexpr, SLICE: gl.constexpr, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
             PASS: gl.constexpr, BLOCKED: gl.constexpr, DIAG_IN_LOOP: gl.constexpr, WS: gl.constexpr, sq_smem,
             sq_desc, TOKEN: gl.constexpr, dq_stage, dq_full, dq_empty, dq_scale, dq_x, dq_kt,
             DQ_REDUCE: gl.constexpr, DQ_STAGES: gl.constexpr):
    """dK and/or dV of the SLICE kv rows from start_n on one warpgroup, from its K^ (and V) landing
    on kv_bar to the stores: the main loop over the q blocks `first` .. NQ - 1 in ring `full`,
    which the caller has started to fill (_dkdv_kernel) or a producer warp fills (WS,
    dkdv_ws_hopper). Causal with the diagonal block peeled: `diag_in_a` says whether these rows are
    its slice a (a runtime value here, a constexpr in dkdv_ws_hopper).
    TOKEN (the token contract): SK_tile points to the tile's per-row s_K, the ring carries s_Q per
    q row (sq_smem), SDO_bh gives s_dO per q block; no staged records (sc_smem, TS_kv unused).
    DQ_REDUCE (a measurement, tools.dq_reduce_probe; NO_DQ by default): after each q block the tile's dK
    accumulator goes to dq_stage (DQ_STAGES deep) for dkdv_ws_hopper's reducer warp (_dq_reduce_probe: dq_full,
    dq_empty its barriers, dq_scale the fixed point's, dq_x and dq_kt the product's operands), the work a fused
    backward's dQ partials would make; dK and dV are unchanged."""
    # _stage_scales: [SCALE_CHUNK, 8] records, 2 per thread; _staged_scales: a whole record per thread
    stage_layout: gl.constexpr = gl.BlockedLayout([1, 2], [8, 4], [4, 1], [1, 0])
    rec_layout: gl.constexpr = gl.BlockedLayout([8], [32], [4], [0])
    s_layout: gl.constexpr = kv_tile_layouts(SLICE, HEAD_DIM)[0]
    dp_layout: gl.constexpr = kv_tile_layouts(SLICE, HEAD_DIM)[1]
    acc_layout: gl.constexpr = kv_tile_layouts(SLICE, HEAD_DIM)[2]
    op_layout: gl.constexpr = kv_tile_layouts(SLICE, HEAD_DIM)[3]
    acc16_layout: gl.constexpr = kv_tile_layouts(SLICE, HEAD_DIM)[4]

    if TOKEN:   # s_K qk_const per kv row, as backward.py's qk_scale
        k_scale = gl.load(SK_tile + gl.arange(0, SLICE, layout=gl.SliceLayout(1, s_layout))) * (
            sm_scale * 1.4426950408889634)
    else:
        k_scale = gl.load(SK_tile)
        _stage_scales(sc_smem, first, NQ, SQ_bh, SDO_bh, TS_kv, SCALE_CHUNK, stage_layout)
    qk_const = sm_scale * 1.4426950408889634
    offs_kv = start_n + gl.arange(0, SLICE, layout=gl.SliceLayout(1, s_layout))
    dv = gl.zeros([SLICE, HEAD_DIM], gl.float32, acc_layout)
    # the token contract's dK is a bf16 product's accumulator (_rows_dot16), the block contract's INT8 products' sum
    dk = gl.zeros([SLICE, HEAD_DIM], gl.float32, acc16_layout if TOKEN else acc_layout)
    if not TOKEN:
        _cta_barrier()   # the records are in shared memory
    mbarrier.wait(kv_bar, 0)

    loop_start = 0
    MASK_IN_LOOP: gl.constexpr = CAUSAL and DIAG_IN_LOOP
    if CAUSAL and not DIAG_IN_LOOP:
        # The diagonal block, peeled (else the loop masks it: DK_DIAG_IN_LOOP): the kv rows are its
        # slice a (slice a masked, b full) or its slice b (slice a wholly above the diagonal:
        # skipped; b masked).
        if diag_in_a:
            dv, dk = _q_step(0, first, dv, dk, k_tile, v_tile, q_smem, do_smem, qt_smem, dot_smem, lse_smem,
                              delta_smem, full, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, n_blocks,
                              q_row0, t_row0, vb, vh, offs_kv, sc_smem, k_scale, qk_const, s_layout, dp_layout,
                              acc_layout, op_layout, STAGES, SLICE, HEAD_DIM, PASS, BLOCKED, True, True, False,
                              rec_layout, False, False, empty, WS, sq_smem, sq_desc, SDO_bh, TOKEN,
                          dq_x, DQ_REDUCE)
            if DQ_REDUCE:
                _dq_reduce_probe(0, dk, dq_stage, dq_full, dq_empty,
                                 (start_n // SLICE) % 2, dq_scale,
                                 dq_x, dq_kt, DQ_REDUCE, DQ_STAGES, acc_layout)
        else:
            dv, dk = _q_step(0, first, dv, dk, k_tile, v_tile, q_smem, do_smem, qt_smem, dot_smem, lse_smem,
                              delta_smem, full, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, n_blocks,
                              q_row0, t_row0, vb, vh, offs_kv, sc_smem, k_scale, qk_const, s_layout, dp_layout,
                              acc_layout, op_layout, STAGES, SLICE, HEAD_DIM, PASS, BLOCKED, False, False,
                              True, rec_layout, False, False, empty, WS, sq_smem, sq_desc, SDO_bh, TOKEN,
                          dq_x, DQ_REDUCE)
            if DQ_REDUCE:
                _dq_reduce_probe(0, dk, dq_stage, dq_full, dq_empty,
                                 (start_n // SLICE) % 2, dq_scale,
                                 dq_x, dq_kt, DQ_REDUCE, DQ_STAGES, acc_layout)
        loop_start = 1
    for r in range(loop_start, n_blocks):
        if not TOKEN:
            if (r % SCALE_CHUNK == 0) & (r > 0):   # the next chunk of records (sequences above 4096)
                _cta_barrier()   # every warp is done with the last chunk
                _stage_scales(sc_smem, first + r, NQ, SQ_bh, SDO_bh, TS_kv, SCALE_CHUNK, stage_layout)
                _cta_barrier()
        dv, dk = _q_step(r, first + r, dv, dk, k_tile, v_tile, q_smem, do_smem, qt_smem, dot_smem, lse_smem,
                          delta_smem, full, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, n_blocks,
                          q_row0, t_row0, vb, vh, offs_kv, sc_smem, k_scale, qk_const, s_layout, dp_layout,
                          acc_layout, op_layout, STAGES, SLICE, HEAD_DIM, PASS, BLOCKED, True, False, False,
                          rec_layout, MASK_IN_LOOP, r == 0, empty, WS, sq_smem, sq_desc, SDO_bh, TOKEN,
                          dq_x, DQ_REDUCE)
        if DQ_REDUCE:
            _dq_reduce_probe(r, dk, dq_stage, dq_full, dq_empty,
                             (start_n // SLICE) % 2, dq_scale,
                             dq_x, dq_kt, DQ_REDUCE, DQ_STAGES, acc_layout)

    offs_r = start_n + gl.arange(0, SLICE, layout=gl.SliceLayout(1, acc_layout))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    out = offs_r[:, None] * stride_gn + offs_d[None, :]
    if TOKEN:   # dK's terms came from 256 P (_q_block_token): exact in a power of two
        dk_const = sm_scale * (1.0 / G_P_E4M3_SCALE)
    else:
        dk_const = sm_scale
    if PASS != DV_ONLY:
        gl.store(DK_bh + out, gl.convert_layout(dk * dk_const, acc_layout).to(DK_bh.dtype.element_ty))
    if PASS != DK_ONLY:
        gl.store(DV_bh + out, dv.to(DV_bh.dtype.element_ty))


@gluon.jit
def _allocate(k_desc, v_desc, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, KV_ROWS: gl.constexpr,
              HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, PASS: gl.constexpr, BLOCKED: gl.constexpr):
    """A program's shared memory for KV_ROWS kv rows (K^, V) and the q side's ring: (k, v, v as
    [KV_ROWS, HEAD_DIM] rows, q, lse, do, qt, dot, delta). BLOCKED: the q side comes in one copy per
    block (rings of STAGES), else per slice (2 * STAGES); the descriptors' boxes match (launches()).
    What a pass does not read gets a placeholder of a few bytes (the code using it is not built)."""
    RING: gl.constexpr = STAGES if BLOCKED else 2 * STAGES
    unused: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    unused3: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[2, 1, 0])
    k_smem = gl.allocate_shared_memory(gl.int8, [KV_ROWS, HEAD_DIM], k_desc.layout)
    q_smem = gl.allocate_shared_memory(gl.int8, [RING] + q_desc.block_type.shape, q_desc.layout)
    lse_smem = gl.allocate_shared_memory(gl.float32, [RING] + lse_desc.block_type.shape, lse_desc.layout)
    if PASS != DV_ONLY:
        # v and dO: (rows, HEAD_DIM) or, by 4-D descriptors on their own strides, (1, 1, rows, HEAD_DIM) boxes
        v_smem = gl.allocate_shared_memory(v_desc.dtype, v_desc.block_type.shape, v_desc.layout)
        v_rows = v_smem.reshape([KV_ROWS, HEAD_DIM])
        do_smem = gl.allocate_shared_memory(do_desc.dtype, [RING] + do_desc.block_type.shape, do_desc.layout)
        qt_smem = gl.allocate_shared_memory(qt_desc.dtype, [RING] + qt_desc.block_type.shape, qt_desc.layout)
        delta_smem = gl.allocate_shared_memory(gl.float32, [RING] + delta_desc.block_type.shape, delta_desc.layout)
    else:
        v_smem = gl.allocate_shared_memory(gl.int8, [1, 16], unused)
        v_rows = v_smem
        do_smem = gl.allocate_shared_memory(gl.int8, [1, 1, 16], unused3)
        qt_smem = gl.allocate_shared_memory(gl.int8, [1, 1, 16], unused3)
        delta_smem = gl.allocate_shared_memory(gl.float32, [1, 4], unused)
    if PASS != DK_ONLY:
        # dO^T: INT8, or FP8 e4m3 in the token contract (its descriptor's dtype)
        dot_smem = gl.allocate_shared_memory(dot_desc.dtype, [RING] + dot_desc.block_type.shape, dot_desc.layout)
    else:
        dot_smem = gl.allocate_shared_memory(gl.int8, [1, 1, 16], unused3)
    return k_smem, v_smem, v_rows, q_smem, lse_smem, do_smem, qt_smem, dot_smem, delta_smem


@gluon.jit
def _allocate_token(sq_desc, lse_smem, STAGES: gl.constexpr, BLOCKED: gl.constexpr, TOKEN: gl.constexpr):
    """The token contract's s_Q ring beside LSE's (same boxes, same ring); in the block contract
    nothing: lse_smem stands in (the code using it is not built, and the block kernels' shared
    memory stays as it was)."""
    RING: gl.constexpr = STAGES if BLOCKED else 2 * STAGES
    if TOKEN:
        sq_smem = gl.allocate_shared_memory(gl.float32, [RING] + sq_desc.block_type.shape, sq_desc.layout)
    else:
        sq_smem = lse_smem
    return sq_smem


@gluon.jit
def _dkdv_kernel(k_desc, v_desc, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc,
                 SQ, SK, SDO, TILE_SCALES, DK, DV, stride_gb, stride_gh, stride_gn, sm_scale, N, H, sq_desc,
                 HEAD_DIM: gl.constexpr, Q_BLOCK: gl.constexpr, KV_BLOCK: gl.constexpr, SLICE: gl.constexpr,
                 CAUSAL: gl.constexpr, STAGES: gl.constexpr, PASS: gl.constexpr, BLOCKED: gl.constexpr,
                 DIAG_IN_LOOP: gl.constexpr, TOKEN: gl.constexpr):
    """TOKEN: the token contract (SQ, SK per token, sq_desc their TMA view; TILE_SCALES unused), else the
    block contract (sq_desc unused)."""
    gl.static_assert(Q_BLOCK == 2 * SLICE, "a q block is two slices")
    gl.static_assert(KV_BLOCK == SLICE, "one kv tile per program, as tall as a slice")

    pid_n = gl.program_id(0)   # causal: kv tile 0 sees the most queries and runs first
    bh = gl.program_id(1)
    start_n = pid_n * KV_BLOCK
    k_smem, v_smem, v_tile, q_smem, lse_smem, do_smem, qt_smem, dot_smem, delta_smem = _allocate(
        k_desc, v_desc, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, KV_BLOCK, HEAD_DIM, STAGES, PASS,
        BLOCKED)
    sq_smem = _allocate_token(sq_desc, lse_smem, STAGES, BLOCKED, TOKEN)
    unused: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    bars = gl.allocate_shared_memory(gl.int64, [2 * STAGES + 1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2 * STAGES + 1):
        mbarrier.init(bars.index(i), count=1)

    q_row0 = bh * N
    vb = bh // H   # the batch and head coordinates of v and dO
    vh = bh % H
    t_row0 = bh * HEAD_DIM
    kv_bar = bars.index(2 * STAGES)
    _load_kv(k_desc, v_desc, k_smem, v_smem, kv_bar, q_row0, start_n, vb, vh, PASS)
    # q blocks wholly above the diagonal see none of these keys: start at the block holding it.
    if CAUSAL:
        first = start_n // Q_BLOCK
    else:
        first = 0
    n_blocks = N // Q_BLOCK - first
    for i in gl.static_range(STAGES):
        if i < n_blocks:
            if BLOCKED:
                _load_block(q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, q_smem, do_smem, qt_smem,
                            dot_smem, lse_smem, delta_smem, bars, i, first + i, q_row0, t_row0, vb, vh, STAGES, SLICE,
                            PASS, sq_desc, sq_smem, TOKEN)
            else:
                for h in gl.static_range(2):
                    _load_slice(q_desc, do_desc, qt_desc, lse_desc, delta_desc, q_smem, do_smem, qt_smem, lse_smem,
                                delta_smem, bars, i, first + i, h, q_row0, t_row0, vb, vh, STAGES, SLICE, sq_desc,
                                sq_smem, TOKEN)

    SQ_bh = SQ + bh * (N // Q_BLOCK)
    SDO_bh = SDO + bh * (N // Q_BLOCK)
    out_bh = vb.to(gl.int64) * stride_gb + vh.to(gl.int64) * stride_gh
    if TOKEN:   # per-token s_K of the tile's rows; no records
        SK_tile = SK + bh * N + start_n
        TS_kv = TILE_SCALES
        sc_smem = lse_smem
    else:
        SK_tile = SK + bh * (N // KV_BLOCK) + pid_n
        TS_kv = TILE_SCALES + (bh.to(gl.int64) * (N // KV_BLOCK) + pid_n) * (N // Q_BLOCK) * 4   # kv-major
        sc_smem = gl.allocate_shared_memory(gl.float32, [SCALE_CHUNK, 8], unused)
    _kv_tile(k_smem, v_tile, q_smem, do_smem, qt_smem, dot_smem, lse_smem, delta_smem, sc_smem, kv_bar, bars, bars,
             q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, SK_tile, SQ_bh, SDO_bh, TS_kv, DK + out_bh,
             DV + out_bh, stride_gn, start_n, first, n_blocks, N // Q_BLOCK, q_row0, t_row0, vb, vh, sm_scale,
             start_n % Q_BLOCK == 0, HEAD_DIM, SLICE, CAUSAL, STAGES, PASS, BLOCKED, DIAG_IN_LOOP, False, sq_smem,
             sq_desc, TOKEN, sq_smem, bars, bars, sm_scale, sq_smem, sq_smem, NO_DQ, 1)
    for i in gl.static_range(2 * STAGES + 1):
        mbarrier.invalidate(bars.index(i))
