"""Attention's q, k, v from the fused qkv projection: split, QK-norm (optional) and RoPE in one kernel.

`model.qkv_impl` chooses how (model/config.py):
  "plain": the torch formula of model/layers.py (RMSNorm, then RotaryEmbedding), the reference;
  "fused": one Triton kernel each way on CUDA (or Triton's interpreter), the same formula to bf16 rounding.
    Forward: reads q, k, v from the projection's (batch, seq, 3 * hidden) output once and writes them dense
    as (batch, seq, heads, head_dim), the layout the plain formula's views have (so attention's O and
    gradients keep theirs). Backward: writes the projection's gradient in one pass (dq and dk through RoPE
    and the norm, dv copied), and each norm weight's gradient as per-program partial sums added in a fixed
    order (deterministic). Elsewhere (CPU) "fused" runs the plain formula.
Why: under torch.compile Inductor splits the plain formula into a per-row reduction, a pointwise kernel that
re-reads q and k, and backward kernels joined to the projection's gradient by a copy: ~3.1 ms of a 40 ms step
of gpu-124m at seq 4096 on an H200, against ~1 ms that the bytes need (docs/benchmarks.md, "QK-norm and RoPE in
one kernel").

Arithmetic, in the plain formula's order with products rounded singly (no FMA contraction, as eager torch):
  r = rsqrt(mean(x^2) + eps);  n = bf16((x r) w);  (y1, y2) = (n1 cos - n2 sin, n2 cos + n1 sin)
with (x1, x2) the halves of the head dim (RoPE's rotate-half pairing). Only the sum of squares is added in
another order than torch's, so outputs may differ from the plain formula's in the last bit.
"""
from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import triton
import triton.language as tl

from sagebwd.triton._common import interpreting, to_16bit

QkvImpl = Literal["plain", "fused"]

_LIB = "sagebwd_model"


class Launch(NamedTuple):
    """Tokens of one head per program, and warps per program (`python -m benchmarks.qkv --launches` sweeps them)."""
    block_tokens: int = 64
    num_warps: int = 4


LAUNCH = Launch()


def supports_fused(head_dim: int) -> bool:
    """The kernels take the head dim's halves as power-of-two tiles."""
    return head_dim >= 4 and head_dim & (head_dim - 1) == 0


@triton.jit
def _rotate(n1, n2, c, s):
    return n1 * c - n2 * s, n2 * c + n1 * s


@triton.jit
def _rsqrt_mean_square(x1, x2, eps, HEAD_DIM: tl.constexpr):
    ss = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)
    return 1.0 / tl.sqrt_rn(ss / HEAD_DIM + eps)   # correctly rounded, like torch.rsqrt to within 1 ulp


@triton.jit
def _qkv_forward_kernel(QKV, WQ, WK, COS, SIN, Q, K, V, stride_b, stride_n, H, N, HIDDEN, eps,
                    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, NORM: tl.constexpr):
    """Program (tile, b * H + h): tokens tile*BLOCK.. of head h; q and k normed (NORM) and rotated, v copied."""
    HALF: tl.constexpr = HEAD_DIM // 2
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    offs_h = tl.arange(0, HALF)
    rows = (offs_n < N)[:, None]
    src = QKV + b.to(tl.int64) * stride_b + offs_n[:, None].to(tl.int64) * stride_n + h * HEAD_DIM + offs_h[None, :]
    dst = ((b.to(tl.int64) * N + offs_n[:, None]) * H + h) * HEAD_DIM + offs_h[None, :]
    table = offs_n[:, None] * HALF + offs_h[None, :]
    c = tl.load(COS + table, mask=rows, other=0.0).to(tl.float32)
    s = tl.load(SIN + table, mask=rows, other=0.0).to(tl.float32)
    for which in tl.static_range(2):
        x1 = tl.load(src + which * HIDDEN, mask=rows, other=0.0)
        x2 = tl.load(src + which * HIDDEN + HALF, mask=rows, other=0.0)
        dtype = x1.dtype
        x1 = x1.to(tl.float32)
        x2 = x2.to(tl.float32)
        if NORM:
            w = WQ if which == 0 else WK
            r = _rsqrt_mean_square(x1, x2, eps, HEAD_DIM)[:, None]
            x1 = to_16bit(x1 * r * tl.load(w + offs_h).to(tl.float32)[None, :], dtype).to(tl.float32)
            x2 = to_16bit(x2 * r * tl.load(w + HALF + offs_h).to(tl.float32)[None, :], dtype).to(tl.float32)
        y1, y2 = _rotate(x1, x2, c, s)
        out = Q if which == 0 else K
        tl.store(out + dst, to_16bit(y1, dtype), mask=rows)
        tl.store(out + dst + HALF, to_16bit(y2, dtype), mask=rows)
    for half in tl.static_range(2):
        tl.store(V + dst + half * HALF, tl.load(src + 2 * HIDDEN + half * HALF, mask=rows), mask=rows)


@triton.jit
def _qkv_backward_kernel(DQ, DK, DV, QKV, WQ, WK, COS, SIN, DQKV, DW, sq_b, sq_h, sq_n, sq_d, sk_b, sk_h, sk_n, sk_d,
                     sv_b, sv_h, sv_n, sv_d, stride_b, stride_n, H, N, HIDDEN, eps,
                     HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, NORM: tl.constexpr):
    """The projection's gradient for tokens tile*BLOCK.. of head h (program (tile, b * H + h)): dq and dk back
    through RoPE (the rotation's transpose) and the norm, dv copied; with NORM this program's share of each
    norm weight's gradient in DW[which, program] (fp32; the caller adds them in program order)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_n = tile * BLOCK + tl.arange(0, BLOCK)
    offs_h = tl.arange(0, HALF)
    rows = (offs_n < N)[:, None]
    at = b.to(tl.int64) * stride_b + offs_n[:, None].to(tl.int64) * stride_n + h * HEAD_DIM + offs_h[None, :]
    table = offs_n[:, None] * HALF + offs_h[None, :]
    c = tl.load(COS + table, mask=rows, other=0.0).to(tl.float32)
    s = tl.load(SIN + table, mask=rows, other=0.0).to(tl.float32)
    n64 = offs_n[:, None].to(tl.int64)
    for which in tl.static_range(2):
        if which == 0:
            g = DQ + b.to(tl.int64) * sq_b + h.to(tl.int64) * sq_h + n64 * sq_n + offs_h[None, :] * sq_d
            g1 = tl.load(g, mask=rows, other=0.0)
            g2 = tl.load(g + HALF * sq_d, mask=rows, other=0.0)
        else:
            g = DK + b.to(tl.int64) * sk_b + h.to(tl.int64) * sk_h + n64 * sk_n + offs_h[None, :] * sk_d
            g1 = tl.load(g, mask=rows, other=0.0)
            g2 = tl.load(g + HALF * sk_d, mask=rows, other=0.0)
        dtype = g1.dtype
        # the rotation's transpose; its result is RoPE's input gradient, in the input's dtype
        d1, d2 = _rotate(g1.to(tl.float32), g2.to(tl.float32), c, -s)
        d1 = to_16bit(d1, dtype)
        d2 = to_16bit(d2, dtype)
        if NORM:
            w = WQ if which == 0 else WK
            x1 = tl.load(QKV + at + which * HIDDEN, mask=rows, other=0.0).to(tl.float32)
            x2 = tl.load(QKV + at + which * HIDDEN + HALF, mask=rows, other=0.0).to(tl.float32)
            r = _rsqrt_mean_square(x1, x2, eps, HEAD_DIM)[:, None]
            n1 = x1 * r
            n2 = x2 * r
            gn1 = d1.to(tl.float32)
            gn2 = d2.to(tl.float32)
            program = tile * tl.num_programs(1) + bh
            dw = DW + (which * tl.num_programs(0) * tl.num_programs(1) + program) * HEAD_DIM + offs_h
            tl.store(dw, tl.sum(gn1 * n1, axis=0))
            tl.store(dw + HALF, tl.sum(gn2 * n2, axis=0))
            gn1 = gn1 * tl.load(w + offs_h).to(tl.float32)[None, :]
            gn2 = gn2 * tl.load(w + HALF + offs_h).to(tl.float32)[None, :]
            mean = ((tl.sum(gn1 * n1, axis=1) + tl.sum(gn2 * n2, axis=1)) / HEAD_DIM)[:, None]
            d1 = to_16bit(r * (gn1 - n1 * mean), dtype)
            d2 = to_16bit(r * (gn2 - n2 * mean), dtype)
        tl.store(DQKV + at + which * HIDDEN, d1, mask=rows)
        tl.store(DQKV + at + which * HIDDEN + HALF, d2, mask=rows)
    gv = DV + b.to(tl.int64) * sv_b + h.to(tl.int64) * sv_h + n64 * sv_n + offs_h[None, :] * sv_d
    for half in tl.static_range(2):
        tl.store(DQKV + at + 2 * HIDDEN + half * HALF, tl.load(gv + half * HALF * sv_d, mask=rows), mask=rows)


def _grid(batch: int, seq: int, heads: int) -> tuple[int, int]:
    return triton.cdiv(seq, LAUNCH.block_tokens), batch * heads


def _launch_options() -> dict:
    # Products rounded singly, as eager torch computes them (Triton would contract a * b + c into an FMA).
    options = {"BLOCK": LAUNCH.block_tokens}
    return options if interpreting() else {**options, "enable_fp_fusion": False, "num_warps": LAUNCH.num_warps}


def _check(qkv: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
    if qkv.dim() != 3 or qkv.shape[-1] % (3 * heads):
        raise ValueError(f"qkv must be (batch, seq, 3 * heads * head_dim) with heads={heads}, got {tuple(qkv.shape)}")
    if qkv.stride(-1) != 1:
        raise ValueError("qkv's last dim must be contiguous (a projection's output is)")
    head_dim = qkv.shape[-1] // (3 * heads)
    if not supports_fused(head_dim):
        raise ValueError(f"the fused kernels need a power-of-two head dim >= 4, got {head_dim}; use the plain "
                         "formula (model.qkv_impl=plain)")
    half = head_dim // 2
    for name, t in (("cos", cos), ("sin", sin)):
        if t.shape != (qkv.shape[1], half) or not t.is_contiguous() or not t.is_floating_point():
            raise ValueError(f"{name} must be a contiguous floating (seq, head_dim / 2) = ({qkv.shape[1]}, {half}) "
                             f"table, got {t.dtype} {tuple(t.shape)}")


def _forward_impl(qkv: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, cos: torch.Tensor,
                  sin: torch.Tensor, heads: int, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward kernel's launch: q, k, v dense (batch, seq, heads, head_dim). Both autograd paths run it."""
    _check(qkv, heads, cos, sin)
    batch, seq, width = qkv.shape
    hidden = width // 3
    head_dim = hidden // heads
    q, k, v = (qkv.new_empty((batch, seq, heads, head_dim)) for _ in range(3))
    norm = q_weight is not None
    _qkv_forward_kernel[_grid(batch, seq, heads)](
        qkv, q_weight if norm else cos, k_weight if norm else cos, cos, sin, q, k, v, qkv.stride(0), qkv.stride(1),
        heads, seq, hidden, eps, HEAD_DIM=head_dim, NORM=norm, **_launch_options())
    return q, k, v


def _backward_impl(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, qkv: torch.Tensor,
                   q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                   heads: int, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward kernel's launch: (dqkv, dq_weight, dk_weight); the weights' gradients are empty without the
    norm. Both autograd paths run it."""
    batch, seq, width = qkv.shape
    hidden = width // 3
    head_dim = hidden // heads
    dqkv = torch.empty_like(qkv, memory_format=torch.contiguous_format)
    norm = q_weight is not None
    grid = _grid(batch, seq, heads)
    dw = torch.empty((2, grid[0] * grid[1], head_dim), device=qkv.device, dtype=torch.float32) if norm else cos
    # dq, dk, dv as (batch, heads, seq, head_dim) on their own strides
    strides = [s for t in (dq, dk, dv) for s in t.transpose(1, 2).stride()]
    _qkv_backward_kernel[grid](
        dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2), qkv, q_weight if norm else cos,
        k_weight if norm else cos, cos, sin, dqkv, dw, *strides, dqkv.stride(0), dqkv.stride(1), heads, seq, hidden,
        eps, HEAD_DIM=head_dim, NORM=norm, **_launch_options())
    if not norm:
        return dqkv, qkv.new_empty(0), qkv.new_empty(0)
    return dqkv, dw[0].sum(0).to(q_weight.dtype), dw[1].sum(0).to(k_weight.dtype)


def _input_grads(q_weight, dqkv, dq_weight, dk_weight) -> tuple:
    """The gradients of (qkv, q_weight, k_weight, cos, sin, heads, eps): the weights' only with the norm."""
    if q_weight is None:
        return dqkv, None, None, None, None, None, None
    return dqkv, dq_weight, dk_weight, None, None, None, None


@torch.library.custom_op(f"{_LIB}::qkv_norm_rope", mutates_args=())
def _forward_op(qkv: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, cos: torch.Tensor,
                sin: torch.Tensor, heads: int, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _forward_impl(qkv, q_weight, k_weight, cos, sin, heads, eps)


@_forward_op.register_fake
def _forward_fake(qkv, q_weight, k_weight, cos, sin, heads, eps):
    batch, seq, width = qkv.shape
    return tuple(qkv.new_empty((batch, seq, heads, width // 3 // heads)) for _ in range(3))


@torch.library.custom_op(f"{_LIB}::qkv_norm_rope_backward", mutates_args=())
def _backward_op(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, qkv: torch.Tensor,
                 q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                 heads: int, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dqkv, dq_weight, dk_weight); the weights' gradients are empty without the norm."""
    return _backward_impl(dq, dk, dv, qkv, q_weight, k_weight, cos, sin, heads, eps)


@_backward_op.register_fake
def _backward_fake(dq, dk, dv, qkv, q_weight, k_weight, cos, sin, heads, eps):
    def like(w):
        return torch.empty_like(w) if w is not None else qkv.new_empty(0)
    return torch.empty_like(qkv, memory_format=torch.contiguous_format), like(q_weight), like(k_weight)


def _setup_context(ctx, inputs, output):
    qkv, q_weight, k_weight, cos, sin, heads, eps = inputs
    ctx.save_for_backward(qkv, q_weight, k_weight, cos, sin)
    ctx.heads, ctx.eps = heads, eps


def _backward(ctx, dq, dk, dv):
    qkv, q_weight, k_weight, cos, sin = ctx.saved_tensors
    return _input_grads(q_weight, *_backward_op(dq, dk, dv, qkv, q_weight, k_weight, cos, sin, ctx.heads, ctx.eps))


torch.library.register_autograd(f"{_LIB}::qkv_norm_rope", _backward, setup_context=_setup_context)


class _EagerQkv(torch.autograd.Function):
    """The eager path of qkv_norm_rope: the custom ops' implementations and autograd formula without their dispatch,
    which cost ~220 us of host time per fwd+bwd (docs/measurements/qkv-host-eager.py, this workspace's CPU: a median
    of 357-406 us this way against 578-648 through the op), 12 times a step at gpu-124m's depth. sagebwd's op takes
    the same path when not compiling (sagebwd/triton/ops.py)."""

    @staticmethod
    def forward(ctx, qkv, q_weight, k_weight, cos, sin, heads, eps):
        _setup_context(ctx, (qkv, q_weight, k_weight, cos, sin, heads, eps), None)
        return _forward_impl(qkv, q_weight, k_weight, cos, sin, heads, eps)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        qkv, q_weight, k_weight, cos, sin = ctx.saved_tensors
        return _input_grads(q_weight, *_backward_impl(dq, dk, dv, qkv, q_weight, k_weight, cos, sin, ctx.heads,
                                                      ctx.eps))


def runs_kernel(qkv: torch.Tensor) -> bool:
    """Whether the kernels can run on qkv: a CUDA tensor, or any under Triton's interpreter (elsewhere the model runs
    the plain formula)."""
    return qkv.is_cuda or interpreting()


def qkv_norm_rope(qkv: torch.Tensor, heads: int, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                  cos: torch.Tensor, sin: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as (batch, heads, seq, head_dim) views of dense (batch, seq, heads, head_dim) tensors.

    qkv: the projection's (batch, seq, 3 * hidden) output; q_weight, k_weight: the QK-norm's scales (both or
    neither); cos, sin: RoPE's (seq, head_dim / 2) tables at the tokens' positions (RotaryEmbedding.tables; fp32,
    or the model's dtype once the model is cast).
    """
    if (q_weight is None) != (k_weight is None):
        raise ValueError("QK-norm takes both q_weight and k_weight, or neither")
    if not runs_kernel(qkv):
        raise ValueError(f"qkv_norm_rope runs Triton kernels: qkv must be a CUDA tensor (or TRITON_INTERPRET=1), got "
                         f"one on {qkv.device}; model.qkv_impl=fused runs the plain formula there itself")
    # compiled: the registered op, opaque to torch.compile; eager: the same functions without the op's dispatch
    apply = _forward_op if torch.compiler.is_compiling() else _EagerQkv.apply
    q, k, v = apply(qkv, q_weight, k_weight, cos, sin, heads, eps)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def plain_qkv(qkv: torch.Tensor, heads: int, q_norm, k_norm, rope, positions: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The plain formula: q, k, v as (batch, heads, seq, head_dim) views split along the projection's last dim (so the
    backward joins the three gradients there in one copy; an unbind of a (batch, seq, 3, heads, head_dim) view
    stacks them and then copies the stack into the projection's layout: two copies, 0.3 ms per layer at
    (8, 16, 4096, 64), H200), then the norms (RMSNorm modules, or None) and RoPE (a RotaryEmbedding)."""
    batch, seq, width = qkv.shape
    q, k, v = (t.view(batch, seq, heads, width // 3 // heads).transpose(1, 2) for t in qkv.split(width // 3, dim=-1))
    if q_norm is not None:
        q, k = q_norm(q), k_norm(k)
    return rope(q, positions), rope(k, positions), v


def attention_inputs(impl: str, qkv: torch.Tensor, heads: int, q_norm, k_norm, rope,
                     positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as (batch, heads, seq, head_dim) from the projection's (batch, seq, 3 * hidden) output, by
    model.qkv_impl: the kernels for "fused" where they run (runs_kernel), else the plain formula."""
    if impl == "fused" and runs_kernel(qkv):
        norm = q_norm is not None
        return qkv_norm_rope(qkv, heads, q_norm.weight if norm else None, k_norm.weight if norm else None,
                             *rope.tables(qkv.shape[1], positions), q_norm.eps if norm else 0.0)
    return plain_qkv(qkv, heads, q_norm, k_norm, rope, positions)
