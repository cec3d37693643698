"""The causal forward's and dQ's kernel times by the L2 budget of a section of heads, on one GPU.

    python -m benchmarks.sections [--budgets-mib 4 16 64 1024] [--shapes B,H,N,D ...] [--rounds 2] [--json PATH]

sagebwd/triton/schedule.py starts the forward's and dQ's programs longest tile first within sections of
heads whose streamed operands fit `L2_SECTION_BYTES`; this sets that budget for each row (a large budget:
one section over all heads, full LPT order; a small one: nearly the head-major order) and times every kernel
of a token-contract fwd+bwd (`benchmarks.attention.kernel_times`), budgets alternated over rounds.
"""
from __future__ import annotations

import argparse
import sys

from benchmarks.attention import _shape, kernel_times
from benchmarks.forward_tiles import check_token_shapes, has_cuda, write_rows

SHAPES = [(8, 16, 4096, 64), (4, 12, 4096, 64), (8, 8, 4096, 128)]
BUDGETS_MIB = [4, 16, 64, 1024]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets-mib", nargs="+", type=int, default=BUDGETS_MIB, metavar="MIB")
    ap.add_argument("--shapes", nargs="+", type=_shape, default=SHAPES, metavar="B,H,N,D")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    if any(b < 1 for b in args.budgets_mib):
        ap.error(f"--budgets-mib {args.budgets_mib}: each budget is a positive number of MiB")
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: at least 1")
    check_token_shapes(ap, args.shapes)
    if not has_cuda("benchmarks.sections"):
        return 2
    from sagebwd.triton import schedule
    rows = []
    print("| (B,H,N,D) | budget MiB | round | forward ms | dQ ms | dK/dV ms |")
    print("|---|---|---|---|---|---|")
    for r in range(args.rounds):
        budgets = args.budgets_mib if r % 2 == 0 else args.budgets_mib[::-1]
        for shape in args.shapes:
            for mib in budgets:
                schedule.L2_SECTION_BYTES = mib * 2**20
                ms = kernel_times(shape, True, iters=10, impl="sage-token")["ms"]
                pick = {key: next((t for name, t in ms.items() if name.startswith(f"_{key}")), float("nan"))
                        for key in ("forward", "dq", "dkdv")}
                rows.append({"shape": list(shape), "budget_mib": mib, "round": r, **pick})
                print(f"| {tuple(shape)} | {mib} | {r} | {pick['forward']:.3f} | {pick['dq']:.3f} | "
                      f"{pick['dkdv']:.3f} |", flush=True)
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
