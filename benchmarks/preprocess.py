"""The backward's preprocess (quantize.backward_preprocess) by warps, on one GPU.

    python -m benchmarks.preprocess [--shapes B,H,N,D ...] [--quant token block] [--warps 2 4 8 16] [--json PATH]

The preprocess reads dO and O (bf16, the model's layout: (B, N, H, D) storage viewed as (B, H, N, D)) and writes
delta, the LSE in base 2 and the quantised dO^ in k order (INT8, or FP8 e4m3 with the token contract, which also
writes the shifted LSE). Each launch is captured in a
CUDA graph and replayed (the host does not count): milliseconds per call (the median of --repeats replays of
--iters calls) per contract, shape and num_warps (the Tuning override "backward_preprocess"; "default": the op's
choice, quantize._preprocess_warps), beside "one copy of as many bytes", a device copy that reads and writes as
many bytes in all as the launch must (preprocess_bytes): the memory's own rate at that size.
"""
from __future__ import annotations

import argparse
import sys

from benchmarks.attention import _shape
from benchmarks.forward_tiles import check_token_shapes, has_cuda, write_rows
from benchmarks.prepass import graph_ms

SHAPES = [(4, 12, 4096, 64), (8, 16, 4096, 64), (8, 8, 4096, 128)]
BLOCK_Q = 128   # the op's default q block, the preprocess's tile


def preprocess_bytes(shape) -> int:
    """Bytes the preprocess must move at least, in either contract: dO and O read (bf16), dO^ written (1 byte: INT8
    or FP8 e4m3); the per-row vectors (under 1%) left out."""
    b, h, n, d = shape
    return b * h * n * d * (2 + 2 + 1)


def preprocess_inputs(shape, device):
    """dO and O as (B, H, N, D) views of (B, N, H, D) bf16 storage (the model's layout), and the LSE (fp32,
    (B, H, N))."""
    import torch
    b, h, n, d = shape
    do, o = (torch.randn(b, n, h, d, device=device).to(torch.bfloat16).transpose(1, 2) for _ in range(2))
    return do, o, torch.randn(b, h, n, device=device)


def preprocess_rows(shape, quant: str, warps, iters: int, repeats: int) -> list[dict]:
    import torch

    from sagebwd.triton.launch import Tuning
    from sagebwd.triton.quantize import backward_preprocess
    do, o, lse = preprocess_inputs(shape, "cuda")
    moved = preprocess_bytes(shape)
    src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")   # a copy reads and writes as many
    dst = torch.empty_like(src)
    rows = [dict(shape=list(shape), quant=quant, variant="one copy of as many bytes",
                 ms=graph_ms(lambda: dst.copy_(src), iters, repeats))]
    for w in ["default", *warps]:
        tuning = None if w == "default" else Tuning(overrides={"backward_preprocess": {"num_warps": w}})
        rows.append(dict(shape=list(shape), quant=quant, variant=f"{w} warps" if w != "default" else "default",
                         ms=graph_ms(lambda: backward_preprocess(do, o, lse, BLOCK_Q, quant == "token", tuning=tuning),
                                     iters, repeats)))
    for row in rows:
        row["tb_per_s"] = moved / (row["ms"] * 1e-3) / 1e12
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", type=_shape, default=SHAPES, metavar="B,H,N,D")
    ap.add_argument("--quant", nargs="+", choices=["block", "token"], default=["token", "block"])
    ap.add_argument("--warps", nargs="+", type=int, default=[2, 4, 8, 16])
    ap.add_argument("--iters", type=int, default=20, help="calls per graph replay")
    ap.add_argument("--repeats", type=int, default=21, help="replays; the median is reported")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    check_token_shapes(ap, args.shapes, "the preprocess's tile")
    if any(w not in (1, 2, 4, 8, 16, 32) for w in args.warps):
        ap.error(f"--warps {' '.join(map(str, args.warps))}: each a power of two from 1 to 32")
    if args.iters < 1 or args.repeats < 1:
        ap.error("--iters and --repeats >= 1")
    if not has_cuda("benchmarks.preprocess"):
        return 2
    rows = []
    print("| (B,H,N,D) | contract | variant | ms | TB/s of the bytes it must move |")
    print("|---|---|---|---|---|")
    for shape in args.shapes:
        for quant in args.quant:
            for row in preprocess_rows(shape, quant, args.warps, args.iters, args.repeats):
                rows.append(row)
                print(f"| {tuple(shape)} | {quant} | {row['variant']} | {row['ms']:.4f} | {row['tb_per_s']:.2f} |",
                      flush=True)
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
