"""Host side of the Gluon (Hopper) backward kernels: their TMA descriptors and launches.

The kernels: ``dq_hopper`` (dQ, with or without a producer warp), ``dkdv_hopper`` (dK/dV on one
warpgroup per kv tile, the reference) and ``dkdv_ws_hopper`` (its warp-specialised form, two kv
tiles per program). Which of them runs is the registry's choice (``registry.KERNELS``: dq and dkdv
"gluon", "gluon-ws"); these functions launch the chosen one.
"""
from __future__ import annotations

import functools

import torch
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from . import dkdv_hopper, dkdv_ws_hopper, dq_hopper
from .launch import Tuning, launch
from .schedule import heads_per_section, tile_grid


@functools.lru_cache(maxsize=None)
def _shared_layout(block: tuple, dtype: torch.dtype):
    """The swizzled shared-memory layout of a `block` box (get_default_for costs ~10 us a call:
    half of a descriptor's host time, and a backward builds ~20 descriptors)."""
    gl_dtype = {torch.int8: gl.int8, torch.float8_e4m3fn: gl.float8e4nv, torch.bfloat16: gl.bfloat16,
                torch.float16: gl.float16, torch.float32: gl.float32, torch.int32: gl.int32}[dtype]
    return gl.NVMMASharedLayout.get_default_for(list(block), gl_dtype)


def desc(t, block, strides=None):
    """TMA descriptor of t in `block` boxes, on t's strides unless given."""
    return TensorDescriptor(t, list(t.shape), strides or list(t.stride()), block, _shared_layout(tuple(block), t.dtype))


def _tma_ready(t):
    """t as a contiguous tensor at a 16-byte aligned address (what a TMA descriptor needs); a copy
    only where t is not already."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def seq_desc(t, rows: int):
    """TMA descriptor of v or dO (B, H, N, D) in boxes of `rows` rows of one head: 2-D over
    (B*H*N, D) when t is contiguous, else 4-D on t's own strides ((1, 1, rows, D) boxes).

    The model hands v as a permuted view of its qkv projection and dO as a transposed view,
    DeepSpeed's Ulysses other permutations. A contiguous copy per kernel that reads them cost
    2-4 copies per backward (fwd+bwd in the model's layout +4% at d=64, +9% at d=128, H200);
    4-D boxes cost the d=64 dK/dV kernel 6% where none is needed, hence 2-D for contiguous t.
    A copy is left only where TMA cannot read t: inner stride not 1, another stride or the
    base not 16-byte aligned.
    """
    # a size-1 dim's stride is never used; give it one TMA accepts
    strides = [s if n > 1 else t.shape[-1] for s, n in zip(t.stride(), t.shape)]
    if strides[-1] != 1 or any(s * t.element_size() % 16 for s in strides[:-1]) or t.data_ptr() % 16:
        t = _tma_ready(t)
    d = t.shape[-1]
    if t.is_contiguous():
        return desc(t.reshape(-1, d), [rows, d])
    return desc(t, [1, 1, rows, d], strides)


def dkdv_args(q8, q_operand, s_q, k8, s_k, v, do, do8t, s_do, lse2, delta, tile_scales, dk, dv, *, kv_rows: int,
              q_rows: int, token: bool) -> tuple:
    """The arguments of a Gluon dK/dV kernel up to its constexprs: TMA descriptors in boxes of kv_rows (one
    tile, or both of a warp-specialised program) and q_rows (a block or a slice), the scales, the outputs.
    q_operand: dK's Q operand, Q^T INT8 (block) or Q itself (token: any strides, bf16, or fp16 converted)."""
    b, h, n, d = q8.shape
    rows = b * h * n
    # dK's Q operand: Q in bf16 rows as dO's (token; no copy when Q is bf16), or Q^T INT8 (block)
    qt_desc = (seq_desc(q_operand.to(torch.bfloat16), q_rows) if token else
               desc(q_operand.reshape(b * h * d, n), [d, q_rows]))
    return (desc(k8.reshape(rows, d), [kv_rows, d]), seq_desc(v, kv_rows), desc(q8.reshape(rows, d), [q_rows, d]),
            seq_desc(do, q_rows), qt_desc,
            desc(do8t.reshape(b * h * d, n), [d, q_rows]), desc(lse2.reshape(rows), [q_rows]),
            desc(delta.reshape(rows), [q_rows]), s_q, s_k, s_do, tile_scales, dk, dv, *dk.stride()[:3],
            1.0 / d ** 0.5, n, h, desc((s_q if token else lse2).reshape(rows), [q_rows]))   # block: unused


def dkdv_launches(q8, q_operand, s_q, k8, s_k, v, do, do8t, s_do, lse2, delta, tile_scales, dk, dv, *, causal: bool,
                  block_q: int, ws: bool, token: bool = False, dq_reduce: tuple | None = None,
                  dq_groups: int = 1, dq_product: int = 0) -> list:
    """[(name, kernel, grid, args, kwargs)] of the launches of one dK/dV: one at d=64, dV then dK at
    d=128; as dkdv_ws_hopper's kernel if `ws` (seq a multiple of 128), else dkdv_hopper's. v and do may
    have any strides and alignment. token: the token contract (s_q, s_k per token; s_q comes by TMA
    with each q block, as LSE does; q_operand is Q itself, dK's bf16 operand, and lse2 is lse2 - log2(256),
    BackwardCall.lse2_p; tile_scales unused). dq_reduce (ws, d=64; a measurement,
    tools.dq_reduce_probe): (an fp32 (B*H*N, D) buffer, zeroed int32 counters (B*H, N/128, 2) or None) into which
    every q block's dK accumulator is added by TMA as a fused backward's dQ partials would be, in a fixed order if
    the counters are given (dK and dV unchanged); or (an int32 buffer, None, scale): added as int32
    round(partial scale); dq_groups > 1: in that many ordered chains, into as many copies of dQ (the buffer's rows
    and the counters' first dimension dq_groups times as many); dq_product (with an int32 buffer) 1: each partial
    is first a real INT8 dQ product from shared memory (its operands' values not written: the cost of the product,
    its wait and conversion), one dQ stage per consumer (shared memory); 2: with X^ made and stored by every block
    (dkdv_hopper._x_probe); 3: a bf16 product of Y made and stored by every block (dkdv_hopper._y16_probe) and K^T
    in bf16."""
    b, h, n, d = q8.shape
    tile_rows = dkdv_hopper.ROWS
    if dq_product not in (0, 1, 2, 3):
        raise ValueError(f"dq_product={dq_product!r}: 0 (none), 1 (INT8), 2 (INT8 with X^ made) or 3 (bf16 of Y)")

    def args(kv_rows, q_rows):
        return dkdv_args(q8, q_operand, s_q, k8, s_k, v, do, do8t, s_do, lse2, delta, tile_scales, dk, dv,
                         kv_rows=kv_rows, q_rows=q_rows, token=token)
    kwargs = dict(HEAD_DIM=d, SLICE=dkdv_hopper.SLICE, CAUSAL=causal, TOKEN=token, num_warps=4)
    # (name, PASS, whole q blocks per copy, diagonal block masked in the loop, stages)
    passes = [("dkdv", dkdv_hopper.BOTH, True, False, dkdv_hopper.STAGES)] if d <= 64 else \
        [("dv", dkdv_hopper.DV_ONLY, True, False, dkdv_hopper.STAGES),
         ("dk", dkdv_hopper.DK_ONLY, dkdv_hopper.DK_BLOCKED, dkdv_hopper.DK_DIAG_IN_LOOP, dkdv_hopper.STAGES_DK128)]
    out = []
    for name, pass_, blocked, diag_in_loop, stages in passes:
        q_rows = 2 * dkdv_hopper.SLICE if blocked else dkdv_hopper.SLICE
        common = {**kwargs, "PASS": pass_.value, "BLOCKED": blocked, "DIAG_IN_LOOP": diag_in_loop}
        if ws:
            ws_args = args(2 * tile_rows, q_rows)
            if dq_reduce is None:
                reduce_args, mode = (ws_args[-1], s_q, 1.0), dkdv_hopper.NO_DQ   # placeholders, unused
            else:
                buffer, counters, *scale = dq_reduce
                if buffer.dtype == torch.int32 and counters is not None:
                    raise ValueError("fixed-point dQ adds (an int32 buffer) need no order: pass no counters")
                reduce_args = (desc(buffer, [dkdv_hopper.SLICE, d]), s_q if counters is None else counters,
                               *(scale or [1.0]))
                mode = (dkdv_hopper.FIXED_DQ if buffer.dtype == torch.int32 else
                        dkdv_hopper.UNORDERED_DQ if counters is None else dkdv_hopper.ORDERED_DQ)
                if dq_product:
                    if mode != dkdv_hopper.FIXED_DQ:
                        raise ValueError("dq_product adds its int32 partials: pass an int32 buffer and no counters")
                    mode = {1: dkdv_hopper.PRODUCT_DQ, 2: dkdv_hopper.PRODUCT_X_DQ,
                            3: dkdv_hopper.PRODUCT_Y16_DQ}[dq_product]
            out.append((name, dkdv_ws_hopper._dkdv_ws_kernel, (n // (2 * tile_rows), b * h), (*ws_args, *reduce_args),
                        {**common, "STAGES": dkdv_ws_hopper.STAGES[name], "CONSUMER_REGS": dkdv_ws_hopper.CONSUMER_REGS,
                         "PRODUCER_REGS": dkdv_ws_hopper.PRODUCER_REGS, "DQ_REDUCE": mode.value,
                         "DQ_GROUPS": dq_groups, "DQ_STAGES": 1 if dq_product else 2}))
        elif dq_reduce is not None:
            raise ValueError("dq_reduce needs the warp-specialised dK/dV (ws)")
        else:
            out.append((name, dkdv_hopper._dkdv_kernel, (n // tile_rows, b * h), args(tile_rows, q_rows),
                        {**common, "Q_BLOCK": block_q, "KV_BLOCK": tile_rows, "STAGES": stages}))
    return out


def dq_launch_args(q8, k8, k_operand, s_q, s_k, v, do, lse2, delta, dq, tile_scales, *, causal: bool, ws: bool,
                   token: bool = False, split: bool = False):
    """(grid, args, kwargs) of the one dQ launch; v and do may have any strides and alignment. token: the
    token contract (s_q, s_k per token, s_k also by TMA with each tile pair; k_operand K itself (bf16, or fp16
    converted), in any layout, dQ's 16-bit operand; tile_scales unused, a placeholder). split (token, ws): each half
    of the q block on a consumer warpgroup of its own. k_operand: dQ's B operand, K^T INT8 (block) or K (token)."""
    if split and not (token and ws):
        raise ValueError("the two-consumer dQ (split) needs the token contract (its scales stay within a warpgroup) "
                         "and the warp-specialised kernel (ws)")
    b, h, n, d = q8.shape
    rows = b * h * n
    q_rows, kv_rows = dq_hopper.Q_ROWS, dq_hopper.KV_ROWS
    if token:   # dQ = bf16(dS) K16: K in bf16 (simulate.token_dq), rows as V's
        kt_desc = seq_desc(k_operand.to(torch.bfloat16), 2 * kv_rows)   # no copy when K is bf16
    else:
        kt_desc = desc(k_operand.reshape(b * h * d, n), [d, 2 * kv_rows])
    args = (desc(q8.reshape(rows, d), [q_rows, d]), seq_desc(do, q_rows), desc(k8.reshape(rows, d), [2 * kv_rows, d]),
            kt_desc, seq_desc(v, 2 * kv_rows), s_q, s_k, lse2, delta, dq,
            *dq.stride()[:3], tile_scales, 1.0 / d ** 0.5, n, h,
            heads_per_section(causal, b * h, (k8, k_operand, v)),
            desc((s_k if token else lse2).reshape(rows), [2 * kv_rows]))   # block: unused
    kwargs = dict(HEAD_DIM=d, Q_ROWS=q_rows, KV_ROWS=kv_rows, CAUSAL=causal, STAGES=dq_hopper.stages(d, causal, token),
                  num_warps=4 if split else 8, WS=ws, PRODUCER_REGS=dq_hopper.PRODUCER_REGS, TOKEN=token, SPLIT=split,
                  CONSUMER_REGS=dq_hopper.CONSUMER_REGS)
    return tile_grid(n // q_rows, b * h), args, kwargs


def run_dq(c, tuning: Tuning | None = None, *, ws: bool, split: bool = False) -> None:
    """The Gluon dQ (registry: dq "gluon", "gluon-ws", "gluon-ws2"), on a backward.BackwardCall, in its
    contract; its own launch settings (a tool's overrides are the Triton kernels')."""
    grid, args, kwargs = dq_launch_args(c.q8, c.k8, c.k if c.token else c.k8t, c.s_q, c.s_k, c.v, c.do, c.lse2,
                                        c.delta, c.dq, c.tile_scales, causal=c.causal, ws=ws, token=c.token,
                                        split=split)
    launch("dq", dq_hopper._dq_kernel, grid, *args, tuning=tuning, **kwargs)


def run_dkdv(c, tuning: Tuning | None = None, *, ws: bool) -> None:
    """The Gluon dK/dV (registry: dkdv "gluon", "gluon-ws"), on a backward.BackwardCall, in its contract."""
    for name, kernel, grid, args, kwargs in dkdv_launches(
            c.q8, c.q if c.token else c.q8t, c.s_q, c.k8, c.s_k, c.v, c.do, c.do8t, c.s_do,
            c.lse2_p if c.token else c.lse2, c.delta, c.tile_scales, c.dk, c.dv, causal=c.causal, block_q=c.block_q,
            ws=ws, token=c.token):
        launch(name, kernel, grid, *args, tuning=tuning, **kwargs)
