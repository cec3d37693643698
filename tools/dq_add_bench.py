"""What a fused backward would pay to add its dQ partials: a GPU benchmark, no kernel of the op.

    python -m tools.dq_add_bench [--kv-rows 64 128] [--shapes B,H,N,D ...]

A backward that computed dQ inside the dK/dV program (no separate dQ kernel) would add every
tile's fp32 dQ partial into a global fp32 buffer: with 64-row kv programs (the op's), each (kv
tile j, q block i) adds a [128, D] tile into rows i of dQ, 1.1 G fp32 adds (4.4 GB) at
(8,16,4096,64) causal; with 128-row programs (`--kv-rows 128`, what a fused token backward at d=128
could hold) half as many. This times exactly those adds with no other work, three ways: plain
stores (the write traffic alone, no add), per-element atomics (`tl.atomic_add`, relaxed), and
TMA reductions (a tensor descriptor's `atomic_add`: `cp.reduce.async.bulk.tensor`). Measured on
the H200 (docs/kernel-notes.md, "What is left"): 0.95 / 1.2 / 1.2 ms, more than the whole dQ
kernel they would replace (1.14 ms), so the fusion is not pursued at this tile size.
"""
from __future__ import annotations

import argparse

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


def measure(b: int, h: int, n: int, d: int, causal: bool = True, kv_rows: int = 64) -> dict:
    from triton.tools.tensor_descriptor import TensorDescriptor
    dq = torch.zeros(b * h * n, d, device="cuda", dtype=torch.float32)
    desc = TensorDescriptor.from_tensor(dq, [128, d])
    tiles = sum(n // 128 - ((j * kv_rows) // 128 if causal else 0) for j in range(n // kv_rows))
    adds = tiles * b * h * 128 * d
    row = {"shape": [b, h, n, d], "causal": causal, "kv_rows": kv_rows, "adds": adds}
    for mode, name in ((0, "store"), (1, "atomic"), (2, "tma")):
        row[name] = triton.testing.do_bench(
            lambda: _adds[(n // kv_rows, b * h)](dq, desc, n, D=d, MODE=mode, CAUSAL=causal, KV_ROWS=kv_rows,
                                                  num_warps=4),
            return_mode="median")
    return row


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
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("dq_add_bench needs a CUDA GPU")
        return 2
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
