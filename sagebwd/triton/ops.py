"""The SageBwd kernels as torch.library custom ops with an autograd formula.

``attention(q, k, v, causal, smooth_k, smooth_q, block_q, block_kv, quant) -> o`` is differentiable
and traceable by torch.compile (the ops have fake implementations, so a compiled model keeps
them as opaque nodes instead of breaking the graph). Run eagerly it calls the same
implementations through a plain torch.autograd.Function: the custom ops' dispatch and autograd
wrapping cost ~0.3-0.5 ms of host time per forward+backward, a third of the op's (H200 host).

Saved for the backward (as FlashAttention saves Q, K, V, O, LSE; nothing of size N x N):
Q^ and K^ (int8; in the block contract in both layouts), their scales, V, O and the LSE; in the token
contract also Q and K themselves (dK's and dQ's 16-bit operands); with Q-smoothing the block means of Q,
K and K's sequence mean (for the bias terms).
"""
from __future__ import annotations

import torch

from . import backward as _bwd
from . import forward as _fwd
from . import quantize as _quant
from ._common import empty_in_layout_of
from .launch import Tuning, forward_pdl

_LIB = "sagebwd_triton"
_MAX_BLOCK = 256   # larger tiles would not fit in registers


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_q: int, block_kv: int) -> None:
    # Cheap checks; sagebwd.api validates fully (with messages for users) before dispatching here.
    _quant.check_qkv(q, k, v)
    assert q.shape[-1] in (64, 128), f"head_dim must be 64 or 128, got {q.shape[-1]}"
    for name, blk in (("block_q", block_q), ("block_kv", block_kv)):
        assert 16 <= blk <= _MAX_BLOCK and blk & (blk - 1) == 0, f"{name}={blk}: a power of two in [16, 256]"
    assert q.shape[2] % block_q == 0 and q.shape[2] % block_kv == 0, \
        f"seq {q.shape[2]} must be a multiple of block_q={block_q} and block_kv={block_kv}"


def _empty(device) -> torch.Tensor:
    return torch.empty(0, device=device, dtype=torch.float32)


def _quant_name(token: bool) -> str:
    """The registry's name of the contract (the ops carry it as a flag)."""
    return "token" if token else "block"


def _forward_impl(q, k, v, causal, smooth_k, smooth_q, block_q, block_kv, token, for_backward, kernels="default",
                  tuning: Tuning | None = None):
    """(o, lse, q8, q8t, s_q, k8, k8t, s_k, mu_q, k_mean); the last six only matter for the backward.
    token: the "token" contract (s_q, s_k per token); kernels: the registry's choice
    (sagebwd.triton.registry); tuning: a tool's hooks (launch.Tuning)."""
    _check(q, k, v, block_q, block_kv)
    # The token contract without Q-smoothing: the forward kernel quantises Q (per token: nothing beyond each
    # row), so the quantise pass moves K and V only (docs/kernel-notes.md, "Twelfth session").
    q_in_forward = token and not smooth_q
    pdl = forward_pdl(q.device, q_in_forward, tuning)   # the forward a programmatic dependent of the quantise launch
    options = dict(smooth_q=smooth_q, cols=for_backward, token=token, quantize_q=not q_in_forward, pdl=pdl,
                   tuning=tuning)
    if smooth_k:   # K's mean is taken in the quantise launch on a GPU (quantize_smoothed_qkv)
        q8, q8t, s_q, mu_q, k8, k8t, s_k, v8t, s_v, k_mean = _quant.quantize_smoothed_qkv(q, k, v, block_q, block_kv,
                                                                                         **options)
    else:
        k_mean = None
        q8, q8t, s_q, mu_q, k8, k8t, s_k, v8t, s_v = _quant.quantize_qkv(q, k, v, block_q, block_kv, k_mean=None,
                                                                         **options)
    o, lse = _fwd.forward(q8, k8, v8t, s_q, s_k, s_v, out_dtype=q.dtype, causal=causal, smooth_k=smooth_k,
                          mu_q=mu_q, k=k, k_mean=k_mean, block_q=block_q, block_kv=block_kv, layout_of=q,
                          kernels=kernels, quant=_quant_name(token), q=q if q_in_forward else None, pdl=pdl,
                          tuning=tuning)
    def unused(dtype=torch.float32):   # a fresh empty tensor each: op outputs must not alias
        return torch.empty(0, device=q.device, dtype=dtype)
    return (o, lse, q8, q8t if (for_backward and q8t is not None) else unused(torch.int8), s_q, k8,
            k8t if (for_backward and k8t is not None) else unused(torch.int8), s_k,   # token: no Q^T, K^T
            mu_q if smooth_q else unused(), k_mean if smooth_k else unused())


@torch.library.custom_op(f"{_LIB}::forward", mutates_args=())
def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, smooth_k: bool,
                smooth_q: bool, block_q: int, block_kv: int, token: bool, for_backward: bool,
                kernels: str = "default") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                           torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (o, lse, q8, q8t, s_q, k8, k8t, s_k, mu_q, k_mean); the last six only matter for the backward."""
    return _forward_impl(q, k, v, causal, smooth_k, smooth_q, block_q, block_kv, token, for_backward, kernels)


@_forward_op.register_fake
def _forward_fake(q, k, v, causal, smooth_k, smooth_q, block_q, block_kv, token, for_backward, kernels="default"):
    b, h, n, d = q.shape
    i8, f32 = torch.int8, torch.float32
    def transposed():   # an INT8 copy in k order, or the empty placeholder
        return _quant.empty_cols(q) if _quant.writes_cols(for_backward, token) else q.new_empty((0,), dtype=i8)
    return (empty_in_layout_of(q, q.dtype), q.new_empty((b, h, n), dtype=f32),
            q.new_empty((b, h, n, d), dtype=i8), transposed(),
            q.new_empty((b, h, n if token else n // block_q), dtype=f32),
            q.new_empty((b, h, n, d), dtype=i8), transposed(),
            q.new_empty((b, h, n if token else n // block_kv), dtype=f32),
            q.new_empty((b, h, n // block_q, d), dtype=f32) if smooth_q else q.new_empty((0,), dtype=f32),
            q.new_empty((b * h, d), dtype=f32) if smooth_k else q.new_empty((0,), dtype=f32))


def _backward_impl(do, o, lse, q8, q8t, s_q, k8, k8t, s_k, v, q, k, mu_q, k_mean, causal, smooth_k, smooth_q,
                   block_q, block_kv, token, kernels="default", tuning: Tuning | None = None):
    assert (q.numel() if token else q8t.numel()) == q8.numel(), "the forward ran without for_backward=True"
    pre = _quant.backward_preprocess(do, o, lse, block_q, token, tuning=tuning)
    return _bwd.backward(do, pre.delta, pre.do8t, pre.s_do, q8, q8t, s_q, k8, k8t, s_k, v, pre.lse2,
                         lse2_p=pre.lse2_p, q=q if token else None, causal=causal, smooth_k=smooth_k,
                         mu_q=mu_q if smooth_q else None, k=k, k_mean=k_mean if smooth_k else None, block_q=block_q,
                         block_kv=block_kv, layout_of=o,
                         kernels=kernels, quant=_quant_name(token), tuning=tuning)


@torch.library.custom_op(f"{_LIB}::backward", mutates_args=())
def _backward_op(do: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, q8: torch.Tensor, q8t: torch.Tensor,
                 s_q: torch.Tensor, k8: torch.Tensor, k8t: torch.Tensor, s_k: torch.Tensor, v: torch.Tensor,
                 q: torch.Tensor, k: torch.Tensor, mu_q: torch.Tensor, k_mean: torch.Tensor, causal: bool,
                 smooth_k: bool, smooth_q: bool, block_q: int, block_kv: int, token: bool, kernels: str = "default"
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_impl(do, o, lse, q8, q8t, s_q, k8, k8t, s_k, v, q, k, mu_q, k_mean, causal, smooth_k,
                          smooth_q, block_q, block_kv, token, kernels)


@_backward_op.register_fake
def _backward_fake(do, o, lse, q8, q8t, s_q, k8, k8t, s_k, v, q, k, mu_q, k_mean, causal, smooth_k,
                   smooth_q, block_q, block_kv, token, kernels="default"):
    return tuple(empty_in_layout_of(o, v.dtype) for _ in range(3))   # in O's (= q's) memory order


def _save(ctx, q, k, v, flags, kernels, output):
    """What the backward keeps (the same for both autograd paths below)."""
    o, lse, q8, q8t, s_q, k8, k8t, s_k, mu_q, k_mean = output
    # K itself is needed for the Q-smoothing bias and the token contract's dQ (a bf16 product with K), Q itself for
    # the token contract's dK; otherwise keep nothing of them.
    token = flags[5]
    ctx.save_for_backward(o, lse, q8, q8t, s_q, k8, k8t, s_k, v, q if token else _empty(q.device),
                          k if (flags[2] or token) else _empty(k.device), mu_q, k_mean)
    ctx.flags = flags
    ctx.kernels = kernels


def _setup_context(ctx, inputs, output):
    q, k, v, causal, smooth_k, smooth_q, block_q, block_kv, token, _, kernels = inputs
    _save(ctx, q, k, v, (causal, smooth_k, smooth_q, block_q, block_kv, token), kernels, output)
    lse, s_q, s_k, mu_q, k_mean = (output[i] for i in (1, 4, 7, 8, 9))
    ctx.mark_non_differentiable(lse, s_q, s_k, mu_q, k_mean)
    # Only O has a gradient. Materialised, the other nine outputs' would be zero tensors, four of
    # them INT8 the size of Q/K: a fill of 134 MB, 43 us per backward at (8,8,4096,128) on an H200.
    ctx.set_materialize_grads(False)


def _backward(ctx, do, *unused):
    if do is None:   # O took no part in what is differentiated
        return (None,) * 11
    o, lse, q8, q8t, s_q, k8, k8t, s_k, v, q, k, mu_q, k_mean = ctx.saved_tensors
    dq, dk, dv = _backward_op(do, o, lse, q8, q8t, s_q, k8, k8t, s_k, v, q, k, mu_q, k_mean, *ctx.flags,
                              ctx.kernels)
    return dq, dk, dv, None, None, None, None, None, None, None, None


torch.library.register_autograd(f"{_LIB}::forward", _backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """The eager path of attention(): the custom ops' implementations and autograd formula
    (bit-identical results; tests/test_triton_interpreter.py compares it with the compiled op)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, smooth_k, smooth_q, block_q, block_kv, token, kernels, tuning):
        output = _forward_impl(q, k, v, causal, smooth_k, smooth_q, block_q, block_kv, token, True, kernels, tuning)
        _save(ctx, q, k, v, (causal, smooth_k, smooth_q, block_q, block_kv, token), kernels, output)
        ctx.tuning = tuning
        return output[0]

    @staticmethod
    def backward(ctx, do):
        dq, dk, dv = _backward_impl(do, *ctx.saved_tensors, *ctx.flags, ctx.kernels, ctx.tuning)
        return dq, dk, dv, None, None, None, None, None, None, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, smooth_k: bool = True,
              smooth_q: bool = False, block_q: int = 128, block_kv: int = 64, quant: str = "block", *,
              kernels: str = "default", tuning: Tuning | None = None) -> torch.Tensor:
    """SageBwd attention on CUDA (or Triton's interpreter): O (B,H,N,D) in the input dtype.

    q, k, v: (batch, heads, seq, head_dim), fp16 or bf16, any strides (a permuted view of a
    (seq, batch, heads, dim) tensor works without a copy). O and the gradients are dense in q's
    memory order, as FlashAttention returns them (_common.empty_in_layout_of): for q a view of a
    (batch, seq, heads, dim) tensor, O.transpose(1, 2) is a contiguous (batch, seq, heads, dim).
    quant: "block" (the paper's contract) or "token" (per-token scales; docs/sagebwd.md).
    kernels: which kernels run (sagebwd.triton.registry: "default", "triton", ...). tuning: the
    benchmark's, offline compiler's and tests' hooks (launch.Tuning), for eager calls only.
    """
    assert quant in ("block", "token"), f"quant={quant!r}: 'block' or 'token'"
    token = quant == "token"
    for_backward = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if torch.compiler.is_compiling():   # the registered op: an opaque node with its autograd formula
        if tuning is not None:
            raise ValueError("tuning hooks apply to eager calls, not under torch.compile")
        return _forward_op(q, k, v, causal, smooth_k, smooth_q, block_q, block_kv, token, for_backward, kernels)[0]
    # Eager: the same functions through a plain autograd.Function, without the custom ops'
    # dispatch (~0.3-0.5 ms of host time per fwd+bwd on the H200's host; docs/benchmarks.md).
    if for_backward:
        return _EagerAttention.apply(q, k, v, causal, smooth_k, smooth_q, block_q, block_kv, token, kernels, tuning)
    return _forward_impl(q, k, v, causal, smooth_k, smooth_q, block_q, block_kv, token, False, kernels, tuning)[0]
