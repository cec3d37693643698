"""What a fused backward would pay to add its dQ partials: a GPU benchmark, no kernel of the op.

    python -m tools.dq_add_bench

A backward that computed dQ inside the dK/dV program (no separate dQ kernel) would add every
tile's fp32 dQ partial into a global fp32 buffer: with the op's 64-row kv programs, each (kv
tile j, q block i) adds a [128, D] tile into rows i of dQ, 1.1 G fp32 adds (4.4 GB) at
(8,16,4096,64) causal. This times exactly those adds with no other work, three ways: plain
stores (the write traffic alone, no add), per-element atomics (`tl.atomic_add`, relaxed), and
TMA reductions (a tensor descriptor's `atomic_add`: `cp.reduce.async.bulk.tensor`). Measured on
the H200 (docs/kernel-notes.md, "What is left"): 0.95 / 1.2 / 1.2 ms, more than the whole dQ
kernel they would replace (1.14 ms), so the fusion is not pursued at this tile size.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

SHAPES = ((8, 16, 4096, 64), (8, 8, 4096, 128))


@triton.jit
def _adds(DQ, desc, N, D: tl.constexpr, MODE: tl.constexpr, CAUSAL: tl.constexpr):
    j = tl.program_id(0)   # a 64-row kv tile
    bh = tl.program_id(1)
    rows = tl.arange(0, 128)
    cols = tl.arange(0, D)
    first = (j * 64) // 128 if CAUSAL else 0   # the q block that holds the diagonal
    base = (bh * N).to(tl.int64)
    for i in range(first, N // 128):
        val = (rows[:, None] + cols[None, :] + i + j).to(tl.float32) * 1e-3   # not hoistable
        if MODE == 0:
            tl.store(DQ + (base + i * 128 + rows[:, None]) * D + cols[None, :], val)
        elif MODE == 1:
            tl.atomic_add(DQ + (base + i * 128 + rows[:, None]) * D + cols[None, :], val, sem="relaxed")
        else:
            desc.atomic_add([(bh * N + i * 128).to(tl.int32), 0], val)


def measure(b: int, h: int, n: int, d: int, causal: bool = True) -> dict:
    from triton.tools.tensor_descriptor import TensorDescriptor
    dq = torch.zeros(b * h * n, d, device="cuda", dtype=torch.float32)
    desc = TensorDescriptor.from_tensor(dq, [128, d])
    tiles = sum(n // 128 - ((j * 64) // 128 if causal else 0) for j in range(n // 64))
    adds = tiles * b * h * 128 * d
    row = {"shape": [b, h, n, d], "causal": causal, "adds": adds}
    for mode, name in ((0, "store"), (1, "atomic"), (2, "tma")):
        row[name] = triton.testing.do_bench(
            lambda: _adds[(n // 64, b * h)](dq, desc, n, D=d, MODE=mode, CAUSAL=causal, num_warps=4),
            return_mode="median")
    return row


def main() -> int:
    if not torch.cuda.is_available():
        print("dq_add_bench needs a CUDA GPU")
        return 2
    print("| (B,H,N,D) | mask | fp32 adds | store ms | atomic ms | TMA reduce ms | TB/s (TMA) |")
    print("|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        for causal in (True, False):
            r = measure(*shape, causal=causal)
            print(f"| {tuple(shape)} | {'causal' if causal else 'full'} | {r['adds'] / 1e9:.2f} G | {r['store']:.3f} | "
                  f"{r['atomic']:.3f} | {r['tma']:.3f} | {r['adds'] * 4 / r['tma'] / 1e9:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
