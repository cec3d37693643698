"""dK/dV for Hopper, warp-specialised: dkdv_hopper's arithmetic in the same order (bit-identical
dK, dV), with every load issued by a producer warp.

In dkdv_hopper every TMA copy costs a CTA barrier and ~17 instructions (a Gluon kernel that is not
warp specialised elects a thread, rebuilds the descriptor address and syncs its warps for each):
the d=128 dK pass makes ten copies per q block, ~170 of its ~980 instructions per block and 16
barriers. Here:

- one program per 128 kv rows, i.e. two kv tiles: two consumer warpgroups (partitions of 4 warps,
  240 registers), one per tile, each running dkdv_hopper's _kv_tile on its own tile. They share
  the q side, which is therefore loaded once for both;
- a producer warp (24 registers) loads K^ and V of both tiles, then the q side into a ring of
  STAGES q blocks (whole blocks, or per slice in the dK pass) on "full" mbarriers; it refills an
  entry once both consumers have arrived on its "empty" mbarrier, which they do where
  dkdv_hopper would refill it (_q_block with WS);
- the consumers synchronise only inside their own warpgroup (a named barrier before each
  arrive), never with each other. 2 x 128 x 240 + 128 x 24 registers fill the register file: one
  program per SM, with the same 8 consumer warps as dkdv_hopper's two programs.

Causal: both tiles start at the q block holding the diagonal (128 kv rows are one q block). With
the diagonal block peeled (dV and d=64 passes) the first tile masks slice a and the second skips
it and masks slice b, as dkdv_hopper's programs do; the dK pass masks it inside the loop, where
the second tile's slice a is all masked: P = 0, so dS^ = 0 and it adds nothing.

TOKEN (the token contract): the consumers run dkdv_hopper._q_block_token, the producer also copies
s_Q with each q block, and both slices of a dK-pass entry are released at the block's end (a row's
scale needs both).

Limits (else dkdv_hopper runs): head_dim 64 or 128, block_q 128, block_kv 64, no Q-smoothing.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from .dkdv_hopper import (DV_ONLY, ORDERED_DQ, PRODUCT_DQ, PRODUCT_Y16_DQ, SCALE_CHUNK, _allocate, _allocate_token,
                          _kv_tile, _load_block, _load_kv, _load_slice)
from .gluon_ext import tma_reduce_add

# Ring depth per pass: q blocks (the dK pass: slice pairs). The d=128 passes: as many as shared memory holds beside
# both tiles' K^ and V. The d=64 dK/dV: two, though a third fits; two run 1-2% faster with either contract (H200,
# docs/kernel-notes.md "Nineteenth session").
STAGES = {"dkdv": 2, "dv": 4, "dk": 2}
CONSUMER_REGS = 240   # 2 consumers x 128 threads x 240 + 128 x 24 = the 64 K registers of an SM
PRODUCER_REGS = 24


@gluon.jit
def kv_program(N, H, HEAD_DIM: gl.constexpr, SLICE: gl.constexpr, CAUSAL: gl.constexpr):
    """Where a program of 2 SLICE kv rows works (the warp-specialised dK/dV and the fused backward):
    (pid, bh, start_n, q_row0, vb, vh, t_row0, NQ, first, n_blocks), where vb, vh are the batch and
    head of v, dO and the gradients, and the program walks q blocks first .. NQ - 1."""
    pid = gl.program_id(0)   # kv rows 2 SLICE pid ..: tiles 2 pid and 2 pid + 1 (causal: the longest first)
    bh = gl.program_id(1)
    start_n = pid * 2 * SLICE
    q_row0 = bh * N
    vb = bh // H
    vh = bh % H
    t_row0 = bh * HEAD_DIM
    NQ = N // (2 * SLICE)
    if CAUSAL:
        first = pid   # the q block holding the diagonal: these kv rows are one q block
    else:
        first = 0
    return pid, bh, start_n, q_row0, vb, vh, t_row0, NQ, first, NQ - first


@gluon.jit
def ring_barriers(STAGES: gl.constexpr):
    """The mbarriers of a two-consumer program: K^ (and V) landed; a ring entry (2 * STAGES: a q
    block or its two slices) full, and empty once both consumers have arrived."""
    kv_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    full = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar.index(0), count=1)
    for i in gl.static_range(2 * STAGES):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)   # one arrive per consumer
    return kv_bar, full, empty


@gluon.jit
def _producer(k_desc, v_desc, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc,
                     k_smem, v_smem, q_smem,
              do_smem, qt_smem, dot_smem, lse_smem, delta_smem, kv_bar, full, empty, q_row0, t_row0, vb, vh, start_n,
              first, n_blocks, STAGES: gl.constexpr, SLICE: gl.constexpr, PASS: gl.constexpr,
              BLOCKED: gl.constexpr, sq_desc, sq_smem, TOKEN: gl.constexpr):
    """K^ (and V) of both kv tiles, then the q side of every block the consumers walk, in their order."""
    _load_kv(k_desc, v_desc, k_smem, v_smem, kv_bar, q_row0, start_n, vb, vh, PASS)
    for r in range(n_blocks):
        slot = r % STAGES
        if BLOCKED:
            if r >= STAGES:   # both consumers are done with the block this entry held
                mbarrier.wait(empty.index(2 * slot), ((r // STAGES) - 1) & 1)
            _load_block(q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, q_smem, do_smem, qt_smem, dot_smem,
                        lse_smem, delta_smem, full, r, first + r, q_row0, t_row0, vb, vh, STAGES, SLICE, PASS, sq_desc,
                        sq_smem, TOKEN)
        else:
            for h in gl.static_range(2):
                if r >= STAGES:
                    mbarrier.wait(empty.index(2 * slot + h), ((r // STAGES) - 1) & 1)
                _load_slice(q_desc, do_desc, qt_desc, lse_desc, delta_desc, q_smem, do_smem, qt_smem, lse_smem,
                            delta_smem, full, r, first + r, h, q_row0, t_row0, vb, vh, STAGES, SLICE, sq_desc, sq_smem,
                            TOKEN)


@gluon.jit
def _consumer(TILE: gl.constexpr, k_desc, v_desc, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, k_tile,
              v_tile, q_smem, do_smem, qt_smem, dot_smem, lse_smem, delta_smem, sc_smem, kv_bar, full, empty, SK_tile,
              SQ_bh, SDO_bh, TS_kv, DK_bh, DV_bh, stride_gn, start_n, first, n_blocks, NQ, q_row0, t_row0, vb, vh,
              sm_scale, HEAD_DIM: gl.constexpr, SLICE: gl.constexpr, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
              PASS: gl.constexpr, BLOCKED: gl.constexpr, DIAG_IN_LOOP: gl.constexpr, sq_smem, sq_desc,
              TOKEN: gl.constexpr, dq_stage, dq_full, dq_empty, dq_scale, dq_x, dq_kt, DQ_REDUCE: gl.constexpr,
              DQ_STAGES: gl.constexpr):
    """dK and/or dV of kv tile TILE of the program (SLICE rows from start_n) on one warpgroup:
    dkdv_hopper's per-tile loop, its ring filled by the producer. Tile 0 holds slice a of the
    causal diagonal block, tile 1 its slice b."""
    _kv_tile(k_tile, v_tile, q_smem, do_smem, qt_smem, dot_smem, lse_smem, delta_smem, sc_smem, kv_bar, full, empty,
             q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, SK_tile, SQ_bh, SDO_bh, TS_kv, DK_bh, DV_bh,
             stride_gn, start_n, first, n_blocks, NQ, q_row0, t_row0, vb, vh, sm_scale, TILE == 0, HEAD_DIM, SLICE,
             CAUSAL, STAGES, PASS, BLOCKED, DIAG_IN_LOOP, True, sq_smem, sq_desc, TOKEN, dq_stage, dq_full, dq_empty,
             dq_scale, dq_x, dq_kt, DQ_REDUCE, DQ_STAGES)


@gluon.jit
def _bulk_writes_done(x):
    """Wait until this thread's TMA reductions have written global memory (not only read shared memory, as
    tma.store_wait does), and order them before the thread's later release; returns x."""
    return gl.inline_asm_elementwise("cp.async.bulk.wait_group 0;\nfence.proxy.async.global;\nmov.b32 $0, $1;",
                                     "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _reducer(dq_desc, stage_0, stage_1, dq_full, dq_empty, SEM, bh, pid, first, n_blocks, NQ, q_row0, BH_ROWS,
             SLICE: gl.constexpr, CAUSAL: gl.constexpr, DQ_REDUCE: gl.constexpr, GROUPS: gl.constexpr,
             NSTAGE: gl.constexpr):
    """The dQ probe's reducer warp (tools.dq_reduce_probe): each consumer's staged partial of each q block is
    added into dQ by TMA. DQ_REDUCE == ORDERED_DQ: deterministically, in a fixed order of programs per (q block,
    half) kept by a counter in SEM (causal: the program holding the block's diagonal first, then downwards, the
    order in which the ascending walks reach it; full: program 0 first). GROUPS > 1: the programs pid = g mod
    GROUPS add into copy g of dQ (BH_ROWS rows further each), in that order among themselves: GROUPS chains, each
    GROUPS times shorter, whose copies a fixed-order sum combines."""
    g = pid % GROUPS
    for r in range(n_blocks):
        slot = r % NSTAGE
        blk = first + r
        if CAUSAL:   # this group's programs holding block blk: the largest is blk - (blk - g) mod GROUPS
            rank = (blk - (blk - g) % GROUPS - pid) // GROUPS
        else:
            rank = pid // GROUPS
        row = g * BH_ROWS + q_row0 + blk * 2 * SLICE
        counter = SEM + ((g * (BH_ROWS // (2 * SLICE)) + bh * NQ + blk) * 2)
        for h in gl.static_range(2):
            mbarrier.wait(dq_full.index(2 * h + slot), (r // NSTAGE) & 1)
            if DQ_REDUCE == ORDERED_DQ:
                seen = gl.atomic_add(counter + h, 0, sem="acquire")
                while seen != rank:
                    seen = gl.atomic_add(counter + h, 0, sem="acquire")
            if h == 0:
                tma_reduce_add(dq_desc, [row, 0], stage_0.index(slot))
            else:
                tma_reduce_add(dq_desc, [row + SLICE, 0], stage_1.index(slot))
        if DQ_REDUCE == ORDERED_DQ:
            rank = _bulk_writes_done(rank)
            for h in gl.static_range(2):
                gl.atomic_add(counter + h, 1, sem="release")
        else:
            tma.store_wait(0)
        for h in gl.static_range(2):
            mbarrier.arrive(dq_empty.index(2 * h + slot))


@gluon.jit
def _dkdv_ws_kernel(k_desc, v_desc, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc,
                    SQ, SK, SDO, TILE_SCALES, DK, DV, stride_gb, stride_gh, stride_gn, sm_scale, N, H, sq_desc,
                    dq_desc, SEM, dq_scale, HEAD_DIM: gl.constexpr, SLICE: gl.constexpr, CAUSAL: gl.constexpr,
                    STAGES: gl.constexpr,
                    PASS: gl.constexpr, BLOCKED: gl.constexpr, DIAG_IN_LOOP: gl.constexpr,
                    CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, TOKEN: gl.constexpr,
                    DQ_REDUCE: gl.constexpr, DQ_GROUPS: gl.constexpr, DQ_STAGES: gl.constexpr):
    """TOKEN: the token contract (SQ, SK per token, sq_desc the TMA view of SQ; TILE_SCALES unused), else the
    block contract (sq_desc unused). DQ_REDUCE (dkdv_hopper's *_DQ; a measurement, tools.dq_reduce_probe): after every
    q block each consumer stages its dK accumulator (dkdv_hopper._dq_reduce_probe) and a reducer warp adds it into
    dq_desc's fp32 rows (_reducer; ORDERED_DQ with SEM's zeroed counters, in DQ_GROUPS copies of dQ; FIXED_DQ: int32
    round(partial dq_scale) into int32 rows); else dq_desc, SEM and dq_scale are unused."""
    pid, bh, start_n, q_row0, vb, vh, t_row0, NQ, first, n_blocks = kv_program(N, H, HEAD_DIM, SLICE, CAUSAL)

    # both tiles' K^ and V, and the ring: whole q blocks (BLOCKED: STAGES entries) or slices (2 * STAGES)
    k_smem, v_smem, v_rows, q_smem, lse_smem, do_smem, qt_smem, dot_smem, delta_smem = _allocate(
        k_desc, v_desc, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc, 2 * SLICE, HEAD_DIM, STAGES, PASS,
        BLOCKED)
    sq_smem = _allocate_token(sq_desc, lse_smem, STAGES, BLOCKED, TOKEN)
    unused: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    if TOKEN:   # no records: s_Q comes with the ring, s_K and s_dO from global memory
        sc0 = lse_smem
        sc1 = lse_smem
    else:
        sc0 = gl.allocate_shared_memory(gl.float32, [SCALE_CHUNK, 8], unused)
        sc1 = gl.allocate_shared_memory(gl.float32, [SCALE_CHUNK, 8], unused)
    kv_bar, full, empty = ring_barriers(STAGES)
    if DQ_REDUCE == PRODUCT_Y16_DQ:
        # the bf16 product's operands: Y of both q halves, K^T. Each consumer's one stage is its Y half once its
        # product has read it (16 KB either way): separate stages would take shared memory past an H100 block's
        # 227 KB. A fused kernel would write the next block's Y only after the reducer's dq_empty (not here: the
        # probe times the work, its values are not read)
        operand16: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        dq_x = gl.allocate_shared_memory(gl.bfloat16, [2, SLICE, 2 * SLICE], operand16)
        dq_kt = gl.allocate_shared_memory(gl.bfloat16, [HEAD_DIM, 2 * SLICE], operand16)
        dq_0 = dq_x.index(0)._reinterpret(dq_desc.dtype, [DQ_STAGES] + dq_desc.block_type.shape, dq_desc.layout)
        dq_1 = dq_x.index(1)._reinterpret(dq_desc.dtype, [DQ_STAGES] + dq_desc.block_type.shape, dq_desc.layout)
    elif DQ_REDUCE:   # two stages per consumer
        dq_0 = gl.allocate_shared_memory(dq_desc.dtype, [DQ_STAGES] + dq_desc.block_type.shape, dq_desc.layout)
        dq_1 = gl.allocate_shared_memory(dq_desc.dtype, [DQ_STAGES] + dq_desc.block_type.shape, dq_desc.layout)
        if DQ_REDUCE >= PRODUCT_DQ:   # the product's operands: X^ of both q halves, K^T of the 2 SLICE kv rows
            operand: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
            dq_x = gl.allocate_shared_memory(gl.int8, [2, SLICE, 2 * SLICE], operand)
            dq_kt = gl.allocate_shared_memory(gl.int8, [HEAD_DIM, 2 * SLICE], operand)
        else:
            dq_x = lse_smem
            dq_kt = lse_smem
    if DQ_REDUCE:
        dq_full = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
        dq_empty = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(4):
            mbarrier.init(dq_full.index(i), count=1)
            mbarrier.init(dq_empty.index(i), count=1)

    if PASS != DV_ONLY:
        v_0 = v_rows.slice(0, SLICE)
        v_1 = v_rows.slice(SLICE, SLICE)
    else:
        v_0 = v_rows
        v_1 = v_rows
    NKV = N // SLICE
    SQ_bh = SQ + bh * NQ
    SDO_bh = SDO + bh * NQ
    out_bh = vb.to(gl.int64) * stride_gb + vh.to(gl.int64) * stride_gh
    if TOKEN:   # s_K per token: tile 0's rows, tile 1's SLICE further
        TS_0 = TILE_SCALES
        TS_1 = TILE_SCALES
        SK_0 = SK + bh * N + start_n
        SK_1 = SK_0 + SLICE
    else:
        TS_0 = TILE_SCALES + (bh.to(gl.int64) * NKV + 2 * pid) * NQ * 4   # kv-major: tile 2 pid's records
        TS_1 = TS_0 + NQ * 4
        SK_0 = SK + bh * NKV + 2 * pid
        SK_1 = SK_0 + 1
    # The partitions' arguments are written out in each branch: Gluon does not pass constexprs through tuples.
    if DQ_REDUCE:
        gl.warp_specialize([
            (_consumer, (0, k_desc, v_desc, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc,
                     k_smem.slice(0, SLICE), v_0,
                     q_smem, do_smem, qt_smem, dot_smem, lse_smem, delta_smem, sc0, kv_bar.index(0), full, empty, SK_0,
                     SQ_bh, SDO_bh, TS_0, DK + out_bh, DV + out_bh, stride_gn, start_n, first, n_blocks, NQ, q_row0,
                     t_row0, vb, vh, sm_scale, HEAD_DIM, SLICE, CAUSAL, STAGES, PASS, BLOCKED, DIAG_IN_LOOP, sq_smem,
                     sq_desc, TOKEN,
                     dq_0, dq_full, dq_empty, dq_scale, dq_x, dq_kt, DQ_REDUCE, DQ_STAGES)),
            (_consumer, (1, k_desc, v_desc, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc,
                     k_smem.slice(SLICE, SLICE),
                     v_1, q_smem, do_smem, qt_smem, dot_smem, lse_smem, delta_smem, sc1, kv_bar.index(0), full, empty,
                     SK_1, SQ_bh, SDO_bh, TS_1, DK + out_bh, DV + out_bh, stride_gn, start_n + SLICE, first, n_blocks,
                     NQ, q_row0, t_row0, vb, vh, sm_scale, HEAD_DIM, SLICE, CAUSAL, STAGES, PASS, BLOCKED,
                     DIAG_IN_LOOP, sq_smem, sq_desc, TOKEN,
                     dq_1, dq_full, dq_empty, dq_scale, dq_x, dq_kt, DQ_REDUCE, DQ_STAGES)),
            (_producer, (k_desc, v_desc, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc,
                     k_smem, v_smem, q_smem,
                     do_smem, qt_smem, dot_smem, lse_smem, delta_smem, kv_bar.index(0), full, empty, q_row0, t_row0, vb,
                     vh, start_n, first, n_blocks, STAGES, SLICE, PASS, BLOCKED, sq_desc, sq_smem, TOKEN)),
            (_reducer, (dq_desc, dq_0, dq_1, dq_full, dq_empty, SEM, bh, pid, first, n_blocks, NQ, q_row0,
                        N * (gl.num_programs(1)), SLICE, CAUSAL, DQ_REDUCE, DQ_GROUPS, DQ_STAGES)),
        ], [4, 1, 1], [CONSUMER_REGS, PRODUCER_REGS, PRODUCER_REGS])
    else:   # the default: no dQ partitions (lse_smem, full, empty, sm_scale stand in, unused)
        gl.warp_specialize([
            (_consumer, (0, k_desc, v_desc, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc,
                     k_smem.slice(0, SLICE), v_0,
                     q_smem, do_smem, qt_smem, dot_smem, lse_smem, delta_smem, sc0, kv_bar.index(0), full, empty, SK_0,
                     SQ_bh, SDO_bh, TS_0, DK + out_bh, DV + out_bh, stride_gn, start_n, first, n_blocks, NQ, q_row0,
                     t_row0, vb, vh, sm_scale, HEAD_DIM, SLICE, CAUSAL, STAGES, PASS, BLOCKED, DIAG_IN_LOOP, sq_smem,
                     sq_desc, TOKEN,
                     lse_smem, full, empty, sm_scale, lse_smem, lse_smem, DQ_REDUCE, 1)),
            (_consumer, (1, k_desc, v_desc, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc,
                     k_smem.slice(SLICE, SLICE),
                     v_1, q_smem, do_smem, qt_smem, dot_smem, lse_smem, delta_smem, sc1, kv_bar.index(0), full, empty,
                     SK_1, SQ_bh, SDO_bh, TS_1, DK + out_bh, DV + out_bh, stride_gn, start_n + SLICE, first, n_blocks,
                     NQ, q_row0, t_row0, vb, vh, sm_scale, HEAD_DIM, SLICE, CAUSAL, STAGES, PASS, BLOCKED,
                     DIAG_IN_LOOP, sq_smem, sq_desc, TOKEN,
                     lse_smem, full, empty, sm_scale, lse_smem, lse_smem, DQ_REDUCE, 1)),
            (_producer, (k_desc, v_desc, q_desc, do_desc, qt_desc, dot_desc, lse_desc, delta_desc,
                     k_smem, v_smem, q_smem,
                     do_smem, qt_smem, dot_smem, lse_smem, delta_smem, kv_bar.index(0), full, empty, q_row0, t_row0, vb,
                     vh, start_n, first, n_blocks, STAGES, SLICE, PASS, BLOCKED, sq_desc, sq_smem, TOKEN)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
