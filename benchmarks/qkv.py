"""Attention's q, k, v from the qkv projection (split, QK-norm, RoPE), by model.qkv_impl, on one GPU.

    python -m benchmarks.qkv [--shapes B,H,N,D ...] [--no-norm] [--launches 64x4 ...] [--iters 20] [--repeats 15]
                             [--json PATH]

Times what CausalSelfAttention runs between the qkv projection and the core attention (model/qkv.py): "plain
eager" and "plain compiled" (torch.compile, default mode, of the plain formula alone: the kernels Inductor
makes of it inside the trainer's compiled model) against "fused" (model/qkv.py's kernels), the forward alone
and forward + backward (the projection's and the norm weights' gradients). bf16, the model's layout (q, k, v
views of one (B, N, 3 * H * D) projection output). Each is captured in a CUDA graph and replayed, so the host does
not count: milliseconds per call (the median of --repeats replays of --iters calls) and the bytes that the pass
must move per second (pass_bytes: the fused forward also copies v, which the plain formula leaves a view).
--launches times "fused" once per TOKENSxWARPS launch (model.qkv.Launch: tokens of one head per program, warps per
program; the default is model.qkv.LAUNCH's).
"""
from __future__ import annotations

import argparse
import sys

from benchmarks.attention import _shape
from benchmarks.forward_tiles import has_cuda, write_rows
from benchmarks.prepass import graph_ms

SHAPES = [(4, 12, 4096, 64), (8, 16, 4096, 64), (8, 8, 4096, 128)]


def pass_bytes(shape, norm: bool, backward: bool, fused: bool) -> int:
    """Bytes the pass must move, in units of one of q, k, v (B*N*H*D bf16). Forward: q and k read and written, and
    for fused v copied too (plain leaves v a view of the projection). Backward: dq, dk, dv read, with the norm q and
    k read again, and the projection's gradient written (plain's dv goes there by a copy of Inductor's cat)."""
    b, h, n, d = shape
    unit = b * h * n * d * 2
    forward = 6 if fused else 4
    return unit * (forward + (6 + (2 if norm else 0) if backward else 0))


def _launch(text: str):
    from model.qkv import Launch
    try:
        tokens, warps = (int(x) for x in text.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: TOKENSxWARPS, e.g. 64x4") from None
    if tokens < 1 or tokens & (tokens - 1) or warps not in (1, 2, 4, 8, 16):
        raise argparse.ArgumentTypeError(f"{text!r}: tokens a power of two, warps 1, 2, 4, 8 or 16")
    return Launch(tokens, warps)


def qkv_rows(shape, norm: bool, iters: int, repeats: int, launches=None) -> list[dict]:
    import torch
    from model import qkv as mq
    from model.layers import RMSNorm, RotaryEmbedding
    from model.qkv import qkv_norm_rope

    b, h, n, d = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(b, n, 3 * h * d, device="cuda", generator=gen).bfloat16().requires_grad_(True)
    rope = RotaryEmbedding(d, n, 10000.0).cuda()
    norms = [RMSNorm(d, 1e-6).cuda().bfloat16() for _ in range(2)] if norm else None
    weights = [m.weight for m in norms] if norm else []
    grads = [torch.randn(b, h, n, d, device="cuda", generator=gen).bfloat16() for _ in range(3)]

    def plain(x):
        return mq.plain_qkv(x, h, *(norms if norm else (None, None)), rope)

    def fused(x):
        return qkv_norm_rope(x, h, *(weights if norm else (None, None)), *rope.tables(n), 1e-6)

    variants = [("plain eager", plain, None), ("plain compiled", torch.compile(plain), None)]
    for launch in launches or [mq.LAUNCH]:
        variants.append((f"fused {launch.block_tokens}x{launch.num_warps}" if launches else "fused", fused, launch))
    rows = []
    default = mq.LAUNCH
    for name, fn, launch in variants:
        mq.LAUNCH = launch or default
        def forward(fn=fn):
            with torch.no_grad():
                fn(qkv)

        def forward_backward(fn=fn):
            torch.autograd.grad(fn(qkv), [qkv] + weights, grads)

        for label, call, backward in (("fwd", forward, False), ("fwd+bwd", forward_backward, True)):
            ms = graph_ms(call, iters, repeats)
            rows.append({"shape": list(shape), "norm": norm, "variant": name, "pass": label, "ms": ms,
                         "tb_per_s": pass_bytes(shape, norm, backward, launch is not None) / ms / 1e9})
    mq.LAUNCH = default
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", type=_shape, default=SHAPES, metavar="B,H,N,D")
    ap.add_argument("--no-norm", action="store_true", help="RoPE alone (model.qk_norm=false)")
    ap.add_argument("--launches", nargs="+", type=_launch, metavar="TOKENSxWARPS",
                    help="time the fused kernels with each of these launches (default: model.qkv.LAUNCH)")
    ap.add_argument("--iters", type=int, default=20, help="calls per graph replay")
    ap.add_argument("--repeats", type=int, default=15, help="replays; the median is reported")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    if args.iters < 1 or args.repeats < 1:
        ap.error("--iters and --repeats must be >= 1")
    if not has_cuda("benchmarks.qkv"):
        return 2
    rows = []
    print("| (B,H,N,D) | norm | variant | pass | ms | TB/s of the bytes it must move | plain compiled / this |")
    print("|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        shape_rows = qkv_rows(shape, not args.no_norm, args.iters, args.repeats, args.launches)
        compiled = {r["pass"]: r["ms"] for r in shape_rows if r["variant"] == "plain compiled"}
        for row in shape_rows:
            rows.append(row)
            print(f"| {tuple(shape)} | {row['norm']} | {row['variant']} | {row['pass']} | {row['ms']:.4f} | "
                  f"{row['tb_per_s']:.2f} | {compiled[row['pass']] / row['ms']:.2f}x |", flush=True)
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
