"""dQ kernel for Hopper in Gluon (registry: dq "gluon-ws", the block contract's default on sm_90 at d=128 and the
token contract's at d=64 without the causal mask, and its reference "gluon"): backward.py's _dq_kernel
arithmetic in the same order (bit-identical dQ and tile scales), with its loads, waits and
barriers placed by hand.

One program per 128-row q block on two warpgroups (64 rows each), looping over 64-row kv
tiles, as backward.py. A tile's P and dS maxima span both warpgroups, so every tile needs one
exchange between them. The Triton kernel syncs its 8 warps 4 times per tile (two for the
compiler's reduction, two for its cp.async pipeline; ncu at d=128: barrier stalls 1.1 cycles
per issued instruction) and waits for each dot right after issuing it. Here:

- K^, K^T and V come by TMA, two tiles per copy, into a ring of STAGES pairs on mbarriers;
  Q^, dO, LSE and delta stay in place for the whole loop. (In a Gluon kernel that is not warp
  specialised every mbarrier operation gets a CTA barrier, so fewer, larger copies matter.)
- The maxima are exchanged with one barrier: each warp writes its pair of maxima, every thread
  reads all of them. The two tiles of a pair use separate buffers, so no second barrier guards
  their reuse.
- Tile j-1's INT8 product dS^ K^ runs on the tensor cores together with tile j's S and dP and
  is converted into dQ while they finish; dS^ is carried between tiles as int32 bits (an int8
  tensor carried across a loop is unpacked to a byte per register).

    pair u: wait its TMA | tile 2u:   issue dQ_{2u-1}, S, dP | convert dQ_{2u-1} | P, dS |
                                      refill pair u-1's slot | exchange | scales, dS^
                                      (WS: exchange, then free pair u-1's slot)
            tile 2u+1: issue dQ_{2u}, S, dP | convert dQ_{2u} | P, dS | exchange | scales, dS^

Warp-specialised (WS, the default): the 8 warps above are the default
partition of gl.warp_specialize (240 registers) and a producer warp (24) issues every copy (Q^
and dO, then each pair into the ring once its slot is free). The 8 warps free pair u-1's slot
at tile 2u's exchange (_tile_maxima: its barrier by hand, then one arrive), where they would
have refilled it: the loop loses the refill's CTA barrier and three copies of ~17 instructions
(per pair 1217 -> 1121 instructions, 6 -> 3 barriers, offline). The same kernel with WS off is
its bit-identical reference.

Measured on an H200 (docs/kernel-notes.md): (8,8,4096,128) dQ 1.00 -> 0.92 ms causal, 1.80 ->
1.55 ms without a mask; warp-specialised 0.863 -> 0.857 ms causal, 1.53 -> 1.49 ms without a mask.
At d=64 it computes the same dQ but is slower than the Triton kernel (0-14%: 191 registers, one
program of 8 warps per SM, where the Triton kernel fits two at 128 registers; capped at 128 here it
spills), so the registry lists it at d=128 only for the block contract. The host side: hopper.py.
TOKEN (the token contract; the registry's default on sm_90, warp-specialised): _tile_token as the tile
step, backward.py's TOKEN arithmetic (simulate.token_dq): dS = P (dP - delta) from dO as given, in bf16
from registers times K in bf16 from the ring (in place of K^T INT8), two chained wgmmas per tile pair
accumulating into dQ itself: no maximum, no rounding to INT8, no per-tile scale; dQ scaled once by
sm_scale at the end. The pair's product runs during the next pair's first tile; s_K per kv
row (S's) by TMA with each tile pair (a ring beside K^'s), s_Q per q row loaded once (docs/kernel-notes.md,
"The token contract's Gluon dQ", "dQ in bf16 from Y").
SPLIT (TOKEN and WS; registry dq "gluon-ws2": the token default on sm_90 but at d=64 without the causal mask):
the block's halves on two consumer partitions of one warpgroup each, taking turns issuing their products (FA3's
ping-pong, two mbarriers after the ring's); bit-identical. With dQ's bf16 product and S first (H200, 2026-11-28):
-3% at d=64 causal, +7% without the mask, -5.7% at d=128 causal; on an H100 with the INT8 X^ it was 3-10% slower
causal, -7.6% at d=128 without the mask (docs/kernel-notes.md, "The token dQ on two consumer warpgroups",
"Twenty-first session").
Limits (registry; else backward.py runs): block_q 128, block_kv 64, no Q-smoothing.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from ._common import program_tile
from .dkdv_hopper import _int8_bits, _seq_copy, as_a_operand

Q_ROWS = 128    # q rows per program = block_q
KV_ROWS = 64    # kv rows per tile = block_kv; tiles come in pairs (one TMA stage)
STAGES = 2      # tile pairs in flight (stages(): 3 for the d=64 causal token dQ)
PRODUCER_REGS = 24   # the producer warp of the warp-specialised form (WS)
CONSUMER_REGS = 240  # SPLIT: 2 consumers x 128 threads x 240 + 32 x 24 fill the 64 K registers of an SM


def stages(head_dim: int, causal: bool, token: bool) -> int:
    """Tile pairs in the ring: a third for the d=64 token dQ under the causal mask (H100: -1.7..-2.4% causal, but
    +1.7..+2.1% without the mask, docs/kernel-notes.md); d=128 has no shared memory for it."""
    return 3 if token and head_dim <= 64 and causal else STAGES


# A CTA barrier (the name changed between Triton 3.6 and 3.7).
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.jit
def _load_pair(k_desc, kt_desc, v_desc, k_smem, kt_smem, v_smem, bars, u, row0, t_row0, vb, vh,
               STAGES: gl.constexpr, KV_ROWS: gl.constexpr, sk_desc, sk_smem, TOKEN: gl.constexpr):
    """TMA of kv tiles 2u and 2u+1 (K^, K^T, V; TOKEN: K in bf16 in K^T's place, and s_K, one scale per kv
    row) into ring slot u % STAGES: three (four) copies on one mbarrier per two tiles."""
    slot = u % STAGES
    bar = bars.index(slot)
    sk_bytes: gl.constexpr = sk_desc.block_type.nbytes if TOKEN else 0
    mbarrier.expect(bar, k_desc.block_type.nbytes + kt_desc.block_type.nbytes + v_desc.block_type.nbytes + sk_bytes)
    if TOKEN:
        tma.async_copy_global_to_shared(sk_desc, [row0 + u * 2 * KV_ROWS], bar, sk_smem.index(slot))
    tma.async_copy_global_to_shared(k_desc, [row0 + u * 2 * KV_ROWS, 0], bar, k_smem.index(slot))
    if TOKEN:   # K in bf16, rows as V's (seq_desc: the model's layout)
        _seq_copy(kt_desc, vb, vh, row0, u * 2 * KV_ROWS, bar, kt_smem.index(slot))
    else:
        tma.async_copy_global_to_shared(kt_desc, [t_row0, u * 2 * KV_ROWS], bar, kt_smem.index(slot))
    _seq_copy(v_desc, vb, vh, row0, u * 2 * KV_ROWS, bar, v_smem.index(slot))


@gluon.jit
def _block_scales(amax, EXACT_SCALE: gl.constexpr):
    """_common.tile_scales, the same ops: (amax / 127, 127 / amax or 0)."""
    if EXACT_SCALE:
        scale = gl.div_rn(amax, 127.0)
    else:
        scale = amax * (1.0 / 127.0)
    inv = gl.where(amax > 0, 127.0 / gl.maximum(amax, 1e-30), 0.0)
    return scale, inv


@gluon.jit
def _tile_maxima(p, ds, xbuf, all_layout: gl.constexpr, empty, i, RELEASE: gl.constexpr):
    """max(P), max|dS| over the 128-row tile: each warp reduces its rows, writes one pair to xbuf,
    and after one CTA barrier every thread reads all pairs (the compiler's reduction takes two).
    RELEASE (warp-specialised): after that barrier, every warp has waited on the wgmmas issued
    before it, so ring entry i of `empty` is free: arrive there. (The compiler then puts a second
    barrier before the reads: it takes the arrive for a write that may alias xbuf. Arriving after
    the reads instead costs the same: a barrier before the arrive.)"""
    # P >= 0 orders like its bits as integers, whose max takes two elements per instruction
    p_rows = gl.max(p.to(gl.int32, bitcast=True), axis=1).to(gl.float32, bitcast=True)
    rows = gl.join(p_rows, gl.max(gl.abs(ds), axis=1))                       # [Q_ROWS, 2]
    nw: gl.constexpr = gl.num_warps()
    per_warp = gl.max(gl.reshape(rows, [nw, rows.shape[0] // nw, 2]), axis=1)  # [warps, 2]
    xbuf.store(per_warp)
    if RELEASE:
        _cta_barrier()   # the exchange's barrier, placed by hand
        mbarrier.arrive(empty.index(i))
    both = gl.max(xbuf.load(all_layout), axis=0)                               # [2], in every thread
    col = gl.arange(0, 2, layout=gl.SliceLayout(0, all_layout))
    # (both are >= 0: a max against 0 picks one element)
    return gl.max(gl.where(col == 0, both, 0.0), axis=0), gl.max(gl.where(col == 1, both, 0.0), axis=0)


@gluon.jit
def _tile(j, dq, ds_prev, scale_prev, kt_prev, q_smem, do_smem, k_tile, v_tile, xbuf, lse, delta, offs_m,
          q_scale, qk_const, SK_bh, TS_q, TS_step, refill, n_pairs, k_desc, kt_desc, v_desc, k_smem, kt_smem, v_smem,
          bars, row0, t_row0, vb, vh, s_layout: gl.constexpr, dp_layout: gl.constexpr, acc_layout: gl.constexpr,
          op_layout: gl.constexpr, all_layout: gl.constexpr, ts_layout: gl.constexpr, STAGES: gl.constexpr,
          Q_ROWS: gl.constexpr, KV_ROWS: gl.constexpr, HEAD_DIM: gl.constexpr, FIRST: gl.constexpr,
          MASK: gl.constexpr, REFILL: gl.constexpr, empty, WS: gl.constexpr):
    """Tile j, whose K^ and V are in k_tile, v_tile. Unless FIRST, tile j-1's dS^ (ds_prev, int8 in
    its low bytes) times K^ (kt_prev) runs on the tensor cores with S_j and dP_j and is folded into
    dq with scale_prev; REFILL: then TMA pair `refill` (if < n_pairs) into the slot that product
    read, or (WS) tell the producer warp that slot is free. Returns dq, tile j's dS^ bits and its
    dQ scale."""
    if not FIRST:
        ds8 = as_a_operand(ds_prev.to(gl.int8), op_layout)
        dq_tok = warpgroup_mma(ds8, kt_prev.permute((1, 0)), gl.zeros([Q_ROWS, HEAD_DIM], gl.int32, acc_layout),
                               use_acc=False, is_async=True)
    s_tok = warpgroup_mma(q_smem, k_tile.permute((1, 0)), gl.zeros([Q_ROWS, KV_ROWS], gl.int32, s_layout),
                          use_acc=False, is_async=True)
    dp_tok = warpgroup_mma(do_smem, v_tile.permute((1, 0)), gl.zeros([Q_ROWS, KV_ROWS], gl.float32, dp_layout),
                           use_acc=False, is_async=True)
    k_scale = gl.load(SK_bh + j)
    if not FIRST:
        dq_int = warpgroup_mma_wait(2, deps=[dq_tok])
        dq += dq_int.to(gl.float32) * scale_prev
    s = warpgroup_mma_wait(1, deps=[s_tok])
    p = gl.exp2(s.to(gl.float32) * ((q_scale * k_scale) * qk_const) - lse[:, None])
    if MASK:
        offs_n = j * KV_ROWS + gl.arange(0, KV_ROWS, layout=gl.SliceLayout(0, s_layout))
        p = gl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
    dp = warpgroup_mma_wait(0, deps=[dp_tok])
    ds = p * (gl.convert_layout(dp, s_layout) - delta[:, None])
    if REFILL and not WS and refill < n_pairs:
        # Before the exchange, whose barrier then orders these copies before the next wgmma
        # reads (else the compiler adds a barrier there). Measured against refilling after the
        # exchange (one more barrier per pair) or in tile 2u+1 (later): -3.5% and -6% unmasked.
        _cta_barrier()   # both warpgroups have waited on the product that read the slot
        _load_pair(k_desc, kt_desc, v_desc, k_smem, kt_smem, v_smem, bars, refill, row0, t_row0, vb, vh, STAGES,
                   KV_ROWS, k_desc, k_smem, False)
    p_amax, ds_amax = _tile_maxima(p, ds, xbuf, all_layout, empty, refill % STAGES, REFILL and WS)
    p_scale, p_inv = _block_scales(p_amax, HEAD_DIM > 64)
    ds_scale, ds_inv = _block_scales(ds_amax, HEAD_DIM > 64)
    slot4 = gl.arange(0, 4, layout=ts_layout)
    gl.store(TS_q + j * TS_step + slot4,
             gl.where(slot4 == 0, p_scale, gl.where(slot4 == 1, p_inv, gl.where(slot4 == 2, ds_scale, ds_inv))))
    return dq, _int8_bits(ds, ds_inv), ds_scale * k_scale   # own amax: in range


@gluon.jit
def _add_product(dq, dq_int, scale):
    """dq += the int32 product of a tile times its dQ scale (a scalar), one fma per element as backward.py's."""
    dq += dq_int.to(gl.float32) * scale
    return dq


@gluon.jit
def _pair_product(dq, y_a, y_b, k16_pair, op_layout: gl.constexpr, KV_ROWS: gl.constexpr, HEAD_DIM: gl.constexpr):
    """TOKEN: dq + dS K16 of a tile pair, issued (async): the two tiles' dS in bf16 (registers) times their K in
    bf16 (k16_pair: the pair's [2 KV_ROWS, HEAD_DIM] rows from the ring), chained into dq itself."""
    k16 = k16_pair.reshape([2 * KV_ROWS, HEAD_DIM])
    acc = warpgroup_mma(gl.convert_layout(y_a, op_layout), k16.slice(0, KV_ROWS), dq, use_acc=True, is_async=True)
    return warpgroup_mma(gl.convert_layout(y_b, op_layout), k16.slice(KV_ROWS, KV_ROWS), acc, use_acc=True,
                         is_async=True)


@gluon.jit
def _product_done(dq_tok, empty, refill, STAGES: gl.constexpr, WS: gl.constexpr, HALF: gl.constexpr):
    """dq once the previous pair's product is done (the one group issued after it may still run); WS: the ring
    slot it read (pair u-1's) is then freed, in all warps after the barrier."""
    dq = warpgroup_mma_wait(1, deps=[dq_tok])
    if WS:
        if HALF < 0:
            _cta_barrier()
            mbarrier.arrive(empty.index(refill % STAGES))
        elif refill >= STAGES:   # the halves' first pair runs this code too, with no slot before it to free
            _cta_barrier()
            mbarrier.arrive(empty.index(refill % STAGES))
    return dq


@gluon.jit
def _tile_token(j, dq, y_a, y_b, kt_prev, q_smem, do_smem, k_tile, v_tile, sk_tile, lse, delta,
                offs_m, qk_row, refill, s_layout: gl.constexpr, dp_layout: gl.constexpr, op_layout: gl.constexpr,
                STAGES: gl.constexpr, Q_ROWS: gl.constexpr, KV_ROWS: gl.constexpr,
                HEAD_DIM: gl.constexpr, MASK: gl.constexpr, empty, WS: gl.constexpr, HALF: gl.constexpr,
                PRODUCT: gl.constexpr):
    """Tile j in the token contract (backward.py's TOKEN branches, in its order and roundings):
    S = int(Q^ K^T) * s_K per kv column * (s_Q qk_const) per q row (qk_row), then exp2(S - LSE) (the
    second multiply and the subtraction one fma, contracted as there); returns dq and dS = P (dP - delta).
    PRODUCT (the pair's first tile, unless it is the
    block's first pair): the previous pair's product dS K16 (y_a, y_b: its dS in bf16; kt_prev: its K
    rows) runs on the tensor cores into dq with S and dP; WS: the ring slot that product read is then freed
    (a barrier and one arrive; not WS: _pair refills it after this tile). s_K of the tile's kv rows
    (sk_tile) came by TMA with K^ (loaded from global memory, its 64-bit addresses were carried across
    the loop and spilled)."""
    # s_K per kv column, read before this tile's products are issued: read after, it queued behind
    # their shared-memory reads and S's first multiply waited on it (ncu: short scoreboard).
    k_scale = sk_tile.load(gl.SliceLayout(0, s_layout))
    # HALF >= 0 (two consumers): the warpgroups take turns issuing their products (FA3's ping-pong), so
    # that one's arithmetic runs while the other's products do: half 0 issues tile j once half 1 has
    # issued tile j - 1, half 1 once half 0 has issued tile j (the turn barriers follow the ring's).
    if HALF == 0:
        if j > 0:
            mbarrier.wait(empty.index(STAGES), (j - 1) & 1)
    if HALF == 1:
        mbarrier.wait(empty.index(STAGES + 1), j & 1)
    # S_FIRST (d=64): S is issued before the previous pair's product, so that exp2 waits for S alone (wgmma groups
    # complete in issue order) and runs while the product and dP do: the d=64 dQ -5.4% (H200). At d=128 the
    # product (m64n128k64) first is faster: S first there +4.0% (docs/kernel-notes.md, "Twenty-first session").
    S_FIRST: gl.constexpr = HEAD_DIM == 64
    if PRODUCT and not S_FIRST:
        dq_tok = _pair_product(dq, y_a, y_b, kt_prev, op_layout, KV_ROWS, HEAD_DIM)
    s_tok = warpgroup_mma(q_smem, k_tile.permute((1, 0)), gl.zeros([Q_ROWS, KV_ROWS], gl.int32, s_layout),
                          use_acc=False, is_async=True)
    if PRODUCT and S_FIRST:
        dq_tok = _pair_product(dq, y_a, y_b, kt_prev, op_layout, KV_ROWS, HEAD_DIM)
    if PRODUCT and not S_FIRST:
        dq = _product_done(dq_tok, empty, refill, STAGES, WS, HALF)
    dp_tok = warpgroup_mma(do_smem, v_tile.permute((1, 0)), gl.zeros([Q_ROWS, KV_ROWS], gl.float32, dp_layout),
                           use_acc=False, is_async=True)
    if HALF >= 0:
        _cta_barrier()   # every warp of this warpgroup has issued
        mbarrier.arrive(empty.index(STAGES + 1 - HALF))
    s = warpgroup_mma_wait(2 if PRODUCT and S_FIRST else 1, deps=[s_tok])
    p = gl.exp2(s.to(gl.float32) * k_scale[None, :] * qk_row[:, None] - lse[:, None])
    if MASK:
        offs_n = j * KV_ROWS + gl.arange(0, KV_ROWS, layout=gl.SliceLayout(0, s_layout))
        p = gl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
    if PRODUCT and S_FIRST:
        dq = _product_done(dq_tok, empty, refill, STAGES, WS, HALF)
    dp = warpgroup_mma_wait(0, deps=[dp_tok])
    return dq, p * (gl.convert_layout(dp, s_layout) - delta[:, None])   # dS


@gluon.jit
def _pair(u, n_pairs, dq, ds_prev, ds_prev_b, scale_prev, prev_slot, q_smem, do_smem, k_smem, kt_smem, v_smem, xbuf_a,
          xbuf_b, bars, k_desc, kt_desc, v_desc, row0, t_row0, vb, vh, lse, delta, offs_m, q_scale, qk_const, SK_bh,
          TS_q, TS_step, s_layout: gl.constexpr, dp_layout: gl.constexpr, acc_layout: gl.constexpr,
          op_layout: gl.constexpr, all_layout: gl.constexpr, ts_layout: gl.constexpr, STAGES: gl.constexpr,
          Q_ROWS: gl.constexpr, KV_ROWS: gl.constexpr, HEAD_DIM: gl.constexpr, FIRST: gl.constexpr, MASK: gl.constexpr,
          empty, WS: gl.constexpr, TOKEN: gl.constexpr, sk_desc, sk_smem, HALF: gl.constexpr = -1):
    """Tiles 2u and 2u+1 (ring slot u % STAGES); returns dq, the dS^ (X^) bits in flight, their scale and
    the slot. The block contract (_tile): unless FIRST, the previous pair's last dS^ comes in (ds_prev,
    scale_prev; its K^T in prev_slot), tile 2u refills that slot (WS: frees it), and each tile's product
    runs during the next tile (ds_prev_b unused, passed through). TOKEN (_tile_token): X of both tiles is
    quantised with one scale per q row of the pair (2 KV_ROWS = 128 keys: the contract's key tile); the
    pair's product runs during the next pair's first tile (ds_prev, ds_prev_b: the previous pair's X^ bits,
    scale_prev its per-row scale; not WS: the slot is refilled after tile 2u). s_K of the pair is ring slot
    `slot` of sk_smem, SK_bh unused."""
    slot = u % STAGES
    mbarrier.wait(bars.index(slot), (u // STAGES) & 1)
    k_pair = k_smem.index(slot)
    kt_pair = kt_smem.index(slot)
    v_pair = v_smem.index(slot).reshape([2 * KV_ROWS, HEAD_DIM])
    refill = u - 1 + STAGES
    if TOKEN:
        dq, y_a = _tile_token(2 * u, dq, ds_prev, ds_prev_b, kt_smem.index(prev_slot), q_smem, do_smem,
                              k_pair.slice(0, KV_ROWS), v_pair.slice(0, KV_ROWS), sk_smem.index(slot).slice(0, KV_ROWS),
                              lse, delta, offs_m, q_scale, refill, s_layout, dp_layout, op_layout, STAGES,
                              Q_ROWS, KV_ROWS, HEAD_DIM, MASK, empty, WS, HALF, not FIRST)
        if not WS and not FIRST:
            if refill < n_pairs:
                _cta_barrier()   # every warp has waited on the product that read the slot (tile 2u's first)
                _load_pair(k_desc, kt_desc, v_desc, k_smem, kt_smem, v_smem, bars, refill, row0, t_row0, vb, vh,
                           STAGES, KV_ROWS, sk_desc, sk_smem, True)
        dq, y_b = _tile_token(2 * u + 1, dq, ds_prev, ds_prev_b, kt_pair, q_smem, do_smem,
                              k_pair.slice(KV_ROWS, KV_ROWS), v_pair.slice(KV_ROWS, KV_ROWS),
                              sk_smem.index(slot).slice(KV_ROWS, KV_ROWS), lse, delta, offs_m, q_scale, refill,
                              s_layout, dp_layout, op_layout, STAGES, Q_ROWS, KV_ROWS, HEAD_DIM, MASK,
                              empty, WS, HALF, False)
        # the pair's dS in bf16, the next pair's first tile's product (no maximum: a 16-bit product)
        bits = y_a.to(gl.bfloat16)
        bits_b = y_b.to(gl.bfloat16)
        scale_b = scale_prev
    else:
        kt_prev = kt_smem.index(prev_slot).slice(KV_ROWS, KV_ROWS, dim=1)
        dq, ds_a, scale_a = _tile(2 * u, dq, ds_prev, scale_prev, kt_prev, q_smem, do_smem, k_pair.slice(0, KV_ROWS),
                                  v_pair.slice(0, KV_ROWS), xbuf_a, lse, delta, offs_m, q_scale, qk_const, SK_bh, TS_q,
                                  TS_step, refill, n_pairs, k_desc, kt_desc, v_desc, k_smem, kt_smem, v_smem, bars,
                                  row0, t_row0, vb, vh, s_layout, dp_layout, acc_layout, op_layout, all_layout,
                                  ts_layout, STAGES, Q_ROWS, KV_ROWS, HEAD_DIM, FIRST, MASK, not FIRST, empty, WS)
        dq, ds_b, scale_b = _tile(2 * u + 1, dq, ds_a, scale_a, kt_pair.slice(0, KV_ROWS, dim=1), q_smem, do_smem,
                                  k_pair.slice(KV_ROWS, KV_ROWS), v_pair.slice(KV_ROWS, KV_ROWS), xbuf_b, lse, delta,
                                  offs_m, q_scale, qk_const, SK_bh, TS_q, TS_step, refill, n_pairs, k_desc, kt_desc,
                                  v_desc, k_smem, kt_smem, v_smem, bars, row0, t_row0, vb, vh, s_layout, dp_layout,
                                  acc_layout, op_layout, all_layout, ts_layout, STAGES, Q_ROWS, KV_ROWS, HEAD_DIM,
                                  False, MASK, False, empty, WS)
        bits = ds_b
        bits_b = ds_prev_b
    return dq, bits, bits_b, scale_b, slot


@gluon.jit
def _producer(q_desc, do_desc, k_desc, kt_desc, v_desc, q_smem, do_smem, k_smem, kt_smem, v_smem, q_bar, bars, empty,
              row0, t_row0, vb, vh, start_m, n_pairs, STAGES: gl.constexpr, KV_ROWS: gl.constexpr, sk_desc, sk_smem,
              TOKEN: gl.constexpr):
    """WS: Q^ and dO, then every tile pair into the ring, a slot once the consumers have freed it."""
    mbarrier.expect(q_bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [row0 + start_m, 0], q_bar, q_smem)
    _seq_copy(do_desc, vb, vh, row0, start_m, q_bar, do_smem)
    for u in range(n_pairs):
        if u >= STAGES:
            mbarrier.wait(empty.index(u % STAGES), ((u // STAGES) - 1) & 1)
        _load_pair(k_desc, kt_desc, v_desc, k_smem, kt_smem, v_smem, bars, u, row0, t_row0, vb, vh, STAGES, KV_ROWS,
                   sk_desc, sk_smem, TOKEN)


@gluon.jit
def _dq_block(q_smem, do_smem, k_smem, kt_smem, v_smem, xbuf_a, xbuf_b, bars, q_bar, empty, k_desc, kt_desc, v_desc,
             SQ, SK, LSE2, DELTA, DQ, stride_gb, stride_gh, stride_gn, TILE_SCALES, sm_scale, N, H, pid_m, bh,
             n_pairs, HEAD_DIM: gl.constexpr, Q_ROWS: gl.constexpr, KV_ROWS: gl.constexpr, CAUSAL: gl.constexpr,
             STAGES: gl.constexpr, WS: gl.constexpr, TOKEN: gl.constexpr, sk_desc, sk_smem, HALF: gl.constexpr = -1):
    """dQ and the tile scales of q block pid_m on all of the program's (WS: the consumer
    partition's) warps, from its Q^, dO landing on q_bar to the store. TOKEN: the token contract (SQ
    per token; s_K per token comes with K^ into sk_smem; no tile scales). HALF 0 or 1 (TOKEN, WS: the
    two-consumer form, _dq_kernel's SPLIT): only that half of the block's rows, on one warpgroup."""
    if HALF >= 0:
        gl.static_assert(TOKEN and WS, "a half block needs row-local scales (the token contract) and a producer")
    ROWS: gl.constexpr = Q_ROWS if HALF < 0 else Q_ROWS // 2
    OFF: gl.constexpr = 0 if HALF < 0 else HALF * (Q_ROWS // 2)
    nw: gl.constexpr = ROWS // 16   # a wgmma accumulator holds 16 rows per warp
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[nw, 1],
                                                       instr_shape=[16, KV_ROWS, 32])
    dp_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[nw, 1],
                                                        instr_shape=[16, KV_ROWS, 16])
    # dQ's product: INT8 dS^ K^ (block), bf16 Y K16 accumulating into dq itself (TOKEN)
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[nw, 1],
                                                         instr_shape=[16, HEAD_DIM, 16 if TOKEN else 32])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2 if TOKEN else 4)
    all_layout: gl.constexpr = gl.BlockedLayout([nw, 2], [32, 1], [nw, 1], [1, 0])   # whole [warps, 2] per thread
    ts_layout: gl.constexpr = gl.BlockedLayout([4], [32], [nw], [0])
    row: gl.constexpr = gl.SliceLayout(1, s_layout)

    start_m = pid_m * Q_ROWS
    row0 = bh * N
    vb = bh // H   # the batch and head coordinates of v and dO
    vh = bh % H
    t_row0 = bh * HEAD_DIM
    offs_m = start_m + OFF + gl.arange(0, ROWS, layout=row)
    lse = gl.load(LSE2 + row0 + offs_m)
    delta = gl.load(DELTA + row0 + offs_m)
    if TOKEN:   # s_Q qk_const per q row, as backward.py's (q_scale * qk_const)[:, None]
        q_scale = gl.load(SQ + row0 + offs_m) * (sm_scale * 1.4426950408889634)
        SK_bh = SK   # unused: s_K comes by TMA
    else:
        q_scale = gl.load(SQ + bh * (N // Q_ROWS) + pid_m)
        SK_bh = SK + bh * (N // KV_ROWS)
    # kv-major (bh, kv tile, q block, 4), as backward.py's
    TS_q = TILE_SCALES + bh.to(gl.int64) * (N // Q_ROWS) * (N // KV_ROWS) * 4 + pid_m * 4
    TS_step = (N // Q_ROWS) * 4   # from one kv tile's record to the next
    qk_const = sm_scale * 1.4426950408889634
    dq = gl.zeros([ROWS, HEAD_DIM], gl.float32, acc_layout)
    # no product in flight before tile 0: the block contract's dS^ bits; TOKEN: dS in bf16 of both tiles of a pair
    ds_bits = gl.zeros([ROWS, KV_ROWS], gl.bfloat16 if TOKEN else gl.int32, s_layout)
    ds_bits_b = ds_bits   # TOKEN: the second tile's (the block contract: unused)
    scale = qk_const   # the block contract's dQ scale of the product in flight (TOKEN: unused)
    slot = gl.to_tensor(0)
    do_tile = do_smem.reshape([Q_ROWS, HEAD_DIM])
    if HALF >= 0:
        q_smem = q_smem.slice(OFF, ROWS)
        do_tile = do_tile.slice(OFF, ROWS)
    mbarrier.wait(q_bar, 0)

    # backward.py's order: the unmasked tiles, then (causal) the block's diagonal pair, masked.
    if CAUSAL:
        n_unmasked = n_pairs - 1
    else:
        n_unmasked = n_pairs
    # ONE_COPY (the halves, but not at d=128 under the mask): one copy of the unmasked pair code per
    # partition, where the peeled first pair makes two: the first pair runs the loop's code, its "previous"
    # product a zero dS (ds_bits, ds_bits_b: zeros) that adds exactly 0. Two partitions of four copies each
    # (~9k SASS instructions at d=64) ran the causal dQ 2 points slower than one copy (docs/kernel-notes.md).
    # At d=128 under the mask ptxas then spills ~60 values inside each consumer's loop; masking the diagonal
    # behind a branch in the loop instead (one copy in all) ran the causal dQ 11-13% slower.
    ONE_COPY: gl.constexpr = HALF >= 0 and (HEAD_DIM <= 64 or not CAUSAL)
    if ONE_COPY:
        u0 = 0
    else:
        u0 = 1
    if ONE_COPY or n_unmasked > 0:
        if not ONE_COPY:   # the first pair, peeled: no product of a previous tile
            dq, ds_bits, ds_bits_b, scale, slot = _pair(
                gl.to_tensor(0), n_pairs, dq, ds_bits, ds_bits_b, scale, slot, q_smem, do_tile, k_smem, kt_smem, v_smem,
                xbuf_a, xbuf_b, bars, k_desc, kt_desc, v_desc, row0, t_row0, vb, vh, lse, delta, offs_m, q_scale,
                qk_const, SK_bh, TS_q, TS_step, s_layout, dp_layout, acc_layout, op_layout, all_layout, ts_layout,
                STAGES, ROWS, KV_ROWS, HEAD_DIM, True, False, empty, WS, TOKEN, sk_desc, sk_smem, HALF)
        for u in range(u0, n_unmasked):
            dq, ds_bits, ds_bits_b, scale, slot = _pair(
                u, n_pairs, dq, ds_bits, ds_bits_b, scale, slot, q_smem, do_tile, k_smem, kt_smem, v_smem, xbuf_a,
                xbuf_b, bars, k_desc, kt_desc, v_desc, row0, t_row0, vb, vh, lse, delta, offs_m, q_scale, qk_const,
                SK_bh, TS_q, TS_step, s_layout, dp_layout, acc_layout, op_layout, all_layout, ts_layout, STAGES, ROWS,
                KV_ROWS, HEAD_DIM, False, False, empty, WS, TOKEN, sk_desc, sk_smem, HALF)
        if CAUSAL:
            dq, ds_bits, ds_bits_b, scale, slot = _pair(
                n_pairs - 1, n_pairs, dq, ds_bits, ds_bits_b, scale, slot, q_smem, do_tile, k_smem, kt_smem, v_smem,
                xbuf_a, xbuf_b, bars, k_desc, kt_desc, v_desc, row0, t_row0, vb, vh, lse, delta, offs_m, q_scale,
                qk_const, SK_bh, TS_q, TS_step, s_layout, dp_layout, acc_layout, op_layout, all_layout, ts_layout,
                STAGES, ROWS, KV_ROWS, HEAD_DIM, False, True, empty, WS, TOKEN, sk_desc, sk_smem, HALF)
    else:   # causal, first q block: only the diagonal pair
        dq, ds_bits, ds_bits_b, scale, slot = _pair(
            gl.to_tensor(0), n_pairs, dq, ds_bits, ds_bits_b, scale, slot, q_smem, do_tile, k_smem, kt_smem, v_smem,
            xbuf_a, xbuf_b, bars, k_desc, kt_desc, v_desc, row0, t_row0, vb, vh, lse, delta, offs_m, q_scale, qk_const,
            SK_bh, TS_q, TS_step, s_layout, dp_layout, acc_layout, op_layout, all_layout, ts_layout, STAGES, ROWS,
            KV_ROWS, HEAD_DIM, True, True, empty, WS, TOKEN, sk_desc, sk_smem, HALF)
    # the last tile's product
    if TOKEN:
        dq = warpgroup_mma_wait(0, deps=[_pair_product(dq, ds_bits, ds_bits_b, kt_smem.index(slot), op_layout,
                                                       KV_ROWS, HEAD_DIM)])
    else:
        dq_int = warpgroup_mma(as_a_operand(ds_bits.to(gl.int8), op_layout),
                               kt_smem.index(slot).slice(KV_ROWS, KV_ROWS, dim=1).permute((1, 0)),
                               gl.zeros([ROWS, HEAD_DIM], gl.int32, acc_layout), use_acc=False)
        dq = _add_product(dq, dq_int, scale)

    offs_r = start_m + OFF + gl.arange(0, ROWS, layout=gl.SliceLayout(1, acc_layout))
    dq = dq * sm_scale
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    DQ_bh = DQ + vb.to(gl.int64) * stride_gb + vh.to(gl.int64) * stride_gh
    gl.store(DQ_bh + offs_r[:, None] * stride_gn + offs_d[None, :], dq.to(DQ.dtype.element_ty))


@gluon.jit
def _dq_kernel(q_desc, do_desc, k_desc, kt_desc, v_desc, SQ, SK, LSE2, DELTA, DQ, stride_gb, stride_gh, stride_gn,
               TILE_SCALES, sm_scale, N, H, SECTION, sk_desc,
               HEAD_DIM: gl.constexpr, Q_ROWS: gl.constexpr, KV_ROWS: gl.constexpr, CAUSAL: gl.constexpr,
               STAGES: gl.constexpr, WS: gl.constexpr, PRODUCER_REGS: gl.constexpr, TOKEN: gl.constexpr,
               SPLIT: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    """TOKEN: the token contract (SQ, SK per token, sk_desc SK's TMA view in boxes of a tile pair; kt_desc K in
    bf16; TILE_SCALES unused), else the block contract (sk_desc unused). SPLIT (TOKEN, WS; launched with 4
    warps): the block's two halves on two consumer partitions of one warpgroup each, which share the
    ring (a slot is free once both have arrived) and take turns issuing their products (_tile_token)."""
    gl.static_assert(Q_ROWS == 2 * KV_ROWS, "the causal diagonal is the block's last tile pair")
    nw: gl.constexpr = gl.num_warps()
    # Causal: the last q blocks see the most keys; they run first (rank 0, schedule.py).
    rank, bh = program_tile(N // Q_ROWS, SECTION)
    pid_m = N // Q_ROWS - 1 - rank
    start_m = pid_m * Q_ROWS
    row0 = bh * N
    vb = bh // H
    vh = bh % H
    t_row0 = bh * HEAD_DIM
    if CAUSAL:
        n_pairs = pid_m + 1
    else:
        n_pairs = N // Q_ROWS

    q_smem = gl.allocate_shared_memory(gl.int8, [Q_ROWS, HEAD_DIM], q_desc.layout)
    # v and dO: (rows, HEAD_DIM) or, by 4-D descriptors on their own strides, (1, 1, rows, HEAD_DIM) boxes
    do_smem = gl.allocate_shared_memory(do_desc.dtype, do_desc.block_type.shape, do_desc.layout)
    k_smem = gl.allocate_shared_memory(gl.int8, [STAGES, 2 * KV_ROWS, HEAD_DIM], k_desc.layout)
    # K^T INT8, or (TOKEN) K in bf16 in (2 KV_ROWS, HEAD_DIM) or (1, 1, 2 KV_ROWS, HEAD_DIM) boxes as V's
    kt_smem = gl.allocate_shared_memory(kt_desc.dtype, [STAGES] + kt_desc.block_type.shape, kt_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    # One exchange buffer per tile of a pair: separate allocations, so that the compiler's barrier
    # before reading one also orders the previous reads of the other (one barrier per tile).
    x_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    xbuf_a = gl.allocate_shared_memory(gl.float32, [nw, 2], x_layout)
    xbuf_b = gl.allocate_shared_memory(gl.float32, [nw, 2], x_layout)
    if TOKEN:   # s_K of each tile pair, a ring beside K^'s (the block contract: nothing, xbuf_a stands in)
        sk_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + sk_desc.block_type.shape, sk_desc.layout)
    else:
        sk_smem = xbuf_a
    bars = gl.allocate_shared_memory(gl.int64, [STAGES + 1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES + 1):
        mbarrier.init(bars.index(i), count=1)
    q_bar = bars.index(STAGES)
    if SPLIT:
        # the ring's empties, then the two consumers' turn barriers (_tile_token with HALF)
        empty = gl.allocate_shared_memory(gl.int64, [STAGES + 2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(empty.index(i), count=2)   # one arrive per consumer, after a barrier of its own
        mbarrier.init(empty.index(STAGES), count=1)
        mbarrier.init(empty.index(STAGES + 1), count=1)
        gl.warp_specialize([
            (_dq_block, (q_smem, do_smem, k_smem, kt_smem, v_smem, xbuf_a, xbuf_b, bars, q_bar, empty, k_desc,
                        kt_desc, v_desc, SQ, SK, LSE2, DELTA, DQ, stride_gb, stride_gh, stride_gn, TILE_SCALES,
                        sm_scale, N, H, pid_m, bh, n_pairs, HEAD_DIM, Q_ROWS, KV_ROWS, CAUSAL, STAGES, True, TOKEN,
                        sk_desc, sk_smem, 0)),
            (_dq_block, (q_smem, do_smem, k_smem, kt_smem, v_smem, xbuf_a, xbuf_b, bars, q_bar, empty, k_desc,
                        kt_desc, v_desc, SQ, SK, LSE2, DELTA, DQ, stride_gb, stride_gh, stride_gn, TILE_SCALES,
                        sm_scale, N, H, pid_m, bh, n_pairs, HEAD_DIM, Q_ROWS, KV_ROWS, CAUSAL, STAGES, True, TOKEN,
                        sk_desc, sk_smem, 1)),
            (_producer, (q_desc, do_desc, k_desc, kt_desc, v_desc, q_smem, do_smem, k_smem, kt_smem, v_smem, q_bar,
                         bars, empty, row0, t_row0, vb, vh, start_m, n_pairs, STAGES, KV_ROWS, sk_desc, sk_smem,
                         TOKEN)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    elif WS:
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(empty.index(i), count=1)   # the consumers arrive once, after a barrier of theirs
        gl.warp_specialize([
            (_dq_block, (q_smem, do_smem, k_smem, kt_smem, v_smem, xbuf_a, xbuf_b, bars, q_bar, empty, k_desc,
                        kt_desc, v_desc, SQ, SK, LSE2, DELTA, DQ, stride_gb, stride_gh, stride_gn, TILE_SCALES,
                        sm_scale, N, H, pid_m, bh, n_pairs, HEAD_DIM, Q_ROWS, KV_ROWS, CAUSAL, STAGES, True, TOKEN,
                        sk_desc, sk_smem)),
            (_producer, (q_desc, do_desc, k_desc, kt_desc, v_desc, q_smem, do_smem, k_smem, kt_smem, v_smem, q_bar,
                         bars, empty, row0, t_row0, vb, vh, start_m, n_pairs, STAGES, KV_ROWS, sk_desc, sk_smem,
                         TOKEN)),
        ], [1], [PRODUCER_REGS])
    else:
        mbarrier.expect(q_bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [row0 + start_m, 0], q_bar, q_smem)
        _seq_copy(do_desc, vb, vh, row0, start_m, q_bar, do_smem)
        for i in gl.static_range(STAGES):
            if i < n_pairs:
                _load_pair(k_desc, kt_desc, v_desc, k_smem, kt_smem, v_smem, bars, i, row0, t_row0, vb, vh, STAGES,
                           KV_ROWS, sk_desc, sk_smem, TOKEN)
        _dq_block(q_smem, do_smem, k_smem, kt_smem, v_smem, xbuf_a, xbuf_b, bars, q_bar, bars, k_desc, kt_desc, v_desc,
                 SQ, SK, LSE2, DELTA, DQ, stride_gb, stride_gh, stride_gn, TILE_SCALES, sm_scale, N, H, pid_m, bh,
                 n_pairs, HEAD_DIM, Q_ROWS, KV_ROWS, CAUSAL, STAGES, False, TOKEN, sk_desc, sk_smem)
        for i in gl.static_range(STAGES + 1):
            mbarrier.invalidate(bars.index(i))
