"""The token forward kernel's time by kv tile (block_kv 64 or 128) and register cap, on one GPU.

    python -m benchmarks.forward_tiles [--shapes B,H,N,D ...] [--json PATH]

Times the forward kernel alone (torch.profiler, the inference path: no transposed copies) of
``sagebwd.triton.attention(..., quant="token")`` with block_kv 64 and 128, and at 128 with the
register caps that fit 4, 3 or 2 programs per SM (d=64: 128 and 168; d=128: 168 and 255), causal
and not. The cap is a ``launch.Tuning`` override of the forward's launch; "default" rows run the
kernel's own settings. Since the token contract's forward quantises per 128-key tile whatever
block_kv (validate.key_tile, 2026-11-27), its two block_kv rows build the same kernel; the
64-key rows of docs/kernel-notes.md ("The token forward over 128 keys") were measured on the tree
before that change (commit f5d734f), where block_kv 64 still meant 64-key tiles.
"""
from __future__ import annotations

import argparse
import json
import sys

from benchmarks.attention import _shape, profiled_ms

SHAPES = [(8, 16, 4096, 64), (4, 12, 4096, 64), (8, 8, 4096, 128)]
CAPS = {64: [128, 168], 128: [168, 255]}


def forward_ms(shape, causal: bool, block_kv: int, maxnreg: int | None, iters: int = 10) -> dict:
    """Milliseconds per call of the forward kernel and of the quantise launch."""
    import torch

    from sagebwd.triton.launch import Tuning
    q, k, v = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    tuning = Tuning(overrides={"forward": {"maxnreg": maxnreg}} if maxnreg else {})
    return token_forward_ms(q, k, v, causal, tuning, block_kv, iters)


def token_forward_ms(q, k, v, causal: bool, tuning=None, block_kv: int = 64, iters: int = 10) -> dict:
    """call_ms of the token op on q, k, v (K-smoothing, block_q 128) under a launch.Tuning: what the forward
    probes in docs/measurements time against main's forward."""
    from sagebwd.triton import attention

    def call():
        return attention(q, k, v, causal, True, False, 128, block_kv, "token", tuning=tuning)
    return call_ms(call, iters)


def probe_inputs(shape, sink: bool, device: str = "cuda"):
    """bf16 q, k, v (B, H, N, D) of seed 0, Gaussian; with `sink`, an attention sink: a shared direction c in every
    query and in key 0, so that S[i, 0] ~ |c|^2 / sqrt(D) = 16 while the other scores are ~N(0, 3) (their largest
    of 4096 near 6): every query's largest score is at key 0, as trained models have it, and an online softmax's
    running maximum never rises after the first tile."""
    import torch
    torch.manual_seed(0)
    q, k, v = [torch.randn(*shape, device=device) for _ in range(3)]
    if sink:
        c = torch.randn(shape[-1], device=device)
        c = c / c.norm() * (16 * shape[-1] ** 0.5) ** 0.5
        q = q + c
        k[:, :, 0] += c
    return [t.bfloat16() for t in (q, k, v)]


def call_ms(call, iters: int = 10) -> dict:
    """Milliseconds per call of the forward kernel and of the quantise launch that `call` (an op call, no
    arguments) launches, from torch.profiler, without autograd."""
    import torch
    with torch.no_grad():
        ms = profiled_ms(call, iters, warmup=3)
    return {"forward_ms": next(t for name, t in ms.items() if "_forward_kernel" in name),
            "quantize_ms": next((t for name, t in ms.items() if "quantize" in name), 0.0)}


def check_token_shapes(ap: argparse.ArgumentParser, shapes, tile: str = "the token forward's kv tile") -> None:
    """ap.error unless every --shapes entry has head dim 64 or 128 and a sequence a multiple of 128 (`tile`: the
    128-row tile of the launch the tool times, named in the message)."""
    for shape in shapes:
        if shape[-1] not in CAPS or shape[2] % 128:
            ap.error(f"--shapes {','.join(map(str, shape))}: head dim 64 or 128 and a sequence that is a "
                     f"multiple of 128 ({tile})")


def has_cuda(tool: str) -> bool:
    """Whether a CUDA GPU is there; if not, says so for `tool` on stderr."""
    import torch
    if not torch.cuda.is_available():
        print(f"error: {tool} times GPU kernels and needs a CUDA GPU", file=sys.stderr)
    return torch.cuda.is_available()


def write_rows(path: str | None, rows: list) -> None:
    """The rows and the GPU's name as JSON at `path` (nothing without one)."""
    import torch
    if path:
        with open(path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", type=_shape, default=SHAPES, metavar="B,H,N,D")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    check_token_shapes(ap, args.shapes)
    if not has_cuda("benchmarks.forward_tiles"):
        return 2
    rows = []
    print("| (B,H,N,D) | mask | block_kv | maxnreg | forward ms |")
    print("|---|---|---|---|---|")
    for shape in args.shapes:
        for causal in (True, False):
            for block_kv, cap in [(64, None), (128, None)] + [(128, c) for c in CAPS[shape[-1]]]:
                row = {"shape": list(shape), "causal": causal, "block_kv": block_kv, "maxnreg": cap,
                       **forward_ms(shape, causal, block_kv, cap)}
                rows.append(row)
                print(f"| {tuple(shape)} | {'causal' if causal else 'full'} | {block_kv} | {cap or 'default'} | "
                      f"{row['forward_ms']:.3f} |", flush=True)
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
