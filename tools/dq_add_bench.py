"""What a fused backward would pay to add its dQ partials: a GPU benchmark, no kernel of the op.

    python -m tools.dq_add_bench [--kv-rows 64 128] [--shapes B,H,N,D ...] [--beside-dkdv] [--dq-beside-dkdv]

A backward that computed dQ inside the dK/dV program (no separate dQ kernel) would add every
tile's fp32 dQ partial into a global fp32 buffer: with 64-row kv programs (the op's), each (kv
tile j, q block i) adds a [128, D] tile into rows i of dQ, 1.1 G fp32 adds (4.4 GB) at
(8,16,4096,64) causal; with 128-row programs (`--kv-rows 128`, what a fused token backward at d=128
could hold) half as many. This times exactly those adds with no other work, three ways: plain
stores (the write traffic alone, no add), per-element atomics (`tl.atomic_add`, relaxed), and
TMA reductions (a tensor descriptor's `atomic_add`: `cp.reduce.async.bulk.tensor`). Measured on
the H200 (docs/kernel-notes.md, "What is left"): 0.95 / 1.2 / 1.2 ms, more than the whole dQ
kernel they would replace (1.14 ms), so the fusion is not pursued at this tile size.

`--beside-dkdv` asks whether that traffic can hide behind a backward kernel's arithmetic: the adds launched on a
second stream beside the token contract's dK/dV kernel, against each alone. On an H100 5-20% of the adds' time
hid (docs/kernel-notes.md). The dK/dV program takes its SM's register file (setmaxnreg), so the two kernels'
programs rarely share an SM: this bounds what a separate kernel overlaps, not what a warpgroup of a fused
kernel could.

`--dq-beside-dkdv` asks the same of the two kernels a token backward runs today, which need nothing from each other
(the token contract writes no tile scales): the dQ and the dK/dV kernel one after the other, and on two streams in
either launch order.
"""
from __future__ import annotations

import argparse
import functools

import torch
import triton
import triton.language as tl

SHAPES = ((8, 16, 4096, 64), (8, 8, 4096, 128))


@triton.jit
def _adds(DQ, desc, N, D: tl.constexpr, MODE: tl.constexpr, CAUSAL: tl.constexpr, KV_ROWS: tl.constexpr = 64):
    j = tl.program_id(0)   # a kv tile of KV_ROWS rows
    bh = tl.program_id(1)
    rows = tl.arange(0, 128)
    cols = tl.arange(0, D)
    first = (j * KV_ROWS) // 128 if CAUSAL else 0   # the q block that holds the diagonal
    base = (bh * N).to(tl.int64)
    for i in range(first, N // 128):
        val = (rows[:, None] + cols[None, :] + i + j).to(tl.float32) * 1e-3   # not hoistable
        if MODE == 0:
            tl.store(DQ + (base + i * 128 + rows[:, None]) * D + cols[None, :], val)
        elif MODE == 1:
            tl.atomic_add(DQ + (base + i * 128 + rows[:, None]) * D + cols[None, :], val, sem="relaxed")
        else:
            desc.atomic_add([(bh * N + i * 128).to(tl.int32), 0], val)


def adds_launcher(b: int, h: int, n: int, d: int, causal: bool, kv_rows: int):
    """mode -> a function that launches the adds of one backward in that mode (0 stores, 1 atomics, 2 TMA
    reductions) into a zeroed fp32 dQ buffer of (b, h, n, d)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    dq = torch.zeros(b * h * n, d, device="cuda", dtype=torch.float32)
    desc = TensorDescriptor.from_tensor(dq, [128, d])
    return lambda mode: lambda: _adds[(n // kv_rows, b * h)](dq, desc, n, D=d, MODE=mode, CAUSAL=causal,
                                                             KV_ROWS=kv_rows, num_warps=4)


def measure(b: int, h: int, n: int, d: int, causal: bool = True, kv_rows: int = 64) -> dict:
    tiles = sum(n // 128 - ((j * kv_rows) // 128 if causal else 0) for j in range(n // kv_rows))
    row = {"shape": [b, h, n, d], "causal": causal, "kv_rows": kv_rows, "adds": tiles * b * h * 128 * d}
    adds = adds_launcher(b, h, n, d, causal, kv_rows)
    for mode, name in ((0, "store"), (1, "atomic"), (2, "tma")):
        row[name] = triton.testing.do_bench(adds(mode), return_mode="median")
    return row


def token_backward_call(b: int, h: int, n: int, d: int, causal: bool = True, device: str = "cuda"):
    """The token contract's backward operands (a backward.BackwardCall) for random inputs of (b, h, n, d), all
    prepared once: forward, quantisation, preprocess."""
    from sagebwd.triton import backward as kb, ops, quantize as kq
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v, do = (torch.randn(b, h, n, d, device=device, generator=gen, dtype=torch.bfloat16) for _ in range(4))
    o, lse, q8, q8t, s_q, k8, k8t, s_k, _, k_mean = ops._forward_impl(q, k, v, causal, True, False, 128, 64, True, True,
                                                                      "default", None)
    pre = kq.backward_preprocess(do, o, lse, 128, token=True)
    grads = [torch.empty_like(q) for _ in range(3)]
    return kb.BackwardCall(do, pre.delta, pre.do8t, pre.s_do, q8, q8t, s_q, k8, k8t, s_k, v, pre.lse2, *grads, s_q,
                           causal, True, None, k, k_mean, 128, 64, True, q, pre.lse2_p)


def token_dkdv(b: int, h: int, n: int, d: int, causal: bool = True, device: str = "cuda"):
    """(a function that launches the token contract's default dK/dV (the registry's for `device`) on
    token_backward_call's operands; the dK and dV it writes)."""
    from sagebwd.triton import registry
    from sagebwd.triton.launch import arch_for
    call = token_backward_call(b, h, n, d, causal, device)
    kernel = registry.resolve(arch_for(call.q8.device, None), d, "dkdv", "token", causal=causal, block_q=128,
                              block_kv=64, smooth_q=False, seq=n)
    run = registry.load(kernel)
    return (lambda: run(call, None)), (call.dk, call.dv)


def beside(first, second):
    """first() and second() launched together on two streams (the GPU may run their programs side by side)."""
    main = torch.cuda.current_stream()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]

    def both():
        for stream, fn in zip(streams, (first, second)):
            stream.wait_stream(main)
            with torch.cuda.stream(stream):
                fn()
        for stream in streams:
            main.wait_stream(stream)
    return both


def measure_beside_dkdv(b: int, h: int, n: int, d: int, kv_rows: int) -> dict:
    """The causal token dK/dV alone, the TMA-reduce adds of kv_rows-row programs alone, and both at once:
    whether the adds' traffic hides behind a backward kernel's arithmetic (what a fused backward needs)."""
    adds = adds_launcher(b, h, n, d, True, kv_rows)(2)
    dkdv, _ = token_dkdv(b, h, n, d)
    bench = functools.partial(triton.testing.do_bench, return_mode="median")
    return {"dkdv": bench(dkdv), "adds": bench(adds), "both": bench(beside(dkdv, adds))}


def measure_dq_beside_dkdv(b: int, h: int, n: int, d: int, causal: bool) -> dict:
    """The token contract's dQ and dK/dV kernels (the registry's) alone, one after the other, and launched together on
    two streams, the dQ kernel first or the dK/dV kernel first."""
    from sagebwd.triton import registry
    from sagebwd.triton.launch import arch_for
    c = token_backward_call(b, h, n, d, causal)
    dq, dkdv = (registry.load(registry.resolve(arch_for(c.q8.device, None), d, p, "token", causal=causal, block_q=128,
                                               block_kv=64, smooth_q=False, seq=n)) for p in ("dq", "dkdv"))

    def run_dq():
        dq(c, None)

    def run_dkdv():
        dkdv(c, None)
    bench = functools.partial(triton.testing.do_bench, return_mode="median")
    return {"dq": bench(run_dq), "dkdv": bench(run_dkdv), "serial": bench(lambda: (run_dq(), run_dkdv())),
            "dq_first": bench(beside(run_dq, run_dkdv)), "dkdv_first": bench(beside(run_dkdv, run_dq))}


def _shape(text: str) -> tuple:
    try:
        b, h, n, d = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a shape as B,H,N,D, e.g. 8,8,4096,128") from None
    if n % 128 or d not in (64, 128):
        raise argparse.ArgumentTypeError(f"{text!r}: N must be a multiple of 128 and D 64 or 128")
    return b, h, n, d


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.dq_add_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--kv-rows", type=int, nargs="+", choices=(64, 128), default=[64],
                        help="kv rows per program, i.e. per dQ partial (default 64, the op's)")
    parser.add_argument("--shapes", type=_shape, nargs="+", default=list(SHAPES), metavar="B,H,N,D")
    parser.add_argument("--beside-dkdv", action="store_true",
                        help="also time the TMA-reduce adds (causal) launched beside the token dK/dV kernel")
    parser.add_argument("--dq-beside-dkdv", action="store_true",
                        help="only time the token dQ and dK/dV kernels one after the other and on two streams")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("dq_add_bench needs a CUDA GPU")
        return 2
    if args.dq_beside_dkdv:
        print("| (B,H,N,D) | mask | dQ ms | dK/dV ms | one after the other | two streams, dQ first | dK/dV first | "
              "gained |")
        print("|---|---|---|---|---|---|---|---|")
        for shape in args.shapes:
            for causal in (True, False):
                r = measure_dq_beside_dkdv(*shape, causal)
                gained = 1 - min(r["dq_first"], r["dkdv_first"]) / r["serial"]
                print(f"| {tuple(shape)} | {'causal' if causal else 'full'} | {r['dq']:.3f} | {r['dkdv']:.3f} | "
                      f"{r['serial']:.3f} | {r['dq_first']:.3f} | {r['dkdv_first']:.3f} | {gained:.1%} |", flush=True)
        return 0
    if args.beside_dkdv:
        print("| (B,H,N,D) causal | kv rows | token dK/dV ms | TMA-reduce adds ms | both at once ms | hidden |")
        print("|---|---|---|---|---|---|")
        for shape in args.shapes:
            for kv_rows in args.kv_rows:
                r = measure_beside_dkdv(*shape, kv_rows)
                hidden = (r["dkdv"] + r["adds"] - r["both"]) / r["adds"]
                print(f"| {tuple(shape)} | {kv_rows} | {r['dkdv']:.3f} | {r['adds']:.3f} | {r['both']:.3f} | "
                      f"{hidden:.0%} |", flush=True)
        print()
    print("| (B,H,N,D) | mask | kv rows | fp32 adds | store ms | atomic ms | TMA reduce ms | TB/s (TMA) |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        for causal in (True, False):
            for kv_rows in args.kv_rows:
                r = measure(*shape, causal=causal, kv_rows=kv_rows)
                print(f"| {tuple(shape)} | {'causal' if causal else 'full'} | {kv_rows} | {r['adds'] / 1e9:.2f} G | "
                      f"{r['store']:.3f} | {r['atomic']:.3f} | {r['tma']:.3f} | {r['adds'] * 4 / r['tma'] / 1e9:.1f} |",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
