"""Trace the error of every SageBwd intermediate against full-precision attention.

    python -m sagebwd.trace sigma --seq 1024 --head-dim 64 [--sigmas 1 3 5 8 10] [--causal] [--quant token] [--json PATH]
    python -m sagebwd.trace tensors --input qkvdo.pt [--causal] [--quant token] [--json PATH]

``sigma`` reproduces the paper's sigma_Q,K table (Gaussian Q, K with std sigma; V and dO with
std 1); ``tensors`` traces captured q, k, v, do (a dict saved with torch.save, each
(batch, heads, seq, head_dim)), like the paper's layer-11 analysis.

Compared tensors (SageBwd side as its matmuls consume them): delta = rowsum(dO*O), P (the
backward's INT8 P, dequantised), dP = dO V^T, dS (INT8 as dQ consumes it, dequantised), O, dQ,
dK, dV. dO is the same for both sides, so dP differs only through nothing: it is the control.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

import torch

from .fpa import fpa_attention
from .simulate import SageConfig, backward, forward
from .validate import QUANT_CONTRACTS, check_blocks, check_seq_len, SUPPORTED_HEAD_DIMS, SageBwdInputError

TENSORS = ("delta", "p", "dp", "ds", "o", "dq", "dk", "dv")
LABELS = {"delta": "delta", "p": "P", "dp": "dP", "ds": "dS", "o": "O", "dq": "dQ", "dk": "dK", "dv": "dV"}


@dataclass(frozen=True)
class ErrorStats:
    cos_sim: float
    rel_l2: float


def error_stats(approx: torch.Tensor, ref: torch.Tensor) -> ErrorStats:
    a, r = approx.double().flatten(), ref.double().flatten()
    finite = torch.isfinite(r)   # masked score entries are -inf/0 on both sides alike
    a, r = a[finite], r[finite]
    cos = torch.nn.functional.cosine_similarity(a, r, dim=0).item()
    rel = ((a - r).norm() / r.norm().clamp_min(torch.finfo(torch.float64).tiny)).item()
    return ErrorStats(cos, rel)


def trace_errors(q, k, v, do, cfg: SageConfig) -> dict[str, ErrorStats]:
    """Error of each SageBwd intermediate vs FPA for the given inputs (any float dtype)."""
    ref = fpa_attention(q, k, v, do, causal=cfg.causal)
    o, saved = forward(q, k, v, cfg)
    (dq, dk, dv), inter = backward(saved, do, cfg, return_intermediates=True)
    sage = {"delta": inter.delta, "p": inter.p, "dp": inter.dp, "ds": inter.ds, "o": o, "dq": dq, "dk": dk,
            "dv": dv}
    return {name: error_stats(sage[name], getattr(ref, name)) for name in TENSORS}


def gaussian_inputs(sigma: float, batch: int, heads: int, seq: int, head_dim: int, seed: int,
                    dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    shape = (batch, heads, seq, head_dim)
    q = torch.randn(shape, generator=g) * sigma
    k = torch.randn(shape, generator=g) * sigma
    v = torch.randn(shape, generator=g)
    do = torch.randn(shape, generator=g)
    return tuple(t.to(dtype) for t in (q, k, v, do))


def sigma_sweep(sigmas, *, seq: int, head_dim: int, batch: int = 1, heads: int = 2, seed: int = 0,
                cfg: SageConfig = SageConfig()) -> dict[float, dict[str, ErrorStats]]:
    return {s: trace_errors(*gaussian_inputs(s, batch, heads, seq, head_dim, seed), cfg) for s in sigmas}


def format_sigma_table(rows: dict[float, dict[str, ErrorStats]], columns=("o", "dq", "dk", "dv", "ds")) -> str:
    head = "| sigma_QK | " + " | ".join(f"{LABELS[c]} cos | {LABELS[c]} rel-L2" for c in columns) + " |"
    sep = "|" + "---|" * (1 + 2 * len(columns))
    lines = [head, sep]
    for sigma, stats in rows.items():
        cells = " | ".join(f"{stats[c].cos_sim:.4f} | {stats[c].rel_l2:.4f}" for c in columns)
        lines.append(f"| {sigma:g} | {cells} |")
    return "\n".join(lines)


def format_intermediates(stats: dict[str, ErrorStats]) -> str:
    names = " | ".join(LABELS[t] for t in TENSORS)
    return "\n".join([
        f"| metric | {names} |",
        "|" + "---|" * (1 + len(TENSORS)),
        "| CosSim | " + " | ".join(f"{stats[t].cos_sim:.4f}" for t in TENSORS) + " |",
        "| Rel-L2 | " + " | ".join(f"{stats[t].rel_l2:.4f}" for t in TENSORS) + " |",
    ])


def _config_from_args(args, seq: int) -> SageConfig:
    check_blocks(args.block_q, args.block_kv)
    check_seq_len(seq, args.block_q, args.block_kv, args.quant)
    return SageConfig(causal=args.causal, smooth_k=not args.no_smooth_k, smooth_q=args.smooth_q,
                      block_q=args.block_q, block_kv=args.block_kv, quant=args.quant)


def _write_json(path, payload) -> None:
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
    print(f"wrote {path}")


def _run_sigma(args) -> None:
    if args.head_dim not in SUPPORTED_HEAD_DIMS:
        raise SageBwdInputError(f"--head-dim {args.head_dim} is not supported; use one of {SUPPORTED_HEAD_DIMS}")
    cfg = _config_from_args(args, args.seq)
    rows = sigma_sweep(args.sigmas, seq=args.seq, head_dim=args.head_dim, batch=args.batch, heads=args.heads,
                       seed=args.seed, cfg=cfg)
    print(f"SageBwd (simulated INT8) vs FPA, Gaussian Q,K with std sigma, V,dO std 1; "
          f"B={args.batch} H={args.heads} N={args.seq} D={args.head_dim} causal={args.causal} "
          f"smooth_k={cfg.smooth_k} smooth_q={cfg.smooth_q} blocks={cfg.block_q}x{cfg.block_kv} quant={cfg.quant} "
          f"seed={args.seed}")
    print(format_sigma_table(rows))
    if args.json:
        _write_json(args.json, {"config": asdict(cfg), "seq": args.seq, "head_dim": args.head_dim,
                                "rows": {str(s): {k: asdict(v) for k, v in st.items()} for s, st in rows.items()}})


def _run_tensors(args) -> None:
    try:
        data = torch.load(args.input, map_location="cpu")
    except FileNotFoundError:
        raise SageBwdInputError(f"--input {args.input}: no such file") from None
    missing = [k for k in ("q", "k", "v", "do") if k not in data]
    if missing:
        raise SageBwdInputError(f"--input {args.input} lacks {missing}; save a dict with q, k, v, do")
    q, k, v, do = (data[n].float() for n in ("q", "k", "v", "do"))
    cfg = _config_from_args(args, q.shape[-2])
    stats = trace_errors(q, k, v, do, cfg)
    print(format_intermediates(stats))
    if args.json:
        _write_json(args.json, {"config": asdict(cfg), "stats": {k: asdict(v) for k, v in stats.items()}})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sagebwd.trace", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p):
        p.add_argument("--causal", action="store_true")
        p.add_argument("--smooth-q", action="store_true", help="also smooth Q (with the dK bias branch)")
        p.add_argument("--no-smooth-k", action="store_true", help="switch K-smoothing off")
        p.add_argument("--block-q", type=int, default=128)
        p.add_argument("--block-kv", type=int, default=64)
        p.add_argument("--quant", choices=QUANT_CONTRACTS, default="block",
                       help="quantisation contract: 'block' (the paper's) or 'token' (per-token scales)")
        p.add_argument("--json", help="also write the numbers to this JSON file")

    s = sub.add_parser("sigma", help="the paper's sigma_Q,K table on Gaussian inputs")
    s.add_argument("--seq", type=int, required=True)
    s.add_argument("--head-dim", type=int, required=True)
    s.add_argument("--sigmas", type=float, nargs="+", default=[1, 3, 5, 8, 10])
    s.add_argument("--batch", type=int, default=1)
    s.add_argument("--heads", type=int, default=2)
    s.add_argument("--seed", type=int, default=0)
    common(s)
    s.set_defaults(run=_run_sigma)

    t = sub.add_parser("tensors", help="trace captured q, k, v, do (a torch.save'd dict)")
    t.add_argument("--input", required=True)
    common(t)
    t.set_defaults(run=_run_tensors)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except SageBwdInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
