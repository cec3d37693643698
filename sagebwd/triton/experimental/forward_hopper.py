"""Forward kernel for Hopper in Gluon (experimental; registry: forward "gluon"): forward.py's arithmetic,
with the next tile's S = Q^K^T on the tensor cores while this tile's softmax runs.

Triton 3.6 waits for each of forward.py's dots right after issuing it (neither accumulates
into a loop-carried value: each tile has its own scale), so a warp's work is one dependent
chain S -> softmax -> P^ -> P^V. Here the waits are explicit (FlashAttention-3's
intra-warpgroup overlap): iteration j issues S_j = Q^K_j^T and P^_{j-1}V^_{j-1} together, runs
tile j's softmax and quantisation while both are on the tensor cores, and only then waits for
P^V. K^/V^ tiles arrive by TMA into a ring of STAGES buffers. The update acc_j = acc_{j-1} *
alpha_j + pv_j * c_j is applied one iteration late (alpha and c are carried), in forward.py's
order; O differs from forward.py's by one bf16 ulp in 1e-5 to 1e-4 of its elements (the
compiler contracts differently), the LSE by <= 1e-6.

Measured on an H200 (docs/kernel-notes.md): the overlap cut the cycles between a warp's
instructions from 5.3 to 3.2, but at 16 warps per SM the forward already issues in 74% of
cycles, so the time moved by -2.5% (d=128 causal) to +5% (d=64 causal): not the default.
Limits (forward.py runs otherwise): no Q-smoothing bias, 64-row programs with block_kv = 64, so
the causal diagonal is exactly the last tile.
"""
from __future__ import annotations

import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .._common import program_tile
from ..dkdv_hopper import as_a_operand
from ..schedule import heads_per_section, tile_grid

G_LOG2E = gl.constexpr(1.4426950408889634)
G_LN2 = gl.constexpr(0.6931471805599453)
G_MAGIC_F = gl.constexpr(12582912.0)        # 1.5 * 2**23: see _common.MAGIC_F
G_MASKED_INT = gl.constexpr(-(2**22 - 1))   # forward.MASKED_INT

BLOCK = 64      # q rows per program = kv rows per tile = block_kv
STAGES = 3      # K^/V^ tiles in flight


@gluon.jit
def _load_kv(k_desc, v_desc, k_smem, v_smem, bars, tile, k_row0, v_row0,
             STAGES: gl.constexpr, BLOCK_N: gl.constexpr):
    slot = tile % STAGES
    bar = bars.index(slot)
    mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [k_row0 + tile * BLOCK_N, 0], bar, k_smem.index(slot))
    tma.async_copy_global_to_shared(v_desc, [v_row0, tile * BLOCK_N], bar, v_smem.index(slot))


@gluon.jit
def _tile_probs(x, scale, offs_m, offs_n, MASK):
    """forward.py's unsmoothed-Q tile: t = rowmax(S) from the integers, P~ = exp2(S - t), P^."""
    if MASK:
        x = gl.where(offs_m[:, None] >= offs_n[None, :], x, G_MASKED_INT)
    t = gl.max(x, axis=1).to(gl.float32) * scale
    p = gl.exp2(x.to(gl.float32) * scale - t[:, None])
    if MASK:
        p = gl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
    bits = (p * 127.0 + G_MAGIC_F).to(gl.int32, bitcast=True)   # P^ in its low byte
    return t, p, bits


@gluon.jit
def _step(j, n_tiles, acc, l_i, m_i, alpha, c, p8, q_smem, k_smem, v_smem, bars, k_desc, v_desc,
          k_row0, v_row0, q_scale, SK_bh, SV_bh, offs_m, offs_n, zero_s, zero_o,
          BLOCK_N: gl.constexpr, STAGES: gl.constexpr, p_layout: gl.constexpr, row_o: gl.constexpr,
          MASK: gl.constexpr):
    """Tile j's S and tile j-1's P^V on the tensor cores, tile j's softmax meanwhile.

    State (acc, l_i, m_i) is forward.py's after tile j-2 plus tile j-1's pending alpha, c and
    P^ (magic-domain bits); returns the same one tile later.
    """
    slot = j % STAGES
    mbarrier.wait(bars.index(slot), (j // STAGES) & 1)
    s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    pv_tok = warpgroup_mma(as_a_operand(p8.to(gl.int8), p_layout),
                           v_smem.index((j - 1) % STAGES).permute((1, 0)), zero_o, use_acc=False, is_async=True)
    scale = q_scale * gl.load(SK_bh + j)
    sv = gl.load(SV_bh + j)
    x = warpgroup_mma_wait(1, deps=[s_tok])
    t, p, p8_next = _tile_probs(x, scale, offs_m, j * BLOCK_N + offs_n, MASK)
    m_new = gl.maximum(m_i, t)
    alpha_next = gl.exp2(m_i - m_new)
    w = gl.exp2(t - m_new)
    l_i = l_i * alpha_next + w * gl.sum(p, axis=1)
    pv = warpgroup_mma_wait(0, deps=[pv_tok])
    if j - 1 + STAGES < n_tiles:   # tile j-1's buffers are free: refill them
        _load_kv(k_desc, v_desc, k_smem, v_smem, bars, j - 1 + STAGES, k_row0, v_row0, STAGES, BLOCK_N)
    acc = (acc * gl.convert_layout(alpha, row_o)[:, None]
           + pv.to(gl.float32) * gl.convert_layout(c, row_o)[:, None])
    return acc, l_i, m_new, alpha_next, w * (sv * (1.0 / 127.0)), p8_next


@gluon.jit
def _forward_kernel(q_desc, k_desc, v_desc, SQ, SK, SV, O, LSE, stride_ob, stride_oh, stride_on, sm_scale, N, H,
                    SECTION,
                    BLOCK_M: gl.constexpr, Q_BLOCK: gl.constexpr, BLOCK_N: gl.constexpr,
                    HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    gl.static_assert(BLOCK_M == BLOCK_N, "the causal diagonal must be exactly the last tile")
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 32])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    # Causal: the last q blocks see the most keys; they run first (rank 0, schedule.py).
    rank, bh = program_tile(N // BLOCK_M, SECTION)
    pid_m = N // BLOCK_M - 1 - rank
    start_m = pid_m * BLOCK_M
    if CAUSAL:
        n_tiles = pid_m + 1
    else:
        n_tiles = N // BLOCK_N

    q_smem = gl.allocate_shared_memory(gl.int8, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(gl.int8, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.int8, [STAGES, HEAD_DIM, BLOCK_N], v_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES + 1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES + 1):
        mbarrier.init(bars.index(i), count=1)
    q_bar = bars.index(STAGES)
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [bh * N + start_m, 0], q_bar, q_smem)
    k_row0 = bh * N
    v_row0 = bh * HEAD_DIM
    for i in gl.static_range(STAGES):
        if i < n_tiles:
            _load_kv(k_desc, v_desc, k_smem, v_smem, bars, i, k_row0, v_row0, STAGES, BLOCK_N)

    q_scale = gl.load(SQ + bh * (N // Q_BLOCK) + start_m // Q_BLOCK) * (sm_scale * G_LOG2E)
    SK_bh = SK + bh * (N // BLOCK_N)
    SV_bh = SV + bh * (N // BLOCK_N)
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_s)
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.int32, s_layout)
    zero_o = gl.zeros([BLOCK_M, HEAD_DIM], gl.int32, o_layout)

    # Tile 0 (forward.py's first iteration: m = t, alpha = exp2(-inf) = 0, w = 1).
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(bars.index(0), 0)
    x = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False)
    if CAUSAL:
        t, p, p8 = _tile_probs(x, q_scale * gl.load(SK_bh), offs_m, offs_n, n_tiles == 1)
    else:
        t, p, p8 = _tile_probs(x, q_scale * gl.load(SK_bh), offs_m, offs_n, False)
    m_i = t
    l_i = gl.sum(p, axis=1)
    alpha = gl.zeros([BLOCK_M], gl.float32, row_s)
    c = gl.load(SV_bh) * (1.0 / 127.0) + alpha      # w = 1
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)

    # Causal: the diagonal tile (the last) is peeled off, so the loop body has no mask.
    if CAUSAL:
        n_unmasked = n_tiles - 1
    else:
        n_unmasked = n_tiles
    for j in range(1, n_unmasked):
        acc, l_i, m_i, alpha, c, p8 = _step(
            j, n_tiles, acc, l_i, m_i, alpha, c, p8, q_smem, k_smem, v_smem, bars, k_desc, v_desc,
            k_row0, v_row0, q_scale, SK_bh, SV_bh, offs_m, offs_n, zero_s, zero_o,
            BLOCK_N, STAGES, p_layout, row_o, False)
    if CAUSAL:
        if n_tiles > 1:
            acc, l_i, m_i, alpha, c, p8 = _step(
                n_tiles - 1, n_tiles, acc, l_i, m_i, alpha, c, p8, q_smem, k_smem, v_smem, bars, k_desc,
                v_desc, k_row0, v_row0, q_scale, SK_bh, SV_bh, offs_m, offs_n, zero_s, zero_o,
                BLOCK_N, STAGES, p_layout, row_o, True)

    pv = warpgroup_mma(as_a_operand(p8.to(gl.int8), p_layout),
                       v_smem.index((n_tiles - 1) % STAGES).permute((1, 0)), zero_o, use_acc=False)
    acc = acc * gl.convert_layout(alpha, row_o)[:, None] + pv.to(gl.float32) * gl.convert_layout(c, row_o)[:, None]
    for i in gl.static_range(STAGES + 1):
        mbarrier.invalidate(bars.index(i))

    o = acc * (1.0 / gl.convert_layout(l_i, row_o))[:, None]
    offs_mo = start_m + gl.arange(0, BLOCK_M, layout=row_o)
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    O_bh = O + (bh // H).to(gl.int64) * stride_ob + (bh % H).to(gl.int64) * stride_oh
    gl.store(O_bh + offs_mo[:, None] * stride_on + offs_d[None, :], o.to(O.dtype.element_ty))
    gl.store(LSE + bh * N + offs_m, m_i * G_LN2 + gl.log(l_i))


def descriptors(q8, k8, v8t):
    """TMA descriptors of Q^, K^ (B*H*N, D) and V^T (B*H*D, N), in 64-row/64-column tiles."""
    b, h, n, d = q8.shape
    rows = gl.NVMMASharedLayout.get_default_for([BLOCK, d], gl.int8)
    cols = gl.NVMMASharedLayout.get_default_for([d, BLOCK], gl.int8)
    q2, k2, v2 = q8.reshape(b * h * n, d), k8.reshape(b * h * n, d), v8t.reshape(b * h * d, n)
    return (TensorDescriptor(q2, list(q2.shape), list(q2.stride()), [BLOCK, d], rows),
            TensorDescriptor(k2, list(k2.shape), list(k2.stride()), [BLOCK, d], rows),
            TensorDescriptor(v2, list(v2.shape), list(v2.stride()), [d, BLOCK], cols))


def launch_args(q8, k8, v8t, s_q, s_k, s_v, o, lse, *, causal: bool, block_q: int):
    """(grid, args, kwargs) of one launch; shared by forward() and the offline compiler."""
    b, h, n, d = q8.shape
    args = (*descriptors(q8, k8, v8t), s_q, s_k, s_v, o, lse, *o.stride()[:3], 1.0 / math.sqrt(d), n, h,
            heads_per_section(causal, b * h, (k8, v8t)))
    kwargs = dict(BLOCK_M=BLOCK, Q_BLOCK=block_q, BLOCK_N=BLOCK, HEAD_DIM=d, CAUSAL=causal, STAGES=STAGES,
                  num_warps=4)
    if d == 64:   # 4 programs per SM: causal (8,16,4096,64) 0.888 -> 0.822 ms on an H200 (10 B spilled)
        kwargs["maxnreg"] = 128
    return tile_grid(n // BLOCK, b * h), args, kwargs


def run(q8, k8, v8t, s_q, s_k, s_v, *, out_dtype, causal: bool, smooth_k: bool, mu_q, k, k_mean, block_q: int,
        block_kv: int, layout_of=None, quant: str = "block", tuning=None):
    """O (B,H,N,D) in out_dtype (in layout_of's memory order) and LSE (B,H,N) fp32, as forward.forward
    without Q-smoothing (registry: forward "gluon"; smooth_k, mu_q, k, k_mean, block_kv are the
    Triton forward's arguments, which its limits make unused here; the registry runs it for the
    "block" contract only)."""
    from .._common import empty_in_layout_of
    from ..launch import launch
    b, h, n, d = q8.shape
    o = empty_in_layout_of(q8 if layout_of is None else layout_of, out_dtype)
    lse = torch.empty(b, h, n, device=q8.device, dtype=torch.float32)
    grid, args, kwargs = launch_args(q8, k8, v8t, s_q, s_k, s_v, o, lse, causal=causal, block_q=block_q)
    launch("forward", _forward_kernel, grid, *args, tuning=tuning, **kwargs)
    return o, lse
