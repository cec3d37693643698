"""Does a fused backward's dQ reduction hide inside the dK/dV kernel? A GPU measurement (d=64, token contract).

    python -m tools.dq_reduce_probe [--shapes B,H,N,64 ...] [--json PATH]

A backward that computes dQ inside the dK/dV program adds, after every q block, each warpgroup's fp32 dQ partial
(64 q rows x D) into a global fp32 dQ by TMA (``cp.reduce.async.bulk.tensor``). ``tools.dq_add_bench`` timed
those adds alone: as long as the dQ kernel they would replace. This runs the token contract's warp-specialised
dK/dV kernel (128 kv rows a program, two consumer warpgroups) with exactly that reduction added
(``dkdv_hopper._dq_reduce_probe``: the warpgroup's dK accumulator stands in for its dQ partial, stored to shared
memory, two stages per warpgroup, and reduced by a reducer warp, dkdv_ws_hopper._reducer) two ways: as the
partials come (dQ's bits then depend on the order the programs reach the adds), and in a fixed order of programs
per q block (a counter per q block and half: the warp waits for its turn, adds, waits until the adds are written,
and passes the turn on), which makes dQ deterministic; and ordered in G chains (`--groups`, programs pid = g mod G
into copy g of dQ), each G times shorter, whose copies a fixed-order sum combines afterwards; and as int32 fixed
point (each partial rounded to a power-of-two quantum, cvt.rni), whose adds give the same bits in any order, as
they come. It reports how much of the adds' own time the kernel's time
grew by. What the probe leaves out: the dQ product itself, X's quantisation, and the registers they need.

Columns: the dK/dV kernel as it is; with the reductions, unordered, ordered and in G ordered chains (each run zeroes
dQ and the counters, timed apart and taken off); the G copies' sum; with int32 fixed-point adds; whether two runs of
each deterministic kind give the same bits; the adds alone (dq_add_bench's TMA reduce
of 128-row programs); hidden = 1 - (growth / adds alone); the token dQ kernel, what a fused kernel would save.
Before timing it checks that the reductions leave dK and dV bit-identical and sum to the same finite, nonzero
buffer.
"""
from __future__ import annotations

import argparse
import json
import math

import torch

SHAPES = ((8, 16, 4096, 64), (4, 12, 4096, 64))


def measure(b: int, h: int, n: int, d: int, causal: bool, groups: int = 4) -> dict:
    import triton

    from sagebwd.triton import hopper, registry
    from sagebwd.triton.launch import arch_for, launch
    from tools.dq_add_bench import adds_launcher, token_backward_call

    c = token_backward_call(b, h, n, d, causal)

    def dkdv(mode_groups, fixed_scale=None):
        """(a launcher of the dK/dV with the reductions (None: none; 0: unordered; G: ordered in G chains; with
        fixed_scale, unordered int32 fixed point), its dQ buffer, its counters)."""
        g = max(mode_groups or 1, 1)
        dtype = torch.float32 if fixed_scale is None else torch.int32
        dq_sum = torch.zeros(g * b * h * n, d, device="cuda", dtype=dtype)
        counters = torch.zeros(g * b * h, n // 128, 2, device="cuda", dtype=torch.int32)
        if fixed_scale is not None:
            dq_reduce = (dq_sum, None, fixed_scale)
        else:
            dq_reduce = None if mode_groups is None else (dq_sum, None if mode_groups == 0 else counters)
        launches = hopper.dkdv_launches(c.q8, c.q8t, c.s_q, c.k8, c.s_k, c.v, c.do, c.do8t, c.s_do, c.lse2_p,
                                        c.delta_sq, c.tile_scales, c.dk, c.dv, causal=causal, block_q=c.block_q,
                                        ws=True, token=True, dq_reduce=dq_reduce, dq_groups=g)

        def run():
            if dq_reduce is not None:
                dq_sum.zero_()
                counters.zero_()
            for name, kernel, grid, args, kwargs in launches:
                launch(name, kernel, grid, *args, tuning=None, **kwargs)
        return run, dq_sum, counters

    modes = {"unordered": 0, "ordered": 1, f"ordered_g{groups}": groups}
    plain = dkdv(None)[0]
    plain()
    ref = (c.dk.clone(), c.dv.clone())
    runs, sums = {}, {}
    for name, mode in modes.items():
        run, dq_sum, counters = runs[name] = dkdv(mode)
        outs = []
        for _ in range(2):
            run()
            torch.cuda.synchronize()
            if not (torch.equal(ref[0], c.dk) and torch.equal(ref[1], c.dv)):
                raise AssertionError(f"the dQ reduction ({name}) changed dK or dV")
            outs.append(dq_sum.view(-1, b * h * n, d).sum(0))
        sums[name] = outs
    first = sums["unordered"][0]
    if not (torch.isfinite(first).all() and first.abs().sum() > 0):
        raise AssertionError("the dQ reduction wrote nothing (or non-finite values)")
    for name in modes:
        if not torch.allclose(sums[name][0], first, rtol=1e-4, atol=1e-3 * first.abs().max().item()):
            raise AssertionError(f"the {name} reduction's sum differs from the unordered one beyond rounding")
    # int32 fixed point: a power-of-two quantum that keeps the sums 4x under 2**31 (the largest sum is the last
    # partial's, dK's accumulator growing block by block), every add rounded to it
    top = first.abs().max().item()
    scale = 2.0 ** math.floor(math.log2(2 ** 29 / top))
    run, fixed_sum, _ = runs["fixed"] = dkdv(0, scale)
    fixed = []
    for _ in range(2):
        run()
        torch.cuda.synchronize()
        fixed.append(fixed_sum.clone())
    if not torch.allclose(fixed[0].double() / scale, first.double(), rtol=0, atol=n / 128 / scale + 1e-5 * top):
        raise AssertionError("the fixed-point sum differs from the fp32 one by more than its rounding")
    sums["fixed"] = fixed
    dq_kernel = registry.load(registry.resolve(arch_for(c.q8.device, None), d, "dq", "token", causal=causal,
                                               block_q=128, block_kv=64, smooth_q=False, seq=n))

    def bench(fn):
        return triton.testing.do_bench(fn, return_mode="median")
    row = {"shape": [b, h, n, d], "causal": causal, "groups": groups, "dkdv": bench(plain),
           "adds": bench(adds_launcher(b, h, n, d, causal, 128)(2)), "dq": bench(lambda: dq_kernel(c, None))}
    for name, (run, dq_sum, counters) in runs.items():   # unordered, ordered, chains, fixed
        zeroing = bench(lambda: (dq_sum.zero_(), counters.zero_()))   # each run's own, taken off
        row[name] = bench(run) - zeroing
        row[f"hidden_{name}"] = 1 - (row[name] - row["dkdv"]) / row["adds"]
        row[f"repeats_{name}"] = torch.equal(sums[name][0], sums[name][1])
    copies = runs[f"ordered_g{groups}"][1].view(groups, -1, d)
    row["combine"] = bench(lambda: copies.sum(0))   # the copies' fixed-order sum (a fused backward's epilogue)
    return row


def _shape(text: str) -> tuple:
    try:
        b, h, n, d = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a shape as B,H,N,D, e.g. 8,16,4096,64") from None
    if n % 128 or d != 64:
        raise argparse.ArgumentTypeError(f"{text!r}: N must be a multiple of 128 and D 64 (the probe sits in the "
                                         "d=64 dK/dV pass; at d=128 its stages do not fit beside the ring)")
    return b, h, n, d


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.dq_reduce_probe", description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=_shape, nargs="+", default=list(SHAPES), metavar="B,H,N,D")
    parser.add_argument("--groups", type=int, default=4, choices=(2, 4, 8),
                        help="ordered chains of the third variant, each into its own copy of dQ (default 4)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("dq_reduce_probe needs a CUDA GPU (Hopper)")
        return 2
    rows = []
    g = args.groups
    print(f"| (B,H,N,D) | mask | dK/dV ms | + adds, unordered | hidden | + adds, ordered | hidden | + adds, {g} "
          f"ordered chains | hidden | {g} copies' sum ms | + int32 adds, unordered | hidden | ordered and int32 "
          "repeat bits | "
          "adds alone ms | token dQ kernel ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        for causal in (True, False):
            r = measure(*shape, causal, g)
            rows.append(r)
            print(f"| {tuple(shape)} | {'causal' if causal else 'full'} | {r['dkdv']:.3f} | {r['unordered']:.3f} | "
                  f"{r['hidden_unordered']:.0%} | {r['ordered']:.3f} | {r['hidden_ordered']:.0%} | "
                  f"{r[f'ordered_g{g}']:.3f} | {r[f'hidden_ordered_g{g}']:.0%} | {r['combine']:.3f} | "
                  f"{r['fixed']:.3f} | {r['hidden_fixed']:.0%} | "
                  f"{r['repeats_ordered'] and r[f'repeats_ordered_g{g}'] and r['repeats_fixed']} | {r['adds']:.3f} | "
                  f"{r['dq']:.3f} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "device": torch.cuda.get_device_name(), "torch": torch.__version__}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
