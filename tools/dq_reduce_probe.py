"""Does a fused backward's dQ reduction hide inside the dK/dV kernel? A GPU measurement (d=64, token contract).

    python -m tools.dq_reduce_probe [--shapes B,H,N,64 ...] [--groups G] [--json PATH]
    python -m tools.dq_reduce_probe --products-only [--shapes ...]   (causal; int32 adds and the dQ products only)
    python -m tools.dq_reduce_probe --sass        (no GPU: each variant's build, its main loop's instructions)

A backward that computes dQ inside the dK/dV program adds, after every q block, each warpgroup's dQ partial
(64 q rows x D) into a global dQ by TMA (``cp.reduce.async.bulk.tensor``). ``tools.dq_add_bench`` timed those adds
alone: as long as the dQ kernel they would replace. This runs the token contract's warp-specialised dK/dV kernel
(128 kv rows a program, two consumer warpgroups) with exactly that reduction added (``dkdv_hopper._dq_reduce_probe``:
the warpgroup's dK accumulator stands in for its dQ partial, staged in shared memory and added by a reducer warp,
``dkdv_ws_hopper._reducer``), in four ways: fp32 as the partials come (dQ's bits then depend on the order the
programs reach the adds); fp32 in a fixed order of programs per q block (a counter per q block and half: the warp
waits for its turn, adds, waits until the adds are written, and passes the turn on), which makes dQ deterministic;
ordered in G chains (``--groups``, programs pid = g mod G into copy g of dQ), each G times shorter, whose copies a
fixed-order sum combines afterwards; and int32 fixed point (each partial rounded to a power-of-two quantum,
cvt.rni), whose adds give the same bits in any order, as they come. Then the int32 way with what else a fused
kernel adds: each partial a real INT8 dQ product first (64 q rows x 128 keys x D from shared memory, waited on and
converted; its operands not written, so this times the product), and that with X^ made in every block too
(``dkdv_hopper._x_probe``: a column maximum by shuffles, INT8, a transposed byte store); and a bf16 dQ product of Y
(``dkdv_hopper._y16_probe``: dS^T, which dK's path holds in fp32, rounded to bf16 and stored transposed in every
block, no maximum; times K^T in bf16, unwritten; each consumer's stage is its half of Y's buffer once read, since
separate stages would not fit an H100 block's shared memory; tools.quant_study's variant y16 is its accuracy).

Columns: the dK/dV kernel as it is; with the reductions, unordered, ordered and in G ordered chains (each run zeroes
dQ and the counters, timed apart and taken off); the G copies' sum; with int32 fixed-point adds; whether two runs of
each deterministic kind give the same bits; with the dQ product and int32 adds, and with X^ made too; the adds
alone (dq_add_bench's TMA reduce of 128-row programs); hidden = 1 - (growth / adds alone); the token dQ kernel,
what a fused kernel would save. Before timing it checks that every variant leaves dK and dV bit-identical and that
the reductions sum to the same finite, nonzero buffer (the fixed-point one within its rounding).
"""
from __future__ import annotations

import argparse
import json
import math

import torch

SHAPES = ((8, 16, 4096, 64), (4, 12, 4096, 64))


def measure(b: int, h: int, n: int, d: int, causal: bool, groups: int = 4, products_only: bool = False) -> dict:
    """The row of one shape and mask (the module's docstring); products_only: only the int32 adds and the product
    variants, each checked to leave dK and dV bit-identical (what a short GPU call can afford)."""
    from sagebwd.triton import hopper
    from sagebwd.triton.launch import launch
    from tools.dq_add_bench import adds_launcher, token_backward_call

    c = token_backward_call(b, h, n, d, causal)

    def dkdv(mode_groups, fixed_scale=None, product=0):
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
        launches = hopper.dkdv_launches(c.q8, c.q, c.s_q, c.k8, c.s_k, c.v, c.do, c.do8t, c.s_do, c.lse2_p,
                                        c.delta, c.tile_scales, c.dk, c.dv, causal=causal, block_q=c.block_q,
                                        ws=True, token=True, dq_reduce=dq_reduce, dq_groups=g, dq_product=product)

        def run():
            if dq_reduce is not None:
                dq_sum.zero_()
                counters.zero_()
            for name, kernel, grid, args, kwargs in launches:
                launch(name, kernel, grid, *args, tuning=None, **kwargs)
        return run, dq_sum, counters

    modes = {} if products_only else {"unordered": 0, "ordered": 1, f"ordered_g{groups}": groups}
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
    if products_only:
        return _product_rows(b, h, n, d, causal, c, plain, ref, dkdv)
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
    runs.update(_checked_products(dkdv, c, ref, PRODUCTS))
    dq_kernel = _token_dq_kernel(c, causal)
    row = {"shape": [b, h, n, d], "causal": causal, "groups": groups, "dkdv": _bench(plain),
           "adds": _bench(adds_launcher(b, h, n, d, causal, 128)(2)), "dq": _bench(lambda: dq_kernel(c, None))}
    for name, (run, dq_sum, counters) in runs.items():   # unordered, ordered, chains, fixed
        zeroing = _bench(lambda: (dq_sum.zero_(), counters.zero_()))   # each run's own, taken off
        row[name] = _bench(run) - zeroing
        row[f"hidden_{name}"] = 1 - (row[name] - row["dkdv"]) / row["adds"]
        if name in sums:
            row[f"repeats_{name}"] = torch.equal(sums[name][0], sums[name][1])
    copies = runs[f"ordered_g{groups}"][1].view(groups, -1, d)
    row["combine"] = _bench(lambda: copies.sum(0))   # the copies' fixed-order sum (a fused backward's epilogue)
    return row


# the dQ product variants (name, hopper.dkdv_launches' dq_product): a real INT8 product per partial (its operands
# unwritten: timing only), then the int32 adds; that with X^ made; a bf16 product of Y made by every block
PRODUCTS = (("product", 1), ("product_x", 2), ("product_y16", 3))


def _checked_products(dkdv, c, ref, variants) -> dict:
    """{name: measure's dkdv(0, 1.0, product)} for each (name, product) of variants, each run once and checked to
    leave dK and dV bit-identical to ref."""
    runs = {}
    for name, product in variants:
        run, _, _ = runs[name] = dkdv(0, 1.0, product=product)
        run()
        torch.cuda.synchronize()
        if not (torch.equal(ref[0], c.dk) and torch.equal(ref[1], c.dv)):
            raise AssertionError(f"the dQ {name} changed dK or dV")
    return runs


def _token_dq_kernel(c, causal: bool):
    """The token dQ kernel this device runs for c (dq_add_bench.token_backward_call's operands)."""
    from sagebwd.triton import registry
    from sagebwd.triton.launch import arch_for
    b, h, n, d = c.q8.shape
    return registry.load(registry.resolve(arch_for(c.q8.device, None), d, "dq", "token", causal=causal,
                                          block_q=128, block_kv=64, smooth_q=False, seq=n))


def _bench(fn) -> float:
    import triton
    return triton.testing.do_bench(fn, return_mode="median")


def _product_rows(b, h, n, d, causal, c, plain, ref, dkdv) -> dict:
    """measure's products_only row: the dK/dV, with int32 adds (scale 1), with an INT8 dQ product, with X^ made,
    with a bf16 product of Y; the token dQ kernel."""
    runs = _checked_products(dkdv, c, ref, (("fixed", 0), *PRODUCTS))
    dq_kernel = _token_dq_kernel(c, causal)
    row = {"shape": [b, h, n, d], "causal": causal, "dkdv": _bench(plain), "dq": _bench(lambda: dq_kernel(c, None))}
    for name, (run, dq_sum, counters) in runs.items():
        zeroing = _bench(lambda: (dq_sum.zero_(), counters.zero_()))
        row[name] = _bench(run) - zeroing
    return row


SASS_OPS = ("FMNMX", "SHFL", "STS", "LDS", "BAR", "STL", "LDL", "I2FP", "F2I")


def sass_report(causal: bool = False) -> list[dict]:
    """Each variant of the probe's d=64 token dK/dV compiled for sm_90 (Triton's compiler, no GPU): registers at
    launch, spilled bytes, shared memory, and its main loop: SASS instructions per thread per q block, per score
    element, and the counts of SASS_OPS among them (tools.sass_mix)."""
    from sagebwd.triton import hopper
    from tools import offline, sass_mix
    b, h, n, d = 1, 2, 512, 64
    i8, f32 = (lambda *s: torch.zeros(*s, dtype=torch.int8)), (lambda *s: torch.zeros(*s))
    q8, k8, out = i8(b, h, n, d), i8(b, h, n, d), torch.zeros(b, h, n, d, dtype=torch.bfloat16)
    q16 = torch.zeros(b, h, n, d, dtype=torch.bfloat16)   # dK's operand, Q itself
    do8t, s_q = torch.zeros(b, h, d, n, dtype=torch.float8_e4m3fn), f32(b * h, n)
    fixed = (torch.zeros(b * h * n, d, dtype=torch.int32), None, 1.0)
    variants = {"dK/dV": ({}, None), "+ fp32 adds": ({}, (f32(b * h * n, d), None)),
                "+ int32 adds": ({}, fixed), "+ dQ product": ({"dq_product": 1}, fixed),
                "+ X^ made": ({"dq_product": 2}, fixed), "+ bf16 product of Y": ({"dq_product": 3}, fixed)}
    rows = []
    for name, (extra, dq_reduce) in variants.items():
        [(_, kernel, _, args, kwargs)] = hopper.dkdv_launches(
            q8, q16, s_q, k8, s_q, out, out, do8t, f32(b * h, n // 128), s_q, s_q, s_q, out, out, causal=causal,
            block_q=128, ws=True, token=True, dq_reduce=dq_reduce, **extra)
        compiled = offline.compile_recorded(kernel, args, kwargs)
        instructions, loops = sass_mix.instructions_and_loops(sass_mix.disassemble(compiled.asm["cubin"]))
        first, last = sass_mix.main_loop(loops)
        ops = [sass_mix.opcode(t).split(".")[0] for t in instructions[first:last + 1]]
        per_thread = len(ops)   # one q block of 128 rows x 64 kv rows per consumer warpgroup (128 threads)
        rows.append({"variant": name, **offline._resource_usage(compiled.asm["cubin"]),
                     "shared": compiled.metadata.shared, "loop": per_thread, "per_element": per_thread / 64,
                     **{op: ops.count(op) for op in SASS_OPS}})
    return rows


def print_sass_report(rows: list[dict]) -> None:
    print("| variant | registers | spilled B | shared B | loop instructions / thread / q block | per score element | "
          + " | ".join(SASS_OPS) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(SASS_OPS))
    for r in rows:
        print(f"| {r['variant']} | {r['regs']} | {r['spill_bytes']} | {r['shared']} | {r['loop']} | "
              f"{r['per_element']:.1f} | " + " | ".join(str(r[op]) for op in SASS_OPS) + " |")


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
    parser.add_argument("--products-only", action="store_true",
                        help="only the int32 adds and the dQ product variants (INT8, X^ made, bf16 Y), causal")
    parser.add_argument("--sass", action="store_true", help="no GPU: compile each variant for sm_90 and count its "
                        "main loop's instructions (the build without the causal mask)")
    args = parser.parse_args(argv)
    if args.sass:
        print_sass_report(sass_report())
        return 0
    if not torch.cuda.is_available():
        print("dq_reduce_probe needs a CUDA GPU (Hopper)")
        return 2
    rows = []
    if args.products_only:
        print("| (B,H,N,D) | mask | dK/dV ms | + int32 adds | + INT8 dQ product | + X^ made | + bf16 product of Y | "
              "token dQ kernel ms | dK/dV + dQ kernel |")
        print("|---|---|---|---|---|---|---|---|---|")
        for shape in args.shapes:
            r = measure(*shape, True, products_only=True)
            rows.append(r)
            print(f"| {tuple(shape)} | causal | {r['dkdv']:.3f} | {r['fixed']:.3f} | {r['product']:.3f} | "
                  f"{r['product_x']:.3f} | {r['product_y16']:.3f} | {r['dq']:.3f} | {r['dkdv'] + r['dq']:.3f} |",
                  flush=True)
    g = args.groups
    if not args.products_only:
        print(f"| (B,H,N,D) | mask | dK/dV ms | + adds, unordered | hidden | + adds, ordered | hidden | + adds, {g} "
              f"ordered chains | hidden | {g} copies' sum ms | + int32 adds, unordered | hidden | ordered and int32 "
              "repeat bits | "
              "+ dQ product and int32 adds | + X^ made | + bf16 product of Y | adds alone ms | token dQ kernel ms |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in [] if args.products_only else args.shapes:
        for causal in (True, False):
            r = measure(*shape, causal, g)
            rows.append(r)
            print(f"| {tuple(shape)} | {'causal' if causal else 'full'} | {r['dkdv']:.3f} | {r['unordered']:.3f} | "
                  f"{r['hidden_unordered']:.0%} | {r['ordered']:.3f} | {r['hidden_ordered']:.0%} | "
                  f"{r[f'ordered_g{g}']:.3f} | {r[f'hidden_ordered_g{g}']:.0%} | {r['combine']:.3f} | "
                  f"{r['fixed']:.3f} | {r['hidden_fixed']:.0%} | "
                  f"{r['repeats_ordered'] and r[f'repeats_ordered_g{g}'] and r['repeats_fixed']} | "
                  f"{r['product']:.3f} | {r['product_x']:.3f} | {r['product_y16']:.3f} | {r['adds']:.3f} | "
                  f"{r['dq']:.3f} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "device": torch.cuda.get_device_name(), "torch": torch.__version__}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
