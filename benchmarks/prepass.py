"""The forward's pre-pass with K-smoothing, by launch design, on one GPU: K's mean and the quantise pass.

    python -m benchmarks.prepass [--shapes B,H,N,D ...] [--lags 0 1 2 4] [--layouts model contiguous] [--forward]
                                 [--json PATH]

Times what the op runs before its forward kernel, in the model's layout (q, k, v views of one (B, N, 3, H, D)
projection, the trainer's) or contiguous (B, H, N, D) tensors: "two launches" is the mean kernel
(quantize.sequence_mean) and then the quantise launch given that mean (quantize.quantize_qkv); "K's mean given" that
quantise launch alone, as it would run if the caller handed the mean over (model/qkv.py's forward could take it
where it writes K: docs/kernel-notes.md, "Twenty-eighth session"); "lag L" is the
one launch that takes the mean itself (quantize._quantize_qkv_with_mean, K's tiles L rounds of work after their
head's mean; the op's default at d=64 is quantize.MEAN_LAG), the counters' zeroing included in both; "one copy of
as many bytes" is a device copy that reads and writes as many bytes in all as the pass must (prepass_bytes), the
memory's own rate at that size (PyTorch's dtype conversions of the same views, the first reference, ran at half
the pass's rate: no reference); with --forward, "pre-pass + forward" is the op's whole forward (causal, for
training: ops._forward_impl) with the forward kernel launched plainly ("PDL off") or as a programmatic dependent of
the quantise launch ("PDL on": its Q prologue may run while the quantise launch's last programs do; the token
contract's default on Hopper, launch.forward_pdl), by the Tuning override "pdl". Each is
captured in a CUDA graph and replayed, so the host does not count; per shape, layout and contract (token: Q left to
the forward, as the op runs it; block: Q, K and V), milliseconds per call (the median of --repeats replays of
--iters calls) and the bytes the pre-pass must move per second (for the forward rows: over the pre-pass's bytes).
"""
from __future__ import annotations

import argparse
import sys

from benchmarks.attention import _shape
from benchmarks.forward_tiles import check_token_shapes, has_cuda, write_rows

SHAPES = [(4, 12, 4096, 64), (8, 16, 4096, 64), (8, 8, 4096, 128)]


def graph_ms(fn, iters: int, repeats: int) -> float:
    """Median milliseconds per call of fn, `iters` calls captured in one CUDA graph, replayed `repeats` times."""
    import torch
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):   # warm up (compiles) outside the capture
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return sorted(times)[len(times) // 2]


def prepass_rows(shape, layout: str, quant: str, lags, iters: int, repeats: int, with_forward: bool = False
                 ) -> list[dict]:
    import torch

    from sagebwd.triton import quantize
    q, k, v = prepass_inputs(shape, layout, "cuda")
    token = quant == "token"
    options = dict(smooth_q=False, cols=True, token=token, quantize_q=not token)

    def two_launches():
        quantize.quantize_qkv(q, k, v, 128, 64, k_mean=quantize.sequence_mean(k), **options)

    moved = prepass_bytes(shape, quant)
    src = torch.empty(moved // 2, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)

    def copies():   # a device copy reading and writing as many bytes in all: what the memory alone costs
        dst.copy_(src)
    k_mean = quantize.sequence_mean(k)

    def mean_given():   # the quantise launch alone, as it would run if the caller handed K's mean over
        quantize.quantize_qkv(q, k, v, 128, 64, k_mean=k_mean, **options)
    variants = [("one copy of as many bytes", copies), ("two launches", two_launches),
                ("K's mean given: the quantise launch alone", mean_given)]
    for lag in lags:
        variants.append((f"lag {lag}", lambda lag=lag: quantize._quantize_qkv_with_mean(q, k, v, 128, 64, lag=lag,
                                                                                         **options)))
    if with_forward:   # the op's forward as a whole (pre-pass + forward kernel), the forward a PDL dependent or not
        from sagebwd.triton import ops
        from sagebwd.triton.launch import Tuning
        for name, tuning in (("pre-pass + forward, PDL off", Tuning(overrides={"pdl": False})),
                             ("pre-pass + forward, PDL on", Tuning(overrides={"pdl": True}))):
            variants.append((name, lambda tuning=tuning: ops._forward_impl(q, k, v, True, True, False, 128, 64, token,
                                                                           True, "default", tuning)))
    rows = []
    for name, fn in variants:
        ms = graph_ms(fn, iters, repeats)
        rows.append({"shape": list(shape), "layout": layout, "quant": quant, "variant": name, "ms": ms,
                     "bytes": moved, "tb_per_s": moved / (ms * 1e-3) / 1e12})
    return rows


def prepass_inputs(shape, layout: str, device):
    """q, k, v in bf16 with a per-channel offset (K-smoothing's case): views of one (B, N, 3, H, D) projection
    ("model", the trainer's) or contiguous (B, H, N, D) tensors. (Built in fp32 and converted: a bf16 tensor plus an
    fp32 offset is fp32, which the thirteenth session's runs timed by mistake.)"""
    import torch
    b, h, n, d = shape
    if layout == "model":
        qkv = (torch.randn(b, n, 3, h, d, device=device) + torch.randn(d, device=device)).to(torch.bfloat16)
        return tuple(qkv[:, :, i].transpose(1, 2) for i in range(3))
    return tuple((torch.randn(b, h, n, d, device=device) + torch.randn(d, device=device)).to(torch.bfloat16)
                 for _ in range(3))


def prepass_bytes(shape, quant: str) -> int:
    """Bytes the pre-pass must move at least: K read twice (its mean, then its quantisation), V once, Q once in
    the block contract (the token forward reads Q itself), and their int8 copies written (K^, V^T; in the block
    contract also K^T, Q^ and Q^T); the scales and the mean's partial sums (under 1%) left out."""
    b, h, n, d = shape
    elements = b * h * n * d
    reads = 2 * (3 if quant == "token" else 4)   # bf16: K twice, V, (Q)
    writes = 2 if quant == "token" else 5       # int8: K^, V^T, (K^T, Q^, Q^T)
    return elements * (reads + writes)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", type=_shape, default=SHAPES, metavar="B,H,N,D")
    ap.add_argument("--quant", nargs="+", choices=["block", "token"], default=["token", "block"])
    ap.add_argument("--lags", nargs="+", type=int, default=[0, 1, 2, 4])
    ap.add_argument("--layouts", nargs="+", choices=["model", "contiguous"], default=["model"])
    ap.add_argument("--forward", action="store_true",
                    help="also the op's forward as a whole (causal, for training), with the forward kernel launched as "
                         "a programmatic dependent (PDL) of the quantise launch or not")
    ap.add_argument("--iters", type=int, default=20, help="calls per graph replay")
    ap.add_argument("--repeats", type=int, default=15, help="replays; the median is reported")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    check_token_shapes(ap, args.shapes, "the quantise launch's tile")
    if min(args.lags) < 0 or args.iters < 1 or args.repeats < 1:
        ap.error("--lags must be >= 0, --iters and --repeats >= 1")
    if not has_cuda("benchmarks.prepass"):
        return 2
    rows = []
    print("| (B,H,N,D) | layout | contract | variant | ms | TB/s of the bytes it must move |")
    print("|---|---|---|---|---|---|")
    for shape in args.shapes:
        for layout in args.layouts:
            for quant in args.quant:
                for row in prepass_rows(shape, layout, quant, args.lags, args.iters, args.repeats, args.forward):
                    rows.append(row)
                    print(f"| {tuple(shape)} | {layout} | {quant} | {row['variant']} | {row['ms']:.4f} | "
                          f"{row['tb_per_s']:.2f} |", flush=True)
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
