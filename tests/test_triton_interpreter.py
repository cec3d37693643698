"""The Triton kernels against the simulation, in Triton's CPU interpreter (CI has no GPU).

TRITON_INTERPRET=1 must be set before Triton is first imported, and other test modules may
import it first in this process, so the kernels run in one subprocess (this file, run as a
script) that prints one JSON line per case; the tests below read those lines.

Tolerance: the kernels do the simulation's arithmetic in another order (exp2 with log2(e)
folded into the scale, tensor-core summation order), so they differ from it only by the
output dtype's rounding and rare rounding flips of an INT8 value; both are far below the
INT8 error itself, which every case also checks (kernel-vs-simulation must be a small
fraction of simulation-vs-full-precision, so a kernel that skipped quantisation would fail).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# (name, dtype, seq, head_dim, block_q, block_kv, causal, smooth_q, strided inputs[, quant contract])
CASES = [
    ("fp16-plain", "float16", 256, 64, 128, 64, False, False, False),
    ("fp16-causal", "float16", 256, 64, 128, 64, True, False, False),
    ("fp16-smoothq", "float16", 256, 64, 128, 64, False, True, False),
    ("fp16-causal-smoothq-strided", "float16", 256, 64, 128, 64, True, True, True),
    ("fp16-causal-blocks64", "float16", 256, 64, 64, 64, True, False, False),
    ("fp16-blocks128-smoothq", "float16", 256, 64, 128, 128, False, True, False),
    ("fp16-causal-q64-kv128", "float16", 256, 64, 64, 128, True, True, False),
    ("fp16-causal-d128", "float16", 256, 128, 128, 64, True, False, False),
    ("bf16-causal", "bfloat16", 256, 64, 128, 64, True, False, False),
    ("fp16-causal-seq192-blocks64", "float16", 192, 64, 64, 64, True, False, False),
    # "-rows128": 128-row forward programs over 64-key tiles, so diagonal tiles hold fully masked rows
    ("fp16-causal-rows128", "float16", 256, 64, 128, 64, True, False, False),
    ("fp16-causal-smoothq-q64", "float16", 256, 64, 64, 64, True, True, False),
    ("bf16-d128-full", "bfloat16", 256, 128, 128, 64, False, False, False),
    # "-separate": dV and dK as two launches (PASS = DV_ONLY, then DK_ONLY; d=128's default),
    # here at d=64; "-chain": 64-row q slices chained in int32 within a q block;
    # "-onelaunch": d=128 as one launch with dK/dV in column halves
    ("fp16-causal-separate", "float16", 256, 64, 128, 64, True, False, False),
    ("fp16-causal-smoothq-chain", "float16", 256, 64, 128, 64, True, True, False),
    ("fp16-causal-smoothq-d128-onelaunch", "float16", 256, 128, 128, 64, True, True, False),
    # the "token" contract: per-token Q, K scales; P, dS scales per row of each tile
    ("fp16-causal-token", "float16", 256, 64, 128, 64, True, False, False, "token"),
    ("fp16-smoothq-strided-token", "float16", 256, 64, 128, 64, False, True, True, "token"),
    ("bf16-causal-d128-token", "bfloat16", 256, 128, 128, 64, True, False, False, "token"),
    ("fp16-causal-smoothq-q64-kv128-token", "float16", 256, 64, 64, 128, True, True, False, "token"),
    # 64-row blocks: the token forward's 128-key tiles span two of the backward's kv tiles
    ("fp16-causal-blocks64-token", "float16", 256, 64, 64, 64, True, False, False, "token"),
    ("fp16-full-d128-token", "float16", 256, 128, 128, 64, False, False, False, "token"),
    # "-growing": keys grow along the sequence (x 1 + n / 4), so each kv tile's row maxima pass the
    # forward's running reference by more than its lazy-rescaling threshold (d=128, token: 2^8) and
    # the rescale runs after the first tile too
    ("fp16-causal-d128-growing-token", "float16", 256, 128, 128, 64, True, False, False, "token"),
    # "-smallgrad": dO ~ 1e-5 (fp16 training without loss scaling): dO s_Q in fp16 (the contract until the twentieth
    # session) underflowed there; dS in bf16 does not
    ("fp16-causal-smallgrad-token", "float16", 256, 64, 128, 64, True, False, False, "token"),
]
# Relative L2, kernel vs simulation (same dtype). The interpreter rounds fp32 -> bf16 less
# carefully than the GPU does, so bf16 gets a looser bound here (the GPU check uses 5e-3).
TOLERANCE = {"float16": 5e-3, "bfloat16": 2.5e-2}
# Kernel-vs-simulation must stay under this fraction of simulation-vs-FPA (the INT8 error). In bf16 the outputs' own
# rounding is ~0.004 rel-L2 at these sizes (O and dV show it), ~40% of the token contract's dK error since dK became a
# 16-bit product (~0.01), so bf16 takes half.
FRACTION_OF_INT8_ERROR = {"float16": 0.35, "bfloat16": 0.5}


def _rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def _run_case(name, dtype_name, n, d, block_q, block_kv, causal, smooth_q, strided, quant="block") -> dict:
    import torch
    import sagebwd
    from sagebwd import simulate
    from sagebwd.simulate import SageConfig
    from sagebwd.triton import attention

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    b, h = 1, 2
    if strided:   # (seq, batch, heads, dim) storage, as DeepSpeed's DistributedAttention hands it over
        raw = [torch.randn(n, b, h, d, generator=gen).to(dtype) for _ in range(3)]
        q, k, v = [x.permute(1, 2, 0, 3).requires_grad_() for x in raw]
    else:
        q, k, v = [torch.randn(b, h, n, d, generator=gen).to(dtype).requires_grad_() for _ in range(3)]
    do = torch.randn(b, h, n, d, generator=gen).to(dtype)
    if "-smallgrad" in name:
        do = (do.float() * 1e-5).to(dtype)
    if "-growing" in name:
        k = (k.detach() * (1 + torch.arange(n) / 4).to(dtype)[:, None]).requires_grad_()

    from sagebwd.triton.launch import Tuning
    tuning = Tuning()   # the block shapes a case asks for, passed to its calls
    if name.endswith("-rows128"):
        tuning.overrides["forward_rows"] = 128
    if name.endswith("-separate"):
        tuning.overrides["dkdv_blocks"] = {"separate": True}
    if name.endswith("-chain"):
        tuning.overrides["dkdv_blocks"] = {"cols": 64}
    if name.endswith("-onelaunch"):
        tuning.overrides["dkdv_blocks"] = {"separate": False, "split_d": 2}
    start = time.time()
    o = attention(q, k, v, causal, True, smooth_q, block_q, block_kv, quant, tuning=tuning)
    grads = torch.autograd.grad(o, (q, k, v), do)
    seconds = time.time() - start
    with torch.no_grad():   # the inference path (no transposed copies) must give the same O
        o_inference = attention(q, k, v, causal, True, smooth_q, block_q, block_kv, quant, tuning=tuning)

    # The backward is defined given the O the forward returned: feed the simulation's backward
    # the kernel's O, so that 1-ulp differences of O do not move delta and flip dS integers.
    cfg = SageConfig(causal=causal, smooth_q=smooth_q, block_q=block_q, block_kv=block_kv, quant=quant)
    with torch.no_grad():
        o_sim, saved = simulate.forward(q, k, v, cfg)
        grads_sim = simulate.backward(saved._replace(o=o.detach()), do, cfg)
    fpa = sagebwd.fpa_attention(q.detach().double(), k.detach().double(), v.detach().double(),
                                do.double(), causal=causal)

    result = {"name": name, "seconds": seconds, "inference_equal": bool(torch.equal(o, o_inference)),
              "finite": all(bool(torch.isfinite(t).all()) for t in (o, *grads)),
              "dtypes_ok": all(t.dtype == dtype for t in (o, *grads)),
              # O and the gradients dense in q's memory order (FlashAttention's convention)
              "layout_ok": all(t.stride() == q.stride() for t in (o, *grads))}
    for key, out, sim, ref in zip(("o", "dq", "dk", "dv"), (o, *grads), (o_sim, *grads_sim),
                                  (fpa.o, fpa.dq, fpa.dk, fpa.dv)):
        result[key] = {"vs_sim": _rel(out, sim), "sim_vs_fpa": _rel(sim, ref)}
    return result


def _compile_case() -> dict:
    """fullgraph torch.compile over the op (aot_eager: tracing and the autograd formula, no codegen)."""
    import torch
    from sagebwd.triton import attention

    def layer(q, k, v):
        return attention(q * 1.0, k, v, True, True, False, 128, 64).sum()

    q, k, v = [torch.randn(1, 1, 128, 64).half().requires_grad_() for _ in range(3)]
    eager = torch.autograd.grad(layer(q, k, v), (q, k, v))
    compiled = torch.autograd.grad(torch.compile(layer, backend="aot_eager", fullgraph=True)(q, k, v), (q, k, v))
    return {"name": "compile", "equal": all(bool(torch.equal(a, b)) for a, b in zip(eager, compiled))}


def _opcheck_case() -> dict:
    import torch
    from sagebwd.triton import ops  # noqa: F401  (registers the ops)

    q, k, v = [torch.randn(1, 1, 128, 64).half().requires_grad_() for _ in range(3)]
    do = torch.randn(1, 1, 128, 64).half()
    # both contracts: their outputs differ in shape (the token contract's s_Q and s_K per token, no K^T); the
    # backward op on what each forward returned
    for smooth_q, token in ((True, False), (False, True)):
        flags = (True, True, smooth_q, 128, 64, token)
        torch.library.opcheck(torch.ops.sagebwd_triton.forward.default, (q, k, v, *flags, True),
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
        with torch.no_grad():
            o, lse, q8, q8t, s_q, k8, k8t, s_k, mu_q, k_mean = ops._forward_impl(q, k, v, *flags, True)
        torch.library.opcheck(torch.ops.sagebwd_triton.backward.default,
                              (do, o, lse, q8, q8t, s_q, k8, k8t, s_k, v.detach(), q.detach(), k.detach(), mu_q,
                               k_mean, *flags),
                              test_utils=("test_schema", "test_faketensor"))
    return {"name": "opcheck", "ok": True}


def _k_order_case() -> dict:
    """The transposed INT8 copies (quantiser: Q^T, K^T, V^T; backward preprocess: dO^T) hold the
    row copy's values with the sequence in k order (the kernels' B operands)."""
    import torch
    from sagebwd.quant import quantize_row_blocks_e4m3
    from sagebwd.triton import quantize as kq
    from sagebwd.triton._common import from_k_order, k_order_index

    gen = torch.Generator().manual_seed(11)
    x, do, o = [torch.randn(1, 2, 256, 64, generator=gen).half() for _ in range(3)]
    rows, cols, _, _ = kq.quantize_blocks(x, 64, cols=True)
    do_rows, _, do_scale, _ = kq.quantize_blocks(do, 128)
    lse = torch.randn(1, 2, 256, generator=gen) * 4 + 6
    block = kq.backward_preprocess(do, o, lse, 128)
    delta, do_cols, do_cols_scale = block.delta, block.do8t, block.s_do
    token = kq.backward_preprocess(do, o, lse, 128, token=True)
    delta_t, lse2_t, do_cols_t, do_scale_t = token.delta, token.lse2, token.do8t, token.s_do
    do_e4m3, do_e4m3_scale = quantize_row_blocks_e4m3(do.float(), 128)
    return {"name": "k_order",
            "delta": bool(torch.equal(delta_t, delta)) and bool(torch.equal(lse2_t, block.lse2)),
            "lse2_p": block.lse2_p is None and bool(torch.equal(token.lse2_p, lse2_t - 8.0)),
            "do_e4m3": do_cols_t.dtype == torch.float8_e4m3fn
            and bool(torch.equal(from_k_order(do_cols_t.float()), do_e4m3.transpose(-1, -2)))
            and bool(torch.equal(do_scale_t, do_e4m3_scale)),
            "index_head": k_order_index(16).tolist(),
            "cols_differ": bool(torch.equal(cols, rows.transpose(-1, -2))),
            "cols": bool(torch.equal(from_k_order(cols), rows.transpose(-1, -2))),
            "do_cols": bool(torch.equal(from_k_order(do_cols), do_rows.transpose(-1, -2)))
            and bool(torch.equal(do_scale, do_cols_scale))}


def _fused_quantize_case() -> dict:
    """The forward's one-launch quantisation (quantize_qkv) writes what three quantize_blocks calls
    write, bit for bit: K-smoothing, Q-smoothing, strided inputs, block_q != block_kv."""
    import torch
    from sagebwd.triton import quantize as kq

    gen = torch.Generator().manual_seed(5)
    q, k, v = [torch.randn(1, 256, 2, 64, generator=gen).half().transpose(1, 2) for _ in range(3)]
    k_mean = kq.sequence_mean(k)
    fused = kq.quantize_qkv(q, k, v, 128, 64, k_mean=k_mean, smooth_q=True, cols=True)
    q8, q8t, s_q, mu_q = kq.quantize_blocks(q, 128, smooth_block=True, cols=True)
    k8, k8t, s_k, _ = kq.quantize_blocks(k, 64, mean=k_mean, cols=True)
    _, v8t, s_v, _ = kq.quantize_blocks(v, 64, rows=False, cols=True)
    no_cols = kq.quantize_qkv(q, k, v, 64, 128, k_mean=None, smooth_q=False, cols=False)
    plain_q = kq.quantize_blocks(q, 64)
    plain_k = kq.quantize_blocks(k, 128)
    return {"name": "fused_quantize",
            "equal": all(bool(torch.equal(a, b)) for a, b in
                         zip(fused, (q8, q8t, s_q, mu_q, k8, k8t, s_k, v8t, s_v))),
            "no_cols": no_cols[1] is None and no_cols[5] is None and bool(torch.equal(no_cols[0], plain_q[0]))
            and bool(torch.equal(no_cols[2], plain_q[2])) and bool(torch.equal(no_cols[4], plain_k[0]))
            and bool(torch.equal(no_cols[6], plain_k[2]))}


def _token_quantize_case() -> dict:
    """The "token" quantiser gives the simulation's integers and scales bit for bit (Q after
    Q-smoothing, K after K-smoothing, per token; V per block), in one launch or three."""
    import torch
    from sagebwd.simulate import SageConfig, quantize_qk, smooth
    from sagebwd.triton import quantize as kq

    gen = torch.Generator().manual_seed(7)
    q, k, v = [(torch.randn(1, 256, 2, 64, generator=gen) * 3).half().transpose(1, 2) for _ in range(3)]
    k_mean = kq.sequence_mean(k)
    one = kq.quantize_qkv(q, k, v, 128, 64, k_mean=k_mean, smooth_q=True, cols=True, token=True)
    three = kq.quantize_qkv(q, k, v, 64, 128, k_mean=k_mean, smooth_q=True, cols=True, token=True)
    cfg = SageConfig(smooth_q=True, block_q=128, quant="token")
    q_sm, k_sm, _ = smooth(q.float(), k.float(), cfg)
    q_hat, s_q, k_hat, s_k = quantize_qk(q_sm, k_sm, cfg)
    q8, _, kq_s_q, _, k8, _, kq_s_k, _, _ = one
    return {"name": "token_quantize",
            "equal_sim": bool(torch.equal(q8.float(), q_hat)) and bool(torch.equal(kq_s_q, s_q))
            and bool(torch.equal(k8.float(), k_hat)) and bool(torch.equal(kq_s_k, s_k)),
            "k_equal_across_tiles": bool(torch.equal(one[4], three[4])) and bool(torch.equal(one[6], three[6])),
            "no_cols": all(t[i] is None for t in (one, three) for i in (1, 5))}


def _token_q_in_forward_case() -> dict:
    """The token contract without Q-smoothing quantises Q in the forward kernel (ops._forward_impl): its Q^ and
    scales equal the quantise pass's (quantize_blocks) and the simulation's bit for bit, for a strided Q, d=64 and
    128, for training and for inference (no transposed copy either way); the quantise launch then takes K and V
    only."""
    import torch
    from sagebwd.simulate import SageConfig, quantize_qk, smooth
    from sagebwd.triton import ops
    from sagebwd.triton import quantize as kq
    from sagebwd.triton.launch import Tuning

    gen = torch.Generator().manual_seed(11)
    equal, skips = True, []
    for d, causal in ((64, True), (128, False)):
        q, k, v = [(torch.randn(1, 256, 2, d, generator=gen) * 3).half().transpose(1, 2) for _ in range(3)]
        for for_backward in (True, False):
            q8, q8t, s_q = ops._forward_impl(q, k, v, causal, True, False, 128, 64, True, for_backward)[2:5]
            rows, _, scale, _ = kq.quantize_blocks(q, 128, token=True)
            q_hat, sim_scale, _, _ = quantize_qk(*smooth(q.float(), k.float(), SageConfig(quant="token"))[:2],
                                                 SageConfig(quant="token"))
            equal = (equal and bool(torch.equal(q8, rows)) and bool(torch.equal(s_q, scale))
                     and bool(torch.equal(q8.float(), q_hat)) and bool(torch.equal(s_q, sim_scale))
                     and q8t.numel() == 0)
        recorded = Tuning(recorded=[])
        ops._forward_impl(q, k, v, causal, True, False, 128, 64, True, True, "default", recorded)
        skips += [kw.get("SKIP_Q") for name, _, _, kw in recorded.recorded if name == "quantize"]
    return {"name": "token_q_in_forward", "equal": equal, "quantise_skips_q": skips == [True, True]}


def _sequence_mean_case() -> dict:
    """The K-smoothing mean's kernel (quantize._sequence_mean, the GPU's; the CPU path is PyTorch's): against
    the fp64 mean, for a strided K, a sequence that ends inside a program's rows, and one long enough that a
    program sums several 128-row steps; and the same bits when run again."""
    import torch
    from sagebwd.triton import quantize as kq

    gen = torch.Generator().manual_seed(5)
    errors, repeats = [], True
    for shape, strided in [((1, 2, 256, 64), False), ((2, 3, 384, 128), True), ((1, 1, 200, 64), False),
                           ((1, 1, 128 * kq.MAX_MEAN_CHUNKS * 2 + 64, 64), False)]:   # the last: 3 steps of 128 rows
        k = (torch.randn(*shape, generator=gen) * 3 + torch.randn(shape[-1], generator=gen) * 5).bfloat16()
        if strided:   # the model's layout: (B, N, H, D) in memory
            k = k.transpose(1, 2).contiguous().transpose(1, 2)
        mean = kq._sequence_mean(k)
        exact = k.double().mean(dim=2).reshape(mean.shape)
        errors.append(((mean.double() - exact).abs() / exact.abs().clamp_min(1e-3)).max().item())
        repeats = repeats and bool(torch.equal(mean, kq._sequence_mean(k)))
    return {"name": "sequence_mean", "max_rel_error": max(errors), "repeats": repeats}


def _dq_add_bench_case() -> dict:
    """tools.dq_add_bench's token dK/dV (what it times beside the adds) is the op's: its dK and dV equal the
    backward's, bit for bit."""
    import torch
    from sagebwd.triton import ops
    from tools import dq_add_bench

    launch, (dk, dv) = dq_add_bench.token_dkdv(1, 2, 256, 64, device="cpu")
    launch()
    gen = torch.Generator(device="cpu").manual_seed(0)   # token_dkdv's inputs, drawn again
    q, k, v, do = (torch.randn(1, 2, 256, 64, generator=gen, dtype=torch.bfloat16) for _ in range(4))
    saved = ops._forward_impl(q, k, v, True, True, False, 128, 64, True, True, "default", None)
    o, lse, q8, q8t, s_q, k8, k8t, s_k, mu_q, k_mean = saved
    _, dk_op, dv_op = ops._backward_impl(do, o, lse, q8, q8t, s_q, k8, k8t, s_k, v, q, k, mu_q, k_mean, True,
                                         True, False, 128, 64, True)
    return {"name": "dq_add_bench", "equal": bool(torch.equal(dk, dk_op)) and bool(torch.equal(dv, dv_op))}


def _e4m3_case() -> dict:
    """_common.to_e4m3 against torch's float8_e4m3fn on the values that decide a rounding: ties (to
    even), the carry into the next power of two that Triton's own interpreter conversion drops,
    subnormals (steps of 2^-9) and their ties, the largest value, signs and zero; and on 4096 random
    values over e4m3's range."""
    global to_e4m3   # the jitted kernel below looks its callees up in this module's globals
    import torch
    import triton
    import triton.language as tl
    from sagebwd.triton._common import to_e4m3

    @triton.jit
    def round_kernel(X, Y, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(Y + offs, to_e4m3(tl.load(X + offs)).to(tl.float32))

    special = [1.9375, 1.8125, 1.96875, 1.999, 0.99, 15.5, 15.75, 240.0, 232.0, 447.9, 448.0, 440.0,
               2.0 ** -6, 2.0 ** -7 * 1.5, 2.0 ** -10, 2.0 ** -10 * 3, 2.0 ** -11, 2.0 ** -9 * 0.49, 0.0, 3.0, 1.0]
    gen = torch.Generator().manual_seed(3)
    rand = torch.exp2(torch.rand(4096 - 2 * len(special), generator=gen) * 18 - 10) * 1.75
    signs = torch.sign(torch.randn(rand.shape, generator=gen))
    x = torch.cat([torch.tensor(special), -torch.tensor(special), rand * signs])
    x = x.float()
    y = torch.empty_like(x)
    round_kernel[(1,)](x, y, x.numel())
    ref = x.to(torch.float8_e4m3fn).float()
    return {"name": "e4m3", "mismatches": int((y != ref).sum()), "of": x.numel()}


def _token_fallback_case() -> dict:
    """backward() of the token contract computes LSE2 - log2(256) itself when the caller does not pass the
    preprocess's: the same gradients, bit for bit."""
    import torch
    from sagebwd.triton import backward as kb
    from sagebwd.triton import ops
    from sagebwd.triton import quantize as kq

    gen = torch.Generator().manual_seed(21)
    q, k, v, do = [torch.randn(1, 2, 128, 64, generator=gen).half() for _ in range(4)]
    o, lse, q8, q8t, s_q, k8, k8t, s_k, _, k_mean = ops._forward_impl(q, k, v, True, True, False, 128, 64, True,
                                                                      True, "default", None)
    pre = kq.backward_preprocess(do, o, lse, 128, token=True)
    common = dict(causal=True, smooth_k=True, q=q, k=k, k_mean=k_mean, block_q=128, block_kv=64, quant="token")
    given = kb.backward(do, pre.delta, pre.do8t, pre.s_do, q8, q8t, s_q, k8, k8t, s_k, v, pre.lse2,
                        lse2_p=pre.lse2_p, **common)
    computed = kb.backward(do, pre.delta, pre.do8t, pre.s_do, q8, q8t, s_q, k8, k8t, s_k, v, pre.lse2, **common)
    return {"name": "token_fallback", "equal": all(bool(torch.equal(a, b)) for a, b in zip(given, computed))}


def _mean_in_quantise_launch_case() -> dict:
    """K's mean taken inside the quantise launch (quantize._quantize_qkv_with_mean, the GPU's path): the mean
    has the mean kernel's bits (one reduction, _mean_chunk) and Q^, K^, V^ and their scales are quantize_qkv's
    with that mean, bit for bit: both contracts, d=64 and 128, strided inputs, Q-smoothing, Q left to the token
    forward, block_q != block_kv, a sequence that is several mean chunks, and K tiles right after their head's
    mean (lag 0), rounds later, or after every head's mean (a lag past the head count). On the GPU's path the op takes the one launch at d=64 and the mean kernel and
    quantise launch at d=128 (quantize.MEAN_IN_LAUNCH_HEAD_DIMS)."""
    import torch
    from sagebwd.triton import ops
    from sagebwd.triton import quantize as kq
    from sagebwd.triton.launch import Tuning

    gen = torch.Generator().manual_seed(23)
    equal, mean_equal = True, True
    for shape, token, smooth_q, quantize_q, blocks in [((1, 256, 2, 64), True, False, False, (128, 64)),
                                                       ((2, 384, 3, 128), True, False, False, (128, 64)),
                                                       ((1, 256, 2, 64), False, True, True, (128, 64)),
                                                       ((1, 256, 2, 64), True, True, True, (128, 64)),
                                                       ((1, 512, 1, 64), False, False, True, (64, 128))]:
        q, k, v = [(torch.randn(*shape, generator=gen) * 3 + torch.randn(shape[-1], generator=gen) * 5).half()
                   .transpose(1, 2) for _ in range(3)]   # (B, H, N, D) views of (B, N, H, D), a channel offset
        for lag in (0, 2, 8):
            out = kq._quantize_qkv_with_mean(q, k, v, *blocks, smooth_q=smooth_q, cols=True, token=token,
                                             quantize_q=quantize_q, lag=lag)
            mean_equal = mean_equal and bool(torch.equal(out[9], kq._sequence_mean(k)))
            ref = kq.quantize_qkv(q, k, v, *blocks, k_mean=out[9], smooth_q=smooth_q, cols=True, token=token,
                                  quantize_q=quantize_q)
            written = range(9) if quantize_q else (3, 4, 5, 6, 7, 8)   # without Q: its buffers are left unwritten
            equal = equal and all((out[i] is None and ref[i] is None) or bool(torch.equal(out[i], ref[i]))
                                  for i in written)
    quantise_kernels = {}
    for d in (64, 128):
        recorded = Tuning(recorded=[])
        q, k, v = [torch.randn(1, 2, 256, d, generator=gen).half() for _ in range(3)]
        ops._forward_impl(q, k, v, True, True, False, 128, 64, True, True, "default", recorded)
        assert "sequence_mean" not in [name for name, *_ in recorded.recorded]   # a tool's recording: never run
        quantise_kernels[d] = [kernel.fn.__name__ for name, kernel, *_ in recorded.recorded if name == "quantize"]
    return {"name": "mean_in_quantise_launch", "equal": equal, "mean_equal": mean_equal,
            "one_launch": quantise_kernels[64] == ["_quantize_qkv_mean_kernel"],
            "two_launches_at_128": quantise_kernels[128] == ["_quantize_qkv_kernel"]}


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run through the tests (they set TRITON_INTERPRET=1)"
    for case in CASES:
        print(json.dumps(_run_case(*case)), flush=True)
    print(json.dumps(_k_order_case()), flush=True)
    print(json.dumps(_fused_quantize_case()), flush=True)
    print(json.dumps(_token_quantize_case()), flush=True)
    print(json.dumps(_token_q_in_forward_case()), flush=True)
    print(json.dumps(_e4m3_case()), flush=True)
    print(json.dumps(_sequence_mean_case()), flush=True)
    print(json.dumps(_mean_in_quantise_launch_case()), flush=True)
    print(json.dumps(_dq_add_bench_case()), flush=True)
    print(json.dumps(_token_fallback_case()), flush=True)
    print(json.dumps(_compile_case()), flush=True)
    print(json.dumps(_opcheck_case()), flush=True)


@pytest.fixture(scope="module")
def results() -> dict:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run([sys.executable, __file__], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"interpreter run failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["name"]: r for r in lines}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_kernels_match_simulation(results, case):
    r = results[case[0]]
    assert r["finite"] and r["dtypes_ok"], r
    assert r["layout_ok"], "O or a gradient is not in q's memory order"
    assert r["inference_equal"], "forward without grad (no transposed copies) changed O"
    for key in ("o", "dq", "dk", "dv"):
        err, int8_err = r[key]["vs_sim"], r[key]["sim_vs_fpa"]
        assert err <= TOLERANCE[case[1]], f"{key}: kernel vs simulation {err:.2e}"
        assert err <= FRACTION_OF_INT8_ERROR[case[1]] * int8_err, \
            f"{key}: kernel vs simulation {err:.2e} is not small against the INT8 error {int8_err:.2e}"


def test_one_launch_quantisation_matches_three(results):
    assert results["fused_quantize"]["equal"], "quantize_qkv differs from quantize_blocks"
    assert results["fused_quantize"]["no_cols"], "quantize_qkv without cols differs from quantize_blocks"


def test_token_quantiser_matches_simulation(results):
    r = results["token_quantize"]
    assert r["equal_sim"], "the token quantiser's integers or scales differ from the simulation's"
    assert r["k_equal_across_tiles"], "per-token K depends on the launch's tile size"


def test_token_quantiser_writes_no_transposed_copies(results):
    """The token backward's dQ and dK are bf16 products with K and Q themselves (simulate.token_dq, token_dk), and
    nothing else reads Q^T or K^T: the quantise launch writes neither in the token contract (2 N x D bytes a head
    fewer)."""
    assert results["token_quantize"]["no_cols"]


def test_token_forward_quantises_q_as_the_quantise_pass_would(results):
    r = results["token_q_in_forward"]
    assert r["equal"], "the token forward's Q^ or its scales differ from the quantise pass's or the simulation's"
    assert r["quantise_skips_q"], "the quantise pass still quantised Q where the token forward does"


def test_compiles_fullgraph(results):
    assert results["compile"]["equal"]


def test_opcheck(results):
    assert results["opcheck"]["ok"]


def test_transposed_copies_are_in_k_order(results):
    r = results["k_order"]
    # stored position 4t + 2h + p holds sequence index 8h + 2t + p
    assert r["index_head"] == [8 * h + 2 * t + p for t in range(4) for h in range(2) for p in range(2)]
    assert r["cols"] and r["do_cols"], r
    assert not r["cols_differ"], "the copy is a plain transpose: not k-ordered"


def test_token_preprocess_writes_the_block_contracts_delta(results):
    """The token backward forms dS from dO and delta as given (no s_Q after S): its preprocess writes the block
    contract's delta and LSE2, bit for bit."""
    assert results["k_order"]["delta"]


def test_token_preprocess_writes_lse_minus_log2_256(results):
    """The token dK/dV reads LSE2 - log2(256), so that its exp2 yields 256 P (dV's e4m3 operand) with no
    multiply: the preprocess writes it beside LSE2 (the fp32 difference), and nothing in the block contract."""
    assert results["k_order"]["lse2_p"]


def test_token_kernels_keep_dk_accuracy_in_fp16_with_small_gradients(results):
    """dO ~ 1e-5 in fp16: dS goes to bf16 (fp32's exponent range) for dK's product, so dK stays as near FPA as with
    dO ~ 1 (~0.02) and the kernels stay with the simulation."""
    r = results["fp16-causal-smallgrad-token"]["dk"]
    assert r["sim_vs_fpa"] < 0.035 and r["vs_sim"] < FRACTION_OF_INT8_ERROR["float16"] * r["sim_vs_fpa"], r


def test_token_backward_computes_its_operands_when_not_given(results):
    assert results["token_fallback"]["equal"], "backward() without lse2_p gave other gradients"


def test_sequence_mean_kernel_is_the_mean(results):
    """The GPU's K mean (programs over rows of a head, the head's last one adds the partial sums in order) is the
    fp32 mean to a few ulps and gives the same bits on every run (the sum's order does not depend on which
    program finishes last)."""
    r = results["sequence_mean"]
    assert r["max_rel_error"] < 1e-6, r
    assert r["repeats"], "two runs of the mean kernel gave different bits"


def test_k_mean_in_the_quantise_launch_is_the_mean_kernels(results):
    """On the GPU's path K's mean is taken inside the quantise launch (its programs take tickets, and K's tiles
    wait for their head's mean): the same mean and the same Q^, K^, V^ as the mean kernel and quantize_qkv."""
    r = results["mean_in_quantise_launch"]
    assert r["mean_equal"], "the mean taken in the quantise launch differs from the mean kernel's"
    assert r["equal"], "Q^, K^ or V^ from the one launch differ from quantize_qkv's with the same mean"
    assert r["one_launch"], "the op still launches a separate mean kernel on the GPU's path at d=64"
    assert r["two_launches_at_128"], "at d=128 (where the one launch measured slower) the op took the one launch"


def test_dq_add_bench_times_the_ops_token_dkdv(results):
    assert results["dq_add_bench"]["equal"], "tools.dq_add_bench's dK/dV differs from the op's backward"


def test_e4m3_rounding_is_round_to_nearest_even(results):
    """The token contract's FP8 rounding in the kernels (_common.to_e4m3) is torch's float8_e4m3fn,
    in the interpreter too, where Triton's own conversion drops the carry past a power of two."""
    r = results["e4m3"]
    assert r["mismatches"] == 0, f"{r['mismatches']} of {r['of']} values rounded unlike float8_e4m3fn"


def test_token_preprocess_writes_do_in_e4m3(results):
    """The token contract's dO^ (dV's operand) is FP8 e4m3 with the simulation's values and block
    scales bit for bit, in k order: the kernel's rounding (to_e4m3, which works around the
    interpreter's carry-less fp8 conversion) is e4m3's round-to-nearest-even."""
    assert results["k_order"]["do_e4m3"]


if __name__ == "__main__":
    main()
